"""Base models: build from a config or load (hub id, local folder, GGUF), per-family facts, parameter accounting."""
