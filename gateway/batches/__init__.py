"""Batch jobs in the shape of OpenAI's Batch API, run inside the gateway (most engines
have no `/v1/batches`): files (`files.py`, bytes in `blobs.py`), jobs (`jobs.py`), their
records (`models.py`, `store.py`), the runner that sends each line through the request
path (`runner.py`, `execution.py`, `identity.py`), the end of a job (`finalize.py`), and
the HTTP routes (`routes.py`). docs/batch-jobs.md "Batch jobs" tells how a job moves through
them.
"""
