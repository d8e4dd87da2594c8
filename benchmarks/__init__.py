"""cuquant's benchmark (`python -m benchmarks`); see __main__.py."""
