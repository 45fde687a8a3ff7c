"""Weight staging from the gateway's settings: the stager, and `gateway stage MODEL`."""

from __future__ import annotations

import sys

from gateway.settings import Backend, Settings
from warmpool.errors import StagingError
from warmpool.staging import WeightStager

GB = 1_000_000_000


def build_stager(settings: Settings) -> WeightStager:
    from warmpool.s3 import S3WeightSource

    staging = settings.staging
    factory = S3WeightSource.factory(
        endpoint_url=staging.s3.endpoint_url,
        region=staging.s3.region,
        access_key_id=staging.s3.access_key_id,
        secret_access_key=staging.s3.secret_access_key,
    )
    return WeightStager(
        staging.cache_dir,
        factory,
        int(staging.disk_budget_gb * GB),
        chunk_bytes=staging.chunk_mb * 1024 * 1024,
        parallelism=staging.parallelism,
        readahead=staging.readahead,
    )


def backend_for_weights(settings: Settings, model: str) -> Backend | None:
    for backend in settings.backends:
        if backend.weights is not None and (model in backend.models or model == backend.name):
            return backend
    return None


async def stage_by_hand(settings: Settings, model: str) -> int:
    from warmpool.progress import stage_with_progress

    backend = backend_for_weights(settings, model)
    if backend is None or backend.weights is None:
        print(f"gateway: no backend declares weights for model {model!r}", file=sys.stderr)
        return 2
    try:
        async with build_stager(settings) as stager:
            if backend.weights.staged == "always":
                stager.pin(backend.name)
            staged = await stage_with_progress(stager, backend.name, backend.weights.uri)
    except StagingError as exc:
        print(f"gateway: staging {model} failed: {exc}", file=sys.stderr)
        return 1
    print(staged.path)
    return 0
