"""Semantic cache (embedder, vector index, entry store, policy). Filled in by the cache issue."""
