"""One real deployment for the whole fault suite: two gateway replicas on a private Redis,
a healthy and a misbehaving upstream (see bench/chaos_deployment.py). Every case
leaves it as it found it: upstreams and Redis restarted, extra replicas gone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.chaos_deployment import Deployment, deployment


@pytest.fixture(scope="session")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deployment(tmp_path_factory.mktemp("chaos")) as made:
        yield made


@pytest.fixture
def live(chaos: Deployment) -> Iterator[Deployment]:
    """The deployment, checked after the case: no replica crashed under the fault."""
    yield chaos
    for gateway in chaos.replicas:
        assert gateway.server.process is not None
        assert gateway.server.process.poll() is None, f"a replica died:\n{gateway.server.log()}"
