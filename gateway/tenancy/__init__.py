"""Who may ask for what: API keys, tenants, quotas, and the state stores they live in."""
