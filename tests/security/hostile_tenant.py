"""A hostile tenant, as its own process (tests/security/test_soak.py): for `--seconds`, a
few concurrent workers hammer every endpoint of a gateway with malformed and oversized
input, and the statuses it got are printed as one JSON line at the end.

What it sends: bad JSON, JSON nested too deep, huge and made-up model names, wrong types,
random keys and no key, request lines and headers over the header limit (raw sockets),
bodies over the body limit, bad file uploads (not JSONL, over the size limit, the wrong
purpose), batches of files that do not exist, the admin API and /metrics with a tenant key,
unknown routes and methods.

Run: python -m tests.security.hostile_tenant --url http://127.0.0.1:PORT --key KEY
[--seconds S] [--workers N]. It prints `started` once its workers run.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httpx
import orjson

Attack = Callable[[httpx.AsyncClient, str], Awaitable[int]]

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def _post(client: httpx.AsyncClient, path: str, content: bytes) -> int:
    headers = {"content-type": "application/json"}
    return (await client.post(path, content=content, headers=headers)).status_code


async def bad_json(client: httpx.AsyncClient, key: str) -> int:
    return await _post(client, "/v1/chat/completions", b'{"model":"echo","messages":[{"ro')


async def deep_json(client: httpx.AsyncClient, key: str) -> int:
    nested = b'{"a":' * 5000 + b"1" + b"}" * 5000
    return await _post(
        client, "/v1/chat/completions", orjson.dumps(CHAT)[:-1] + b',"metadata":' + nested + b"}"
    )


async def deep_array(client: httpx.AsyncClient, key: str) -> int:
    return await _post(client, "/v1/completions", b'{"model":"echo","prompt":' + b"[" * 900)


async def huge_model(client: httpx.AsyncClient, key: str) -> int:
    model = secrets.token_hex(32 * 1024)  # 64 KiB, a new one each time
    return await _post(client, "/v1/chat/completions", orjson.dumps({**CHAT, "model": model}))


async def made_up_model(client: httpx.AsyncClient, key: str) -> int:
    body = {"model": "m-" + secrets.token_hex(8), "input": "x"}
    return await _post(client, "/v1/embeddings", orjson.dumps(body))


async def wrong_types(client: httpx.AsyncClient, key: str) -> int:
    body = {"model": ["echo"], "messages": "hi", "max_tokens": "many", "n": -3}
    return await _post(client, "/v1/chat/completions", orjson.dumps(body))


async def random_key(client: httpx.AsyncClient, key: str) -> int:
    headers = {"authorization": f"Bearer sk-{secrets.token_urlsafe(24)}"}
    return (await client.post("/v1/chat/completions", json=CHAT, headers=headers)).status_code


async def no_key(client: httpx.AsyncClient, key: str) -> int:
    return (await client.get("/v1/models", headers={"authorization": ""})).status_code


async def oversized_body(client: httpx.AsyncClient, key: str) -> int:
    content = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 4_500_000}]})
    return await _post(client, "/v1/chat/completions", content)


async def upload(client: httpx.AsyncClient, content: bytes, purpose: str) -> int:
    answer = await client.post(
        "/v1/files",
        data={"purpose": purpose},
        files={"file": ("in.jsonl", content, "application/jsonl")},
    )
    return answer.status_code


async def not_jsonl(client: httpx.AsyncClient, key: str) -> int:
    return await upload(client, secrets.token_bytes(4096), "batch")


async def upload_too_large(client: httpx.AsyncClient, key: str) -> int:
    line = orjson.dumps({"custom_id": "1", "method": "POST", "url": "/v1/chat/completions"})
    return await upload(client, (line + b"\n") * 2000, "batch")


async def wrong_purpose(client: httpx.AsyncClient, key: str) -> int:
    return await upload(client, b'{"custom_id":"1"}\n', "fine-tune")


async def no_file(client: httpx.AsyncClient, key: str) -> int:
    return (await client.post("/v1/files", content=b"--x\r\n\r\n", headers={})).status_code


async def missing_batch(client: httpx.AsyncClient, key: str) -> int:
    body = {"input_file_id": "file-" + secrets.token_hex(12), "endpoint": "/v1/chat/completions"}
    return (await client.post("/v1/batches", json={**body, "completion_window": "24h"})).status_code


async def admin_api(client: httpx.AsyncClient, key: str) -> int:
    return (await client.get("/admin/tenants")).status_code


async def metrics(client: httpx.AsyncClient, key: str) -> int:
    return (await client.get("/metrics")).status_code


async def bad_feedback(client: httpx.AsyncClient, key: str) -> int:
    return await _post(client, "/v1/cache/feedback", b'{"entry": [1, 2, {"x": null}]')


async def wrong_route(client: httpx.AsyncClient, key: str) -> int:
    status = (await client.get("/v1/chat/completions")).status_code
    return status if status != 405 else (await client.get("/v1/" + "a" * 4000)).status_code


async def oversized_headers(client: httpx.AsyncClient, key: str) -> int:
    return await _raw(
        str(client.base_url),
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer %s\r\n"
        b"x-padding: %s\r\n\r\n" % (key.encode(), b"a" * 1024 * 1024),
    )


async def many_headers(client: httpx.AsyncClient, key: str) -> int:
    many = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(1000))
    return await _raw(str(client.base_url), b"GET /v1/models HTTP/1.1\r\n" + many + b"\r\n")


async def _raw(base_url: str, request: bytes) -> int:
    where = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        writer.write(request)
        await writer.drain()
        line = await reader.readline()
        return int(line.split()[1])
    finally:
        writer.close()


ATTACKS: list[Attack] = [
    bad_json,
    deep_json,
    deep_array,
    huge_model,
    made_up_model,
    wrong_types,
    random_key,
    no_key,
    oversized_body,
    not_jsonl,
    upload_too_large,
    wrong_purpose,
    no_file,
    missing_batch,
    admin_api,
    metrics,
    bad_feedback,
    wrong_route,
    oversized_headers,
    many_headers,
]


async def hammer(url: str, key: str, seconds: float, workers: int) -> dict[str, object]:
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    headers = {"authorization": f"Bearer {key}"}
    deadline = time.monotonic() + seconds

    async def worker(offset: int) -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            index = offset
            while time.monotonic() < deadline:
                attack = ATTACKS[index % len(ATTACKS)]
                index += 1
                try:
                    status = await attack(client, key)
                except (httpx.HTTPError, OSError, ValueError, IndexError) as exc:
                    errors[f"{attack.__name__}: {type(exc).__name__}"] += 1
                    continue
                statuses[f"{attack.__name__} {status}"] += 1

    print("started", flush=True)
    await asyncio.gather(*(worker(i * 3) for i in range(workers)))
    return {"statuses": dict(statuses), "errors": dict(errors)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    result = asyncio.run(hammer(args.url, args.key, args.seconds, args.workers))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
