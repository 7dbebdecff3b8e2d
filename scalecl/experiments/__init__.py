"""The experiments: the biography benchmark and continual pre-training, their configs, sweeps and studies."""
