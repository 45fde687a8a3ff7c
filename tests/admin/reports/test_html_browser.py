"""The HTML report in a real headless Chromium (Debian's `chromium`, driven by Playwright).

The page must render with no console or page errors, fetch nothing, and draw every plot:
each inside its box at a desktop and a phone's width, with its marks visible in a
screenshot (decoded by the browser itself, in a canvas).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Route, sync_playwright

from bench.fake_upstream import on_demand_backend
from bench.processes import OPERATOR, Gateway
from common.redis_client import RedisFactory
from gateway.admin.reports import ReportQuery, build_report
from gateway.admin.reports.cache_report import cache_report as report_of
from gateway.admin.reports.html import render
from gateway.config_file import load_settings
from gateway.events import RequestEvent
from gateway.settings import Price, Settings
from tests.conftest import GatewayFactory, fake_backend, hash_of

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


OpenReport = Callable[..., Loaded]


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

    def load(page_html: str, width: int = 1280) -> Loaded:
        path = tmp_path / f"report-{len(pages)}.html"
        path.write_text(page_html, encoding="utf-8")
        page = browser.new_page(viewport={"width": width, "height": 900})
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
    ttft_rows = page.locator('svg[data-plot="ttft-per-model"] text.label').all_text_contents()
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


# -- reports made by the report code itself from request events ---------------------------

SPAN = ReportQuery.parse("2026-11-22T00:00:00Z", "2026-11-22T01:00:00Z")


def request(cache: str, model: str = "echo", status: int = 200, **fields: Any) -> dict[str, Any]:
    at = SPAN.start + 600
    record = RequestEvent(
        ts=at,
        request_id="req",
        tenant="acme",
        model=model,
        backend="fake",
        status=status,
        latency_ms=5.0,
        cache=cache,
        namespace="ns",
        **fields,
    )
    return dataclasses.asdict(record)


def tick_values(page: Page, plot: str, axis: str) -> list[str]:
    return page.locator(f'svg[data-plot="{plot}"] text.{axis}-tick').all_text_contents()


def test_request_mix_draws_every_request_it_counts(open_report: OpenReport) -> None:
    """147 requests, 64 of them not cacheable: the bar draws all 147 and says so."""
    mix = {"exact": 30, "semantic": 10, "miss": 40, "bypass": 3, "none": 64}
    events = [request(cache) for cache, count in mix.items() for _ in range(count)]
    loaded = open_report(render(report_of(events, SPAN, {}), None))
    bar = loaded.page.locator('svg[data-plot="request-mix"]')
    legend = bar.locator("text.legend").all_text_contents()
    assert legend == ["exact hits", "semantic hits", "misses", "bypassed", "not cacheable"]
    tips = [
        re.match(r"(.+): ([\d,]+) ", t) for t in bar.locator("rect.mark title").all_text_contents()
    ]
    drawn = {m.group(1): int(m.group(2).replace(",", "")) for m in tips if m}
    assert drawn == dict(zip(legend, mix.values(), strict=True))
    assert bar.locator('text.label[text-anchor="start"]').text_content() == "147"
    widths = [box["width"] for box in _boxes(bar.locator("rect.mark"))]
    assert widths[-1] / sum(widths) == pytest.approx(64 / 147, abs=0.01)
    _assert_clean(loaded)


def _boxes(marks: Any) -> list[dict[str, float]]:
    return [box for box in (m.bounding_box() for m in marks.all()) if box is not None]


def test_cost_without_a_price_reads_unpriced_not_zero(open_report: OpenReport) -> None:
    price = Price(input_per_1m_tokens=1.0, output_per_1m_tokens=2.0)
    saved = {"saved_tokens": 30, "saved_prompt_tokens": 10, "saved_completion_tokens": 20}
    # Hits only on a model without a price; the priced one only missed.
    events = [request("exact", "free", **saved), request("miss", "echo")]
    loaded = open_report(render(report_of(events, SPAN, {"echo": price}), None))
    page = loaded.page
    assert headline(page, "Cost saved") == "unpriced"
    assert "no price for free" in page.locator(".tile").nth(4).inner_text()
    rows = page.locator('table[data-table="by-tenant-model"] tbody tr')
    costs = {
        r.locator("td").nth(1).inner_text(): r.locator("td").last.inner_text() for r in rows.all()
    }
    assert costs == {"echo": "$0.00", "free": "unpriced"}
    # No price for anything: nothing saved is $0.00 only where a price says so.
    loaded = open_report(render(report_of([request("miss")], SPAN, {}), None))
    assert headline(loaded.page, "Cost saved") == "unpriced"
    assert loaded.page.locator('table[data-table="by-tenant-model"] td').last.inner_text() == (
        "unpriced"
    )


def _is_round_step(step: float) -> bool:
    mantissa = step / 10 ** math.floor(math.log10(step))
    return any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 5, 10))


def test_value_axes_tick_at_round_steps(open_report: OpenReport) -> None:
    """0, 20, 40, ...% rather than 0, 28, 56%: steps of 1, 2 or 5 x 10^n, up to a tick at or
    above the tallest bar."""
    loaded = open_report(render(cache_report(), None))
    page = loaded.page
    tallest = {"hit-rate-over-time": 1.0, "latency-histogram": 110 / 195, "similarity": 33 / 75}
    for plot, top in tallest.items():
        values = [float(t.rstrip("%")) / 100 for t in tick_values(page, plot, "y")]
        steps = [round(b - a, 9) for a, b in itertools.pairwise(values)]
        assert values[0] == 0 and len(set(steps)) == 1, (plot, values)
        assert _is_round_step(steps[0]), (plot, values)
        assert top <= values[-1] < top + steps[0], (plot, values)
    _assert_clean(loaded)


def test_similarity_axis_starts_at_the_search_floor(open_report: OpenReport) -> None:
    events = [request("miss", similarity=0.83), request("semantic", similarity=0.97)]
    loaded = open_report(render(report_of(events, SPAN, {}), None))
    labels = tick_values(loaded.page, "similarity", "x")
    assert labels[0] == "0.80\u20130.82", labels
    _assert_drawn(loaded.page, "similarity")


# A screenshot decoded by the browser itself (in a canvas): how many pixels of each colour,
# and the colours of the 3 x 3 pixels around each point given.
DECODE = """async ([png, points]) => {
  const image = new Image();
  image.src = 'data:image/png;base64,' + png;
  await image.decode();
  const canvas = document.createElement('canvas');
  [canvas.width, canvas.height] = [image.width, image.height];
  const context = canvas.getContext('2d');
  context.drawImage(image, 0, 0);
  const data = context.getImageData(0, 0, image.width, image.height).data;
  const rgb = i => (data[i] << 16) | (data[i + 1] << 8) | data[i + 2];
  const counts = {};
  for (let i = 0; i < data.length; i += 4) counts[rgb(i)] = (counts[rgb(i)] || 0) + 1;
  const around = ([x, y]) => [-1, 0, 1].flatMap(dy => [-1, 0, 1].map(dx =>
    rgb(4 * ((Math.floor(y) + dy) * image.width + Math.floor(x) + dx))));
  const at = points.map(around);
  return {counts, at};
}"""

# Every plot's box, its figure's, what of its content lies outside its box, and the centre
# (in the plot's own box) and fill of each mark big enough to have a pixel of its own.
LAYOUT = """() => Array.from(document.querySelectorAll('svg[data-plot]')).map(svg => {
  const box = svg.getBoundingClientRect();
  const figure = svg.closest('figure').getBoundingClientRect();
  const outside = [];
  for (const el of svg.querySelectorAll('text, rect, circle, path, line')) {
    const r = el.getBoundingClientRect();
    if (r.left < box.left - 0.5 || r.right > box.right + 0.5 ||
        r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) {
      outside.push(el.tagName + ' ' + el.textContent);
    }
  }
  const marks = Array.from(svg.querySelectorAll('rect.mark, circle.mark'))
    .map(m => [m, m.getBoundingClientRect()])
    .filter(([m, r]) => r.width >= 3 && r.height >= 3)
    .map(([m, r]) => ({fill: m.getAttribute('fill'), tip: m.textContent,
                       at: [r.left + r.width / 2 - box.left, r.top + r.height / 2 - box.top]}));
  const view = svg.viewBox.baseVal;
  return {plot: svg.dataset.plot, box: [box.left, box.right, box.width, box.height],
          shape: view.height / view.width, figure: [figure.left, figure.right], outside, marks};
})"""

LONG_NAME = "meta-llama/Llama-3.1-70B-Instruct-FP8"  # model names this long are common


@dataclass
class Shot:
    counts: dict[int, int]  # pixels per colour (0xRRGGBB)
    at: list[list[int]]  # the colours around each point asked for


def _decode(decoder: Page, png: bytes, points: list[list[float]]) -> Shot:
    found = decoder.evaluate(DECODE, [base64.b64encode(png).decode(), points])
    return Shot({int(rgb): n for rgb, n in found["counts"].items()}, found["at"])


def _same_colour(rgb: int, fill: str) -> bool:
    want = [int(fill[i : i + 2], 16) for i in (1, 3, 5)]
    got = [(rgb >> 16) & 255, (rgb >> 8) & 255, rgb & 255]
    return all(abs(a - b) <= 3 for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("width", [1280, 390])
def test_every_chart_fits_its_box_and_shows_in_a_screenshot(
    open_report: OpenReport, browser: Browser, tmp_path: Path, width: int
) -> None:
    """At a desktop's and a phone's width: no plot (nor any of its text) spills out of its
    box, no figure out of the page, and in each plot's screenshot every mark shows its own
    colour where it is drawn; the whole page's screenshot is not blank."""
    cache, cold = cache_report(), cold_start_report()
    cold["models"][0]["model"] = LONG_NAME
    for start in cold["starts"]:
        start["model"] = LONG_NAME
    loaded = open_report(render(cache, cold), width)
    page = loaded.page
    layout = page.evaluate(LAYOUT)
    assert sorted(p["plot"] for p in layout) == sorted(CACHE_PLOTS + COLD_PLOTS)
    decoder = browser.new_page()  # a blank page of its own: the report's policy allows no script
    try:
        for plot in layout:
            name = plot["plot"]
            left, right, plot_w, plot_h = plot["box"]
            # As wide as its column allows, and as high as its shape says (not squashed).
            assert plot_w > 0.8 * (plot["figure"][1] - plot["figure"][0]), plot
            assert plot_h == pytest.approx(plot_w * plot["shape"], abs=1.5), plot
            assert plot["figure"][0] <= left and right <= plot["figure"][1], plot
            assert plot["figure"][0] >= 0 and plot["figure"][1] <= width, plot
            assert plot["outside"] == [], plot
            assert plot["marks"], f"{name}: no mark big enough to see"
            shot = tmp_path / f"{name}-{width}.png"
            png = page.locator(f'svg[data-plot="{name}"]').screenshot(path=shot)
            pixels = _decode(decoder, png, [m["at"] for m in plot["marks"]])
            unseen = [
                f"{m['tip']} ({m['fill']}, around its centre: {[f'#{c:06x}' for c in around]})"
                for m, around in zip(plot["marks"], pixels.at, strict=True)
                if not any(_same_colour(rgb, m["fill"]) for rgb in around)
            ]
            assert unseen == [], f"{name}: marks not visible in {shot}"
        full = tmp_path / f"page-{width}.png"
        pixels = _decode(decoder, page.screenshot(path=full, full_page=True), [])
        most = max(pixels.counts.values())
        assert most < 0.9 * sum(pixels.counts.values()), f"{full} is nearly blank"
        assert len(pixels.counts) > 50, f"{full} is nearly blank"
    finally:
        decoder.close()
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    _assert_clean(loaded)


