"""Benchmarks of Symphony against vLLM (see bench/README.md)."""
