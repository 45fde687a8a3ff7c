"""Pure parts of staging, as scenario tables: URIs, names, manifests, eviction, backoff, bar."""

from __future__ import annotations

import asyncio
import hashlib
import random

import orjson
import pytest

from warmpool.budget import CacheEntry, plan_eviction
from warmpool.errors import (
    DiskBudgetExceeded,
    IntegrityError,
    InvalidWeightLayout,
    InvalidWeightURI,
    SourceUnavailable,
)
from warmpool.layout import is_safe_name, safe_name
from warmpool.progress import render
from warmpool.retry import TransferRetryPolicy, with_retries
from warmpool.source import RemoteObject, S3Location, parse_s3_uri
from warmpool.verify import ManifestEntry, parse_manifest, plan_files


@pytest.mark.parametrize(
    ("uri", "location"),
    [
        ("s3://weights/llama/8b/", S3Location("weights", "llama/8b/")),
        ("s3://weights/llama/8b", S3Location("weights", "llama/8b/")),
        ("S3://weights/a?b#c", S3Location("weights", "a?b#c/")),
        ("s3://weights", S3Location("weights", "")),
        ("s3://my.bucket_1/", S3Location("my.bucket_1", "")),
    ],
)
def test_s3_uris(uri: str, location: S3Location) -> None:
    assert parse_s3_uri(uri) == location
    assert str(location).startswith("s3://")


@pytest.mark.parametrize(
    "uri",
    [
        "https://weights/x",
        "weights/x",
        "s3://",
        "s3://ab/x",
        "s3://-bad/x",
        "s3://b/a//c",
        "s3://bb/../x",
    ],
)
def test_bad_s3_uris(uri: str) -> None:
    with pytest.raises(InvalidWeightURI):
        parse_s3_uri(uri)


def test_safe_names_are_distinct_and_plain() -> None:
    names = ["org/model", "org_model", "org model", "../etc", ".hidden", "m:v1"]
    safe = [safe_name(n) for n in names]
    assert len(set(safe)) == len(names)
    assert all(s[0] not in "._-" and "/" not in s and " " not in s for s in safe)
    assert all(is_safe_name(s) for s in safe)
    assert not any(is_safe_name(n) for n in ("data", "models-old", ".partial", "x-0123456789ab/"))


def obj(name: str, size: int = 10, etag: str = "0" * 32) -> RemoteObject:
    return RemoteObject("weights", "p/" + name, name, size, etag)


def test_files_are_checked_by_manifest_then_etag_then_size() -> None:
    manifest = {"a": ManifestEntry(10, "f" * 64)}
    objects = [obj("a"), obj("b"), obj("c", etag="abc-3"), obj("d", etag="0" * 31)]

    specs = {s.name: s.verified_by for s in plan_files(objects, manifest)}
    assert specs == {"a": "sha256", "b": "etag-md5", "c": "size", "d": "size"}

    specs = {s.name: s.verified_by for s in plan_files(objects, manifest, verify_etag=False)}
    assert specs == {"a": "sha256", "b": "size", "c": "size", "d": "size"}


