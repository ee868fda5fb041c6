"""Benchmarks: `python -m stoa_harness.bench` (see __main__)."""
