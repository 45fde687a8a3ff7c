"""Cold-start manager (weight staging, warm pool, scale to zero). Filled in by its issue."""
