"""Training one run: the one loop, its files (checkpoints, logs, resume), state on disk, optimizer, trackers, the
progress display."""
