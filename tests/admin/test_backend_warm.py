"""Pre-warming through the admin API and the CLI: a real gateway whose `process` backend (the
fake upstream, started on demand) gets replicas before any request asks for them; answers
checked against the gateway's own /openapi.json."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from bench.fake_upstream import on_demand_backend
from bench.processes import Gateway, start_gateway
from tests.admin.test_admin_api import ADMIN_KEY, admin_client, bearer, error_of
from tests.conftest import fake_backend, hash_of
from tests.warmpool.test_scale_to_zero_e2e import metric

READY = 'gateway_backend_ready_replicas{backend="on-demand"}'


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, fake_upstream: str) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("warm")
    # Long idle times: nothing is stopped while the test looks.
    scaling = {"max_replicas": 2, "idle_s": 600, "last_replica_idle_s": 600}
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "cache": {"enabled": False},
        "admin": {"keys": [{"sha256": hash_of(ADMIN_KEY)}]},
        "backends": [
            on_demand_backend(["echo"], scaling),
            fake_backend(fake_upstream, models=["static-model"]),
        ],
        "tenants": [],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


def ready_replicas(gw: Gateway, count: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while metric(gw, READY) != count:
        assert time.monotonic() < deadline, f"{count} ready replicas not seen"
        time.sleep(0.1)


def test_warm_starts_a_replica_of_a_process_backend_before_any_request(gateway: Gateway) -> None:
    assert metric(gateway, READY) == 0
    with admin_client(gateway) as admin:
        answer = admin.post("/admin/backends/on-demand/warm")  # no body: one, for idle_s
        assert answer.status_code == 202, answer.text
        body = answer.json()
        assert body["object"] == "backend.warm" and body["backend"] == "on-demand"
        assert (body["replicas"], body["hold_s"], body["target"]) == (1, 600, 1)
        assert body["reason"] == "floor 1: scale up 0 -> 1"
        assert abs(body["until"] - (time.time() + 600)) < 30
        ready_replicas(gateway, 1)
        views = {v["backend"]: v for v in admin.get("/admin/backends").json()["data"]}
        assert "on-demand" in views


def test_warm_refuses_what_it_cannot_do(gateway: Gateway) -> None:
    with admin_client(gateway) as admin:
        unknown = admin.post("/admin/backends/nowhere/warm", json={})
        assert unknown.status_code == 404
        assert error_of(unknown)["code"] == "backend_not_found"
        static = admin.post("/admin/backends/fake/warm", json={"replicas": 1})
        assert static.status_code == 400
        assert error_of(static)["code"] == "backend_not_scalable"
        too_many = admin.post("/admin/backends/on-demand/warm", json={"replicas": 3})
        assert too_many.status_code == 400
        assert error_of(too_many)["param"] == "replicas"
        bad = admin.post("/admin/backends/on-demand/warm", json={"hold_s": "60"})
        assert bad.status_code == 400 and error_of(bad)["param"] == "hold_s"
    # A tenant's key, or none, may not warm anything.
    refused = httpx.post(gateway.url + "/admin/backends/on-demand/warm", headers=bearer("sk-x"))
    assert refused.status_code == 401


def test_cli_warms_through_the_admin_api(gateway: Gateway) -> None:
    env = {"GATEWAY_ADMIN_KEY": ADMIN_KEY}
    args = ("warm", "on-demand", "--replicas", "2", "--hold", "120", "--url", gateway.url)
    result = gateway.cli(*args, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("on-demand: at least 2 ready until ")
    ready_replicas(gateway, 2)

    unknown = gateway.cli("warm", "nowhere", "--url", gateway.url, env=env)
    assert unknown.returncode == 1
    assert "404: No backend named 'nowhere'." in unknown.stderr
    keyless = gateway.cli("warm", "on-demand", "--url", gateway.url, env={"GATEWAY_ADMIN_KEY": ""})
    assert keyless.returncode == 2 and "GATEWAY_ADMIN_KEY" in keyless.stderr
