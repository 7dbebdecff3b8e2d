"""What every other folder stands on: one-line errors, typed schemas, atomic and owned files, locks, readers, the hub."""
