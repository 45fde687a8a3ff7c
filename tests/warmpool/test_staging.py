"""Weight staging against moto's S3 server on loopback, with a fault proxy where faults matter."""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import sys
import traceback
from pathlib import Path

import orjson
import pytest

from bench.processes import ROOT, free_port
from tests.warmpool.conftest import SECRET, KiB, Model, StagerFactory, Weights, source_factory
from tests.warmpool.fault_proxy import FaultProxy
from warmpool.errors import (
    DiskBudgetExceeded,
    IntegrityError,
    ModelNotStaged,
    SourceNotFound,
    SourceUnavailable,
    StagingError,
)
from warmpool.layout import CacheLayout
from warmpool.progress import stage_with_progress
from warmpool.staged import StagedModel
from warmpool.staging import WeightStager


def layout(tmp_path: Path) -> CacheLayout:
    return CacheLayout(tmp_path / "cache")


def assert_same_files(staged: StagedModel, model: Model) -> None:
    for name, content in model.files.items():
        assert (staged.path / name).read_bytes() == content, name
    on_disk = {str(p.relative_to(staged.path)) for p in staged.path.rglob("*") if p.is_file()}
    assert on_disk == {*model.files, ".complete"}


def kept_on_disk(tmp_path: Path, model: Model) -> dict[str, int]:
    """Bytes per file that an interrupted staging left, as its sidecars and state.json say."""
    cache = layout(tmp_path)
    kept = dict.fromkeys(model.files, 0)
    state = orjson.loads(cache.state(model.prefix).read_bytes())
    for name in state["verified"]:
        kept[name] = len(model.files[name])
    for name in model.files:
        sidecar = cache.sidecar(model.prefix, name)
        if sidecar.exists():
            record = orjson.loads(sidecar.read_bytes())
            size, chunk = len(model.files[name]), record["chunk"]
            kept[name] = sum(min(chunk, size - i * chunk) for i in record["done"])
    return kept


def staged_models(stager: WeightStager, weights: Weights) -> set[str]:
    return {name for name in weights.models if stager.is_staged(name)}


