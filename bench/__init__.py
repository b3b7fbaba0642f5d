"""Benchmarks of Symphony against vLLM (see bench/README.md and /work/shared/BENCHMARKS.md)."""
