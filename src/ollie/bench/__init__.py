"""Benchmark harnesses: search ablations, operator level, end to end."""
