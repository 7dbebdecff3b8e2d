"""Where a run executes: the device and CPU threads, step speed (TF32, compile, MFU), DDP/FSDP2, launcher ranks."""