KEY = "sk-test-html-report-0123456789"


class EmbeddingsOnly(BaseHTTPRequestHandler):
    """A model server for an embedding model: it serves `/v1/embeddings` (and lists its
    model); a chat request is answered 404, as such a server does for a route it lacks."""

    def do_GET(self) -> None:
        self._answer(200, {"object": "list", "data": [{"id": "embed", "object": "model"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path == "/v1/embeddings":
            data = [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}]
            self._answer(200, {"object": "list", "data": data, "model": "embed"})
        else:
            error = {"message": f"{self.path} is not served for this model", "code": 404}
            self._answer(404, {"error": error | {"type": "NotFoundError"}})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: pytest shows failures, not every request


@pytest.fixture
def embeddings_only() -> Iterator[str]:
    """Base URL (…/v1) of an embeddings-only model server, in a thread of this process."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), EmbeddingsOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def real_run_config(tmp_path: Path, upstream: str, embeddings: str) -> dict[str, Any]:
    """Cached answers from a static upstream, the fake upstream again as a model server
    the gateway starts on demand (so the run has a cold start with its phases), and an
    embedding model (that clients will ask for chat by mistake)."""
    on_demand = on_demand_backend(["slow"], {"idle_s": 60})
    embedder = fake_backend(embeddings, name="embedder", models=["embed"])
    return {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        # Exact tiers only: the page is under test here, not MiniLM (spared the load time).
        "cache": {"enabled": True, "semantic": False, "path": str(tmp_path / "cache")},
        "backends": [fake_backend(upstream, models=["echo"]), on_demand, embedder],
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
            r"^gateway_cache_entries ([0-9.e+]+)$",
            httpx.get(gw.url + "/metrics", headers=OPERATOR).text,
            re.M,
        )
        return found is not None and float(found.group(1)) >= 2

    with openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0) as client:
        ask(client, "slow", "wake the model server")  # held through a cold start
        for prompt in ["What is a haiku?", "Name three primes."]:
            ask(client, "echo", prompt)
        poll(stored, "the answers to be stored")
        for prompt in ["What is a haiku?", "What is a haiku?", "Name three primes.", "Why?"]:
            ask(client, "echo", prompt)
        for _ in range(2):  # chat with an embedding model: looked up, then 404 from its server
            with pytest.raises(openai.NotFoundError):
                ask(client, "embed", "What is a haiku?")


def events_written(settings: Settings) -> bool:
    """Whether the run's requests and its cold start are all in the store (written in
    batches, a little after the answers)."""
    query = ReportQuery.parse("10m")
    # Playwright's sync API keeps an event loop running on this thread: use another one.
    with ThreadPoolExecutor(1) as thread:
        cache = thread.submit(
            asyncio.run, build_report("cache", settings, RedisFactory(settings.state.url), query)
        ).result()
        cold = thread.submit(
            asyncio.run,
            build_report("cold_start", settings, RedisFactory(settings.state.url), query),
        ).result()
    starts = sum(m["cold_starts"] for m in cold["models"])
    return bool(cache["totals"]["requests"] == 9 and starts >= 1)


def test_gateway_report_all_html_from_a_real_run(
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    embeddings_only: str,
    tmp_path: Path,
    open_report: OpenReport,
) -> None:
    gw = gateway_factory(real_run_config(tmp_path, fake_upstream, embeddings_only))
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
    # By hand: 9 requests. 7 lookups: the cold one and three first askings miss, three
    # repeats hit; the two chats with the embedding model never had an answer to find.
    assert headline(page, "Hit rate") == "42.9%"
    assert headline(page, "Exact hits") == "3"
    assert headline(page, "Semantic hits") == "0"
    assert headline(page, "Cold starts") == "1"
    assert headline(page, "Requests that waited") == "1"
    mix = page.locator('svg[data-plot="request-mix"]')
    assert "not cacheable: 2 (22.2%)" in mix.locator("rect.mark title").all_text_contents()
    assert mix.locator('text.label[text-anchor="start"]').text_content() == "9"
    rows = page.locator('table[data-table="by-tenant-model"] tbody tr')
    embed = rows.filter(has=page.locator("td", has_text=re.compile("^embed$")))
    # Model, Requests, Hits, Hit rate, Tokens saved, Cost saved: no lookup, no price.
    assert embed.locator("td").all_inner_texts()[1:] == [
        "embed",
        "2",
        "0",
        "\u2014",
        "0",
        "unpriced",
    ]
    assert page.locator('table[data-table="top-namespaces"] tbody tr').count() == 3
    _assert_clean(loaded)
