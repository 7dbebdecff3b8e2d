"""The version of scalecl (the package and its provenance records)."""

__version__ = "0.1.0"
