"""Benchmarks, grouped by what they measure; run them as modules from the repository root
(`python -m bench.engine.engine_ab ...`). See README.md."""
