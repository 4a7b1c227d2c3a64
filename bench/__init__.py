"""Benchmarks (one command each); see docs/benchmarks.md."""
