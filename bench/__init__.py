"""Benchmarks: each prints JSON lines {"bench", "metric", "value", "unit", ...parameters}."""
