"""The HTML report in a real headless Chromium (Debian's `chromium`, driven by Playwright).

The page must render with no console or page errors, fetch nothing, and draw every plot.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Route, sync_playwright

from gateway.admin.reports import ReportQuery, build_report
from gateway.admin.reports.html import render
from gateway.config_file import load_settings
from gateway.settings import Settings
from tests.conftest import GatewayFactory, fake_backend, hash_of
from tests.support.fake_upstream import on_demand_backend
from tests.support.processes import Gateway

CHROMIUM = Path("/usr/bin/chromium")
PHASES = ["staging", "process_start", "weight_load", "ready", "first_byte"]
CACHE_PLOTS = ["request-mix", "hit-rate-over-time", "latency-histogram", "similarity"]
COLD_PLOTS = ["cold-start-phases", "cold-start-timeline", "ttft-per-model", "time-at-zero"]


def cache_report() -> dict[str, Any]:
    hours = [f"2026-11-22T{h:02d}:00:00+00:00" for h in range(6)]
    traffic = [(40, 10), (60, 27), (0, 0), (80, 44), (120, 78), (50, 36)]
    # acme's only namespace: its row in both tables counts the same requests.
    acme: dict[str, Any] = {
        "tenant": "acme",
        "model": "tiny-chat",
        "requests": 250,
        "hits": 160,
        "hit_rate": 0.64,
        "saved_tokens": 40100,
    }
    return {
        "kind": "cache",
        "range": {"since": hours[0], "until": "2026-11-22T06:00:00+00:00"},
        "filters": {"tenant": None, "model": None},
        "totals": {
            "requests": 350,
            "hits": 195,
            "exact_hits": 120,
            "semantic_hits": 75,
            "misses": 140,
            "bypassed": 15,
            "hit_rate": 195 / 350,
            "exact_hit_rate": 120 / 350,
            "semantic_hit_rate": 75 / 350,
            "saved_tokens": 48213,
            "saved_cost_usd": 0.7234,
        },
        "latency_ms": {
            "hit": {"count": 195, "p50": 4.2, "p95": 11.8, "p99": 19.0},
            "miss": {"count": 140, "p50": 812.0, "p95": 2310.0, "p99": 4100.0},
        },
        "latency_histogram": {
            "edges_ms": [0, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000],
            "hit": [110, 60, 20, 5, 0, 0, 0, 0, 0, 0],
            "miss": [0, 0, 0, 0, 2, 8, 20, 45, 50, 15],
        },
        "over_time": [
            {"start": start, "requests": r, "hits": h, "hit_rate": h / r if r else None}
            for start, (r, h) in zip(hours, traffic, strict=True)
        ],
        "top_namespaces": [
            {"namespace": "acme:tiny-chat:v1", **acme},
            {
                "namespace": "globex:tiny-chat:v1",
                "tenant": "globex",
                "model": "tiny-chat",
                "requests": 100,
                "hits": 35,
                "hit_rate": 0.35,
                "saved_tokens": 8113,
            },
        ],
        "similarity": {
            "edges": [0.80, 0.84, 0.88, 0.92, 0.96, 1.0],
            "hits": [0, 0, 12, 30, 33],
            "near_misses": [9, 14, 6, 0, 0],
        },
        "by_tenant_model": [{**acme, "saved_cost_usd": 0.6015}],
    }


def cold_start_report() -> dict[str, Any]:
    def model(name: str, starts: int, ttft: tuple[float, float, float]) -> dict[str, Any]:
        return {
            "model": name,
            "backend": "process",
            "cold_starts": starts,
            "failed": 1 if starts > 2 else 0,
            "ttft_s": {"p50": ttft[0], "p95": ttft[1], "max": ttft[2]},
            "phases_s": dict(zip(PHASES, [1.2, 0.8, ttft[0] - 2.6, 0.4, 0.2], strict=True)),
            "waited_requests": 7 * starts,
            "wait_s": {"p50": 2.0, "p95": 5.5, "max": 6.1},
            "shed_while_cold": starts - 1,
            "time_at_zero_s": 15000.0,
            "time_warm_s": 6600.0,
            "gpu_hours_saved": 4.17,
        }

    starts = [
        {
            "at": f"2026-11-22T0{i}:1{i}:00+00:00",
            "model": "tiny-chat" if i % 2 else "big-chat",
            "ttft_s": 4.0 + i,
            "phases_s": dict(zip(PHASES, [1.0 + i / 2, 0.7, 1.5 + i / 3, 0.4, 0.2], strict=True)),
        }
        for i in range(5)
    ]
    return {
        "kind": "cold_start",
        "range": {"since": "2026-11-22T00:00:00+00:00", "until": "2026-11-22T06:00:00+00:00"},
        "filters": {"tenant": None, "model": None},
        "phases": PHASES,
        "models": [model("tiny-chat", 3, (4.1, 6.2, 6.9)), model("big-chat", 2, (7.3, 9.8, 9.8))],
        "starts": starts,
    }


def empty_reports() -> tuple[dict[str, Any], dict[str, Any]]:
    span = {"since": "2026-11-22T00:00:00+00:00", "until": "2026-11-22T01:00:00+00:00"}
    none = {"count": 0, "p50": None, "p95": None, "p99": None}
    cache = {
        "kind": "cache",
        "range": span,
        "filters": {"tenant": None, "model": None},
        "totals": dict.fromkeys(["requests", "hits", "misses", "saved_tokens"], 0)
        | {"hit_rate": None, "saved_cost_usd": 0.0},
        "latency_ms": {"hit": none, "miss": none},
        "latency_histogram": {"edges_ms": [0, 10, 100], "hit": [0, 0], "miss": [0, 0]},
        "over_time": [],
        "top_namespaces": [],
        "similarity": {"edges": [0.8, 0.9, 1.0], "hits": [0, 0], "near_misses": [0, 0]},
        "by_tenant_model": [],
    }
    cold = {"kind": "cold_start", "range": span, "filters": {}, "phases": PHASES}
    return cache, cold | {"models": [], "starts": []}


@dataclass
class Loaded:
    page: Page
    errors: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)


OpenReport = Callable[[str], Loaded]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's `chromium` package "
            "(apt-get install chromium chromium-driver, or run scripts/install_chromium.sh)"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


@pytest.fixture
def open_report(browser: Browser, tmp_path: Path) -> Iterator[OpenReport]:
    """Opens a page in Chromium, noting console errors and any request for a non-file URL
    (those are refused, so that a page that reaches out fails here rather than hangs)."""
    pages: list[Page] = []

    def load(page_html: str) -> Loaded:
        path = tmp_path / f"report-{len(pages)}.html"
        path.write_text(page_html, encoding="utf-8")
        page = browser.new_page()
        pages.append(page)
        loaded = Loaded(page)
        page.on("console", lambda m: _note_console(loaded, m))
        page.on("pageerror", lambda exc: loaded.errors.append(f"page error: {exc}"))
        page.on("request", lambda r: _note_request(loaded, r))
        page.route("**/*", lambda route: _only_files(loaded, route))
        page.goto(path.as_uri(), wait_until="load")
        return loaded

    yield load
    for page in pages:
        page.close()


def _note_console(loaded: Loaded, message: ConsoleMessage) -> None:
    if message.type in ("error", "warning"):
        loaded.errors.append(f"console {message.type}: {message.text}")


def _note_request(loaded: Loaded, request: Request) -> None:
    if not request.url.startswith("file://"):
        loaded.foreign.append(request.url)


def _only_files(loaded: Loaded, route: Route) -> None:
    if route.request.url.startswith("file://"):
        route.continue_()
    else:
        loaded.foreign.append(route.request.url)
        route.abort()


def _assert_clean(loaded: Loaded) -> None:
    assert loaded.errors == []
    assert loaded.foreign == []


def headline(page: Page, label: str) -> str:
    return page.locator(f'[data-headline="{label}"]').inner_text()


def _assert_drawn(page: Page, plot: str) -> None:
    svg = page.locator(f'svg[data-plot="{plot}"]')
    assert svg.count() == 1, f"plot {plot} missing"
    marks = svg.locator("path.mark, rect.mark, circle.mark").count()
    assert marks > 0, f"plot {plot} has no marks"
    box = svg.bounding_box()
    assert box is not None and box["width"] > 200 and box["height"] > 30, (plot, box)


def test_full_report_renders_every_plot_cleanly(open_report: OpenReport) -> None:
    loaded = open_report(render(cache_report(), cold_start_report()))
    page = loaded.page
    for plot in CACHE_PLOTS + COLD_PLOTS:
        _assert_drawn(page, plot)
    assert page.locator("[data-empty]").count() == 0
    expected = {
        "Hit rate": "55.7%",
        "Exact hits": "120",
        "Semantic hits": "75",
        "Tokens saved": "48,213",
        "Cost saved": "$0.7234",
        "Hit latency p50": "4.2 ms",
        "Miss latency p50": "812 ms",
        "Cold starts": "5",
        "TTFT p50": "6.00 s",  # nearest rank over the five starts: 4, 5, 6, 7, 8 s
        "TTFT p95": "8.00 s",
        "GPU-hours saved": "8.34",
    }
    assert {label: headline(page, label) for label in expected} == expected
    assert page.locator('table[data-table="top-namespaces"] tbody tr').count() == 2
    assert page.locator('svg[data-plot="hit-rate-over-time"] circle.mark').count() == 5
    _assert_clean(loaded)


def test_empty_report_says_so_instead_of_plotting(open_report: OpenReport) -> None:
    loaded = open_report(render(*empty_reports()))
    page = loaded.page
    assert page.locator("svg[data-plot]").count() == 0
    assert page.locator('[data-empty="cache"]').inner_text() == "No data in this range"
    assert page.locator('[data-empty="cold_start"]').is_visible()
    _assert_clean(loaded)


def test_sparse_report_draws_what_exists_and_marks_the_rest_empty(open_report: OpenReport) -> None:
    cache, cold = cache_report(), cold_start_report()
    cache["similarity"] = {"edges": [], "hits": [], "near_misses": []}
    cache["over_time"] = [
        {"start": cache["range"]["since"], "requests": 3, "hits": 1, "hit_rate": 1 / 3}
    ]
    cold["starts"] = []
    cold["models"][1]["ttft_s"] = {"p50": None, "p95": None, "max": None}  # never served
    histogram = cache["latency_histogram"]  # edges given as upper bounds only
    histogram["edges_ms"] = histogram["edges_ms"][1:]
    loaded = open_report(render(cache, cold))
    page = loaded.page
    for plot in ["hit-rate-over-time", "latency-histogram", "cold-start-phases", "ttft-per-model"]:
        _assert_drawn(page, plot)
    assert "\u22645k" in (page.locator('svg[data-plot="latency-histogram"]').text_content() or "")
    ttft_rows = page.locator('svg[data-plot="ttft-per-model"] text.label').all_inner_texts()
    assert "big-chat" not in ttft_rows
    assert headline(page, "TTFT p50") == "\u2014"  # two models, no starts to pool
    for plot in ["similarity", "cold-start-timeline"]:
        assert page.locator(f'[data-plot="{plot}"][data-empty]').is_visible(), plot
    _assert_clean(loaded)


def test_text_from_reports_is_escaped() -> None:
    cache = cache_report()
    cache["filters"]["tenant"] = "<script>alert(1)</script>"
    cache["top_namespaces"][0]["tenant"] = '<img src=x onerror="alert(2)">'
    cold = cold_start_report()
    cold["models"][0]["model"] = "</svg><script>alert(3)</script>"
    page_html = render(cache, cold)
    assert "<script" not in page_html
    assert "<img" not in page_html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page_html
    assert "&lt;/svg&gt;&lt;script&gt;alert(3)" in page_html
    assert len(re.findall(r"<svg\b", page_html)) == len(re.findall(r"</svg>", page_html))


def test_no_report_at_all_still_makes_a_page() -> None:
    page_html = render(None, None)
    assert 'data-empty="page"' in page_html and "No data in this range" in page_html
    assert "<svg" not in page_html


KEY = "sk-test-html-report-0123456789"


def real_run_config(tmp_path: Path, upstream: str) -> dict[str, Any]:
    """Cached answers from a static upstream, and the fake upstream again as a model server
    the gateway starts on demand (so the run has a cold start with its phases)."""
    on_demand = on_demand_backend(["slow"], {"idle_s": 60})
    return {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        # Exact tiers only: the page is under test here, not MiniLM (spared the load time).
        "cache": {"enabled": True, "semantic": False, "path": str(tmp_path / "cache")},
        "backends": [fake_backend(upstream, models=["echo"]), on_demand],
        "tenants": [{"name": "acme", "keys": [{"sha256": hash_of(KEY)}]}],
        "pricing": {"echo": {"input_per_1m_tokens": 3.0, "output_per_1m_tokens": 15.0}},
        # Until a start is measured the gateway expects one to take 30 s, and sheds a request
        # that would wait over half its deadline: give the first request room to be held.
        "traffic": {"deadline_s": {"interactive": 120}},
    }


def poll(check: Callable[[], Any], what: str, timeout_s: float = 20) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


def run_traffic(gw: Gateway) -> None:
    def ask(client: openai.OpenAI, model: str, prompt: str) -> None:
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            extra_body={"x_delay": 0.05} if model == "slow" else None,
        )

    def stored() -> bool:
        found = re.search(
            r"^gateway_cache_entries ([0-9.e+]+)$", httpx.get(gw.url + "/metrics").text, re.M
        )
        return found is not None and float(found.group(1)) >= 2

    with openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0) as client:
        ask(client, "slow", "wake the model server")  # held through a cold start
        for prompt in ["What is a haiku?", "Name three primes."]:
            ask(client, "echo", prompt)
        poll(stored, "the answers to be stored")
        for prompt in ["What is a haiku?", "What is a haiku?", "Name three primes.", "Why?"]:
            ask(client, "echo", prompt)


def events_written(settings: Settings) -> bool:
    """Whether the run's requests and its cold start are all in the store (written in
    batches, a little after the answers)."""
    query = ReportQuery.parse("10m")
    # Playwright's sync API keeps an event loop running on this thread: use another one.
    with ThreadPoolExecutor(1) as thread:
        cache = thread.submit(asyncio.run, build_report("cache", settings, query)).result()
        cold = thread.submit(asyncio.run, build_report("cold_start", settings, query)).result()
    starts = sum(m["cold_starts"] for m in cold["models"])
    return bool(cache["totals"]["requests"] == 7 and starts >= 1)


def test_gateway_report_all_html_from_a_real_run(
    gateway_factory: GatewayFactory, fake_upstream: str, tmp_path: Path, open_report: OpenReport
) -> None:
    gw = gateway_factory(real_run_config(tmp_path, fake_upstream))
    run_traffic(gw)
    settings = load_settings(gw.config_path, {})
    poll(lambda: events_written(settings), "the events of the run")
    out = tmp_path / "report.html"
    written = gw.cli("report", "all", "--since", "10m", "--format", "html", "--output", str(out))
    assert written.returncode == 0, written.stderr

    loaded = open_report(out.read_text(encoding="utf-8"))
    page = loaded.page
    for plot in CACHE_PLOTS[:-1] + COLD_PLOTS:
        _assert_drawn(page, plot)
    assert page.locator('[data-plot="similarity"][data-empty]').is_visible()  # exact tiers only
    # By hand: 7 requests; the cold one and three first askings miss, three repeats hit.
    assert headline(page, "Hit rate") == "42.9%"
    assert headline(page, "Exact hits") == "3"
    assert headline(page, "Semantic hits") == "0"
    assert headline(page, "Cold starts") == "1"
    assert headline(page, "Requests that waited") == "1"
    assert page.locator('table[data-table="top-namespaces"] tbody tr').count() == 2
    _assert_clean(loaded)
