"""Backend providers: static HTTP upstreams, local processes, and the bundled model worker."""
