"""The bundled model worker: an OpenAI-compatible server for local torch models.

Run it with `python -m backends.worker --help`. transformers and sentence-transformers
are imported only where models load.
"""
