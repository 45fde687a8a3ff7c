"""The Files API's limits, which no tenant can exceed (issue 37, item 4): its file count
and storage, its uploads at once, a deadline on a whole upload (a trickle cannot hold one
open), and expiry. Each refusal is OpenAI's error JSON with its status. A real gateway
process over loopback; the slow upload is a raw socket that sends a byte at a time."""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.processes import Gateway
from tests.conftest import GatewayFactory, fake_backend, hash_of

KEY = "sk-test-files-limits-0123456789abcdef"
OTHER_KEY = "sk-test-files-limits-other-0123456789"
LINE = (
    b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
    b'"body": {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}}\n'
)
LIMITS = {
    "max_files_per_tenant": 3,
    "max_storage_bytes_per_tenant": 4096,
    "max_concurrent_uploads": 1,
    "upload_timeout_s": 2,
}


@pytest.fixture
def gateway(gateway_factory: GatewayFactory, fake_upstream: str, tmp_path: Path) -> Gateway:
    tenants = [
        {"name": "acme", "keys": [{"sha256": hash_of(KEY)}]},
        {"name": "other", "keys": [{"sha256": hash_of(OTHER_KEY)}]},
    ]
    return gateway_factory(
        {
            "state": {"url": "memory", "path": str(tmp_path / "state.json")},
            "backends": [fake_backend(fake_upstream)],
            "cache": {"enabled": False},
            "tenants": tenants,
            # A body may pause 5 s between chunks: only the whole upload's deadline is short.
            "limits": {"body_timeout_s": 5},
            "batches": LIMITS,
        }
    )


@pytest.fixture
def client(gateway: Gateway) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=10) as c:
        yield c


def upload(client: httpx.Client, data: bytes = LINE, **fields: Any) -> httpx.Response:
    files = {"file": ("in.jsonl", io.BytesIO(data))}
    return client.post("/files", files=files, data={"purpose": "batch", **fields})


def error(response: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["code"] == code
    return body


def test_a_tenant_keeps_no_more_files_than_its_count(
    client: httpx.Client, gateway: Gateway
) -> None:
    for _ in range(3):
        assert upload(client).status_code == 200
    error(upload(client), 400, "file_limit_exceeded")
    other = {"Authorization": f"Bearer {OTHER_KEY}"}
    files = {"file": ("in.jsonl", io.BytesIO(LINE))}
    answer = httpx.post(
        gateway.base_url + "/files", headers=other, files=files, data={"purpose": "batch"}
    )
    assert answer.status_code == 200  # another tenant's room is its own
    assert client.delete(f"/files/{client.get('/files').json()['data'][0]['id']}").is_success
    assert upload(client).status_code == 200


def test_a_tenant_keeps_no_more_bytes_than_its_storage(client: httpx.Client) -> None:
    big = b"".join(LINE.replace(b'"a"', f'"{i}"'.encode()) for i in range(20))  # ~2.7 KB
    assert upload(client, big).status_code == 200
    error(upload(client, big), 413, "storage_limit_exceeded")


def test_files_expire_as_asked_and_by_default(client: httpx.Client) -> None:
    default = upload(client).json()
    assert default["expires_at"] == default["created_at"] + 30 * 86400
    asked = upload(
        client, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
    ).json()
    assert asked["expires_at"] == asked["created_at"] + 3600
    wrong = upload(client, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "5"})
    assert error(wrong, 400, None)["param"] == "expires_after.seconds"


def slow_upload(gateway: Gateway, stop: threading.Event) -> socket.socket:
    """An upload that sends its body a byte every 0.5 s (within the per-chunk timeout)."""
    body = b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    head = (
        f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.sendall(head)

    def trickle() -> None:
        for byte in body * 100:
            if stop.is_set():
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return
            time.sleep(0.5)

    threading.Thread(target=trickle, daemon=True).start()
    return sock


def test_a_trickled_upload_ends_at_its_deadline_and_holds_one_slot(
    client: httpx.Client, gateway: Gateway
) -> None:
    stop = threading.Event()
    sock = slow_upload(gateway, stop)
    try:
        time.sleep(0.5)
        # The tenant's one upload at once is taken: another is refused now, not queued.
        error(upload(client), 429, "too_many_uploads")
        sock.settimeout(10)
        started = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert time.monotonic() - started < 4  # the 2 s deadline, not 5 s per chunk
    finally:
        stop.set()
        sock.close()
    assert upload(client).status_code == 200  # the slot is free again