async def test_stage_verifies_publishes_and_reads_ahead(
    weights: Weights, make_stager: StagerFactory, tmp_path: Path
) -> None:
    alpha, beta = weights.models["alpha"], weights.models["beta"]
    stager = make_stager(weights.endpoint)
    seen: list[tuple[int, int]] = []

    staged = await stager.stage("org/alpha:v1", alpha.uri, lambda d, t: seen.append((d, t)))

    assert_same_files(staged, alpha)
    assert stager.is_staged("org/alpha:v1") and not staged.from_cache
    checks = {f.name: f.verified_by for f in staged.files}
    assert checks == {
        "model.safetensors": "sha256",
        "big.bin": "sha256",  # multipart upload, but the manifest has its sha256
        "config.json": "sha256",
        "tokenizer/vocab.txt": "sha256",
        "manifest.json": "etag-md5",
    }
    assert staged.download is not None and staged.download.bytes == alpha.total
    # Every file was hashed, so every byte was just read back: nothing to read again.
    assert staged.readahead is not None and staged.readahead.bytes == 0
    assert seen[-1] == (alpha.total, alpha.total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    marker = orjson.loads((staged.path / ".complete").read_bytes())
    assert marker["model"] == "org/alpha:v1" and marker["uri"] == alpha.uri
    assert list(layout(tmp_path).partial_root.iterdir()) == []

    beta_staged = await stager.stage("beta", beta.uri)
    assert_same_files(beta_staged, beta)
    checks = {f.name: f.verified_by for f in beta_staged.files}
    assert checks == {"a.bin": "etag-md5", "multi.bin": "size", "empty.txt": "etag-md5"}
    size_only = next(f.size for f in beta_staged.files if f.name == "multi.bin")
    assert beta_staged.readahead is not None and beta_staged.readahead.bytes == size_only
    assert (await stager.warm("beta")).bytes == beta.total  # warm() reads every file

    again = await stager.stage("beta", beta.uri)
    assert again.from_cache and again.download is None and again.path == beta_staged.path


async def test_resume_after_interruption_fetches_only_missing_chunks(
    weights: Weights, make_stager: StagerFactory, proxy: FaultProxy, tmp_path: Path
) -> None:
    alpha = weights.models["alpha"]
    options = {"chunk_bytes": 256 * KiB, "parallelism": 2, "readahead": "none"}
    first = make_stager(proxy.url, **options)
    reached = asyncio.Event()

    def progress(done: int, total: int) -> None:
        if done >= 0.4 * total:
            reached.set()

    task = asyncio.create_task(first.stage("alpha", alpha.uri, progress))
    await asyncio.wait_for(reached.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert not first.is_staged("alpha")
    assert not layout(tmp_path).published("alpha").exists()
    kept = kept_on_disk(tmp_path, alpha)
    assert 0.4 * alpha.total <= sum(kept.values()) < alpha.total
    [partial] = [e for e in first.snapshot() if e.partial]
    assert (partial.model, partial.bytes) == ("alpha", sum(kept.values()))

    # A new stager on the same folder: as after a crash and restart.
    await proxy.reset()
    second = make_stager(proxy.url, **options)
    staged = await second.stage("alpha", alpha.uri)

    assert_same_files(staged, alpha)
    assert staged.resumed_bytes == sum(kept.values())
    weights_left = sum(len(b) - kept[n] for n, b in alpha.files.items() if n != "manifest.json")
    assert proxy.bytes_for("/alpha/", exclude="manifest.json") == weights_left


async def test_concurrent_stage_of_one_model_downloads_once(
    weights: Weights, make_stager: StagerFactory, proxy: FaultProxy
) -> None:
    beta = weights.models["beta"]
    stager = make_stager(proxy.url, readahead="none")

    first, second = await asyncio.gather(
        stager.stage("beta", beta.uri), stager.stage("beta", beta.uri)
    )

    assert first is second
    assert_same_files(first, beta)
    assert proxy.bytes_for("/beta/") == beta.total
    assert sum(1 for r in proxy.log if r.range is None) == 1  # one listing


async def test_a_waiting_caller_takes_over_when_the_leader_is_cancelled(
    weights: Weights, make_stager: StagerFactory
) -> None:
    alpha = weights.models["alpha"]
    stager = make_stager(weights.endpoint, chunk_bytes=256 * KiB, parallelism=2)
    await stager.open()
    reached = asyncio.Event()

    def progress(done: int, total: int) -> None:
        if done >= 0.3 * total:
            reached.set()

    leader = asyncio.create_task(stager.stage("alpha", alpha.uri, progress))
    await asyncio.sleep(0)  # the leader registers the shared staging first
    follower = asyncio.create_task(stager.stage("alpha", alpha.uri))
    await asyncio.wait_for(reached.wait(), 30)
    leader.cancel()

    staged = await follower
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert_same_files(staged, alpha)
    assert staged.resumed_bytes >= 0.3 * alpha.total


async def test_corrupted_object_is_fetched_again_then_rejected(
    weights: Weights, make_stager: StagerFactory, proxy: FaultProxy, tmp_path: Path
) -> None:
    corrupt = weights.models["corrupt"]
    stager = make_stager(proxy.url)

    with pytest.raises(IntegrityError, match=r"w.bin: sha256 is .* also after downloading"):
        await stager.stage("corrupt", corrupt.uri)

    assert proxy.bytes_for("/corrupt/w.bin") == 2 * len(corrupt.files["w.bin"])
    assert not stager.is_staged("corrupt")
    assert not layout(tmp_path).published("corrupt").exists()
    assert not list(layout(tmp_path).partial("corrupt").rglob("w.bin*"))


async def test_size_mismatch_with_manifest_fails_before_downloading(
    weights: Weights, make_stager: StagerFactory, proxy: FaultProxy
) -> None:
    wrongsize = weights.models["wrongsize"]
    stager = make_stager(proxy.url)

    with pytest.raises(IntegrityError, match=r"manifest.json says 1048576 bytes"):
        await stager.stage("wrongsize", wrongsize.uri)

    assert proxy.bytes_for("/wrongsize/w.bin") == 0
    assert not stager.is_staged("wrongsize")


async def test_5xx_stalled_and_truncated_reads_are_retried(
    weights: Weights, make_stager: StagerFactory, proxy: FaultProxy
) -> None:
    beta = weights.models["beta"]
    proxy.fail_gets, proxy.stall_gets, proxy.truncate_gets = 3, 2, 2
    proxy.stall_s = 1.0
    stager = make_stager(proxy.url, source={"read_timeout_s": 0.3})

    staged = await stager.stage("beta", beta.uri)

    assert_same_files(staged, beta)
    assert proxy.statuses()[500] == 3
    assert (proxy.fail_gets, proxy.stall_gets, proxy.truncate_gets) == (0, 0, 0)


async def test_gives_up_after_max_attempts(
    weights: Weights, make_stager: StagerFactory, proxy: FaultProxy
) -> None:
    tiny = weights.models["tiny"]
    proxy.fail_gets = 1000
    stager = make_stager(proxy.url)

    gave_up = r"HTTP 500 InternalError .*gave up after 5 tries"
    with pytest.raises(SourceUnavailable, match=gave_up) as info:
        await stager.stage("tiny", tiny.uri)

    assert info.value.temporary
    assert proxy.statuses() == {500: 5}
    assert not stager.is_staged("tiny")


async def test_disk_budget_evicts_least_recently_used_and_keeps_pinned(
    weights: Weights, make_stager: StagerFactory, tmp_path: Path
) -> None:
    ticks = itertools.count(1_000)
    options = {
        "disk_budget_bytes": 800 * KiB,  # three 256 KiB models
        "readahead": "none",
        "clock": lambda: float(next(ticks)),
    }
    stager = make_stager(weights.endpoint, **options)
    await stager.open()
    stager.pin("small-1")
    for name in ("small-1", "small-2", "small-3"):
        await stager.stage(name, weights.models[name].uri)
    stager.touch("small-2")

    await stager.stage("small-4", weights.models["small-4"].uri)

    assert staged_models(stager, weights) == {"small-1", "small-2", "small-4"}
    assert not layout(tmp_path).published("small-3").exists()

    # 600 KiB would fit the budget, but not beside the pinned model: nothing is evicted.
    with pytest.raises(DiskBudgetExceeded) as info:
        await stager.stage("huge", weights.models["huge"].uri)
    assert (info.value.needed, info.value.unevictable) == (600 * KiB, 256 * KiB)
    assert staged_models(stager, weights) == {"small-1", "small-2", "small-4"}

    # After a restart the order of use still holds (it is the markers' mtime).
    restarted = make_stager(weights.endpoint, **options)
    await restarted.open()
    restarted.pin("small-1")
    await restarted.stage("small-3", weights.models["small-3"].uri)
    assert staged_models(restarted, weights) == {"small-1", "small-4", "small-3"}


async def test_a_restarted_stager_serves_staged_models_without_fetching(
    weights: Weights, make_stager: StagerFactory, proxy: FaultProxy
) -> None:
    tiny = weights.models["tiny"]
    await make_stager(proxy.url).stage("tiny", tiny.uri)
    await proxy.reset()

    restarted = make_stager(proxy.url)
    await restarted.open()
    assert restarted.is_staged("tiny")
    staged = await restarted.stage("tiny", tiny.uri)

    assert staged.from_cache
    assert_same_files(staged, tiny)
    assert proxy.log == []


async def test_evict_warm_and_a_new_uri(weights: Weights, make_stager: StagerFactory) -> None:
    stager = make_stager(weights.endpoint, readahead="none")
    staged = await stager.stage("m", weights.models["small-1"].uri)
    assert staged.readahead is None

    warmed = await stager.warm("m")
    assert warmed.bytes == 256 * KiB and warmed.mb_per_s > 0

    moved = await stager.stage("m", weights.models["small-2"].uri)  # the config changed
    assert_same_files(moved, weights.models["small-2"])

    assert await stager.evict("m")
    assert not stager.is_staged("m") and not moved.path.exists()
    assert not await stager.evict("m")
    with pytest.raises(ModelNotStaged):
        await stager.warm("m")


async def test_stage_with_progress_draws_a_bar(
    weights: Weights, make_stager: StagerFactory
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tiny = weights.models["tiny"]
    stager = make_stager(weights.endpoint)
    out = Terminal()

    await stage_with_progress(stager, "tiny", tiny.uri, stream=out)
    await stage_with_progress(stager, "tiny", tiny.uri, stream=out)

    text = out.getvalue()
    assert "\r[" in text and "100%" in text and "MB/s" in text
    assert "tiny: staged 102.4 kB" in text and "tiny: already staged" in text


async def test_missing_objects_are_not_found(weights: Weights, make_stager: StagerFactory) -> None:
    stager = make_stager(weights.endpoint)
    with pytest.raises(SourceNotFound, match="no objects under s3://weights/nothing-here/"):
        await stager.stage("x", "s3://weights/nothing-here/")
    with pytest.raises(SourceNotFound, match="HTTP 404 NoSuchBucket"):
        await stager.stage("x", "s3://no-such-bucket/x/")


async def test_secret_never_appears_in_errors_reprs_or_logs(
    weights: Weights, make_stager: StagerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # botocore's debug logging included
    secret = {"secret": SECRET}
    texts = [repr(source_factory(weights.endpoint, SECRET)())]

    stager = make_stager(weights.endpoint, source=secret)
    staged = await stager.stage("tiny", weights.models["tiny"].uri)
    texts += [repr(staged), str(staged)]
    unreachable = make_stager(f"http://127.0.0.1:{free_port()}", source=secret)
    failures = [
        stager.stage("x", "s3://no-such-bucket/x/"),
        stager.stage("y", "s3://weights/nothing-here/"),
        unreachable.stage("z", weights.models["tiny"].uri),
    ]
    for failure in failures:
        with pytest.raises(StagingError) as info:
            await failure
        texts += traceback.format_exception(info.value)
        texts += [repr(info.value)]

    texts += [caplog.text] + [repr(r.__dict__) for r in caplog.records]
    assert any("SourceUnavailable" in t for t in texts)
    assert not [t for t in texts if SECRET in t]


async def test_open_clears_half_published_folders_and_leaves_foreign_ones(
    weights: Weights, make_stager: StagerFactory, tmp_path: Path
) -> None:
    cache = layout(tmp_path)
    half_published = cache.published("crashed")  # renamed into place, marker never written
    half_published.mkdir(parents=True)
    (half_published / "w.bin").write_bytes(b"half")
    foreign = cache.root / "notes"
    foreign.mkdir()

    stager = make_stager(weights.endpoint)
    await stager.open()

    assert not half_published.exists() and foreign.is_dir()
    assert not stager.is_staged("crashed")
    assert stager.snapshot() == []


async def test_resume_after_the_staging_process_was_killed(
    weights: Weights, make_stager: StagerFactory, proxy: FaultProxy, tmp_path: Path
) -> None:
    alpha = weights.models["alpha"]
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.warmpool.stage_in_subprocess",
        weights.endpoint,
        str(tmp_path / "cache"),
        "alpha",
        alpha.uri,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    assert child.stdout is not None
    async with asyncio.timeout(30):
        while True:
            done, total = map(int, (await child.stdout.readline()).split())
            if done >= 0.4 * total:
                break
    child.kill()  # SIGKILL: no cleanup, no final checkpoint
    await child.wait()

    kept = kept_on_disk(tmp_path, alpha)
    assert 0 < sum(kept.values()) < alpha.total
    staged = await make_stager(proxy.url, chunk_bytes=256 * KiB).stage("alpha", alpha.uri)

    assert_same_files(staged, alpha)
    weights_left = sum(len(b) - kept[n] for n, b in alpha.files.items() if n != "manifest.json")
    assert proxy.bytes_for("/alpha/", exclude="manifest.json") == weights_left
