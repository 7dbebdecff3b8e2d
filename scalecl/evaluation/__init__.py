"""Measurements of a model: first-token QA accuracy, perplexity and forgetting, lm-evaluation-harness benchmarks."""
