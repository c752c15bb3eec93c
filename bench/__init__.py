"""Benchmarks for inflight: run `python -m bench` for the whole report."""
