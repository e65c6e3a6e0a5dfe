"""Benchmarks: each writes its table and JSON under ``reports/benchmarks/`` with the command that produced it."""