@pytest.mark.parametrize(
    ("objects", "manifest", "error", "match"),
    [
        ([obj("a")], {"a": ManifestEntry(11, "f" * 64)}, IntegrityError, "says 11 bytes"),
        ([obj("a")], {"b": ManifestEntry(10, "f" * 64)}, IntegrityError, "not in the bucket"),
        ([obj("a/../b")], None, InvalidWeightLayout, "cannot be a local file"),
        ([obj("a\\b")], None, InvalidWeightLayout, "cannot be a local file"),
        ([obj(".complete")], None, InvalidWeightLayout, "reserved"),
        ([obj("a"), obj("a/b")], None, InvalidWeightLayout, "nest inside"),
    ],
)
def test_unusable_layouts(
    objects: list[RemoteObject],
    manifest: dict[str, ManifestEntry] | None,
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        plan_files(objects, manifest)


def test_manifest_parsing() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    raw = orjson.dumps({"files": {"w.bin": {"size": 1, "sha256": digest.upper()}}})
    assert parse_manifest(raw) == {"w.bin": ManifestEntry(1, digest)}
    for bad in (b"{", b"[]", b'{"files": {"w": {"size": 1}}}', b'{"files": {"w": 3}}'):
        with pytest.raises(IntegrityError, match="not valid"):
            parse_manifest(bad)
    with pytest.raises(IntegrityError, match="bad size or sha256"):
        parse_manifest(orjson.dumps({"files": {"w": {"size": 1, "sha256": "abc"}}}))


def entry(model: str, size: int, used: float, **kw: bool) -> CacheEntry:
    return CacheEntry(model, size, used, **kw)


@pytest.mark.parametrize(
    ("entries", "needed", "victims"),
    [
        ([entry("a", 30, 1), entry("b", 30, 2)], 40, []),
        ([entry("a", 30, 1), entry("b", 30, 2)], 50, ["a"]),
        ([entry("a", 30, 2), entry("b", 30, 1)], 50, ["b"]),
        ([entry("a", 30, 1), entry("b", 30, 2)], 90, ["a", "b"]),
        ([entry("a", 30, 1, pinned=True), entry("b", 30, 2)], 50, ["b"]),
        ([entry("a", 30, 1, busy=True), entry("b", 30, 2)], 50, ["b"]),
        ([entry("p", 20, 5, partial=True), entry("b", 30, 2)], 60, ["b"]),
        ([entry("p", 20, 1, partial=True), entry("b", 30, 2)], 60, ["p"]),
    ],
)
def test_eviction_plans(entries: list[CacheEntry], needed: int, victims: list[str]) -> None:
    planned = plan_eviction(entries, "new", needed, budget=100)
    assert [v.model for v in planned] == victims


@pytest.mark.parametrize(
    ("entries", "needed", "temporary"),
    [
        ([entry("a", 60, 1, pinned=True)], 50, True),
        ([entry("a", 60, 1, busy=True), entry("b", 10, 0)], 50, True),
        ([], 101, False),
    ],
)
def test_eviction_cannot_make_room(entries: list[CacheEntry], needed: int, temporary: bool) -> None:
    with pytest.raises(DiskBudgetExceeded) as info:
        plan_eviction(entries, "new", needed, budget=100)
    assert info.value.temporary is temporary
    assert "new needs" in str(info.value)


def test_backoff_grows_to_a_ceiling_with_full_jitter() -> None:
    backoff = TransferRetryPolicy(base_delay_s=0.2, max_delay_s=1.0).backoff
    assert [backoff.delay_s(n, rand=1.0) for n in (1, 2, 3, 4, 5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.delay_s(3, rand=0.5) == 0.4
    assert backoff.delay_s(3, rand=0.0) == 0.0


async def test_only_unavailable_sources_are_retried() -> None:
    policy = TransferRetryPolicy(max_attempts=3, base_delay_s=0.001, attempt_timeout_s=0.05)
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise SourceUnavailable("503")
        return "ok"

    assert await with_retries(flaky, policy, "x", random.Random(1)) == "ok"
    assert len(calls) == 3

    async def stalls() -> str:
        await asyncio.sleep(1)
        return "late"

    with pytest.raises(SourceUnavailable, match=r"no answer in 0.05 s.*gave up after 3 tries"):
        await with_retries(stalls, policy, "x")

    async def broken() -> str:
        raise IntegrityError("no")

    with pytest.raises(IntegrityError):
        await with_retries(broken, policy, "x")


@pytest.mark.parametrize(
    ("done", "total", "expected"),
    [
        (0, 2_000_000, "[..........]   0%  0 B/2.0 MB  0.0 MB/s"),
        (1_000_000, 2_000_000, "[#####.....]  50%  1.0 MB/2.0 MB  12.5 MB/s"),
        (2_000_000, 2_000_000, "[##########] 100%  2.0 MB/2.0 MB  12.5 MB/s"),
        (5, 0, "[..........]   0%  5 B/0 B  12.5 MB/s"),
    ],
)
def test_progress_line(done: int, total: int, expected: str) -> None:
    rate = 0.0 if done == 0 else 12.5
    assert render(done, total, rate, width=10) == expected
