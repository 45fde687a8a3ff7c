"""OpenAI-compatible inference gateway: routes, config, auth, relay, CLI."""
