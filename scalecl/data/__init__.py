"""Data: the biography generator and QA, corpus streaming and packing."""
