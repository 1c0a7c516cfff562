"""Benchmark scripts (run each as `python bench/<name>.py`); results go to docs/benchmarks.md."""
