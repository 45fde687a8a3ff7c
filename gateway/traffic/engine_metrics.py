"""What a model engine's own `/metrics` says about its load: running, waiting, KV-cache use.

`parse(engine, text)` turns one Prometheus text exposition (vLLM, SGLang or TGI) into an
`EngineSample`; `scrape` fetches and parses one. Names and meanings: shared/engine-metrics.md.

- By name only, old names accepted: the first name of a field's list that the exposition
  carries wins (`vllm:kv_cache_usage_perc`, else the deprecated `vllm:gpu_cache_usage_perc`).
- Missing is `None`, never 0: an engine that does not say is unknown, not idle.
- Several series of one name (data-parallel ranks, `engine` labels, models) are one replica:
  counts and token totals are summed, KV usage is the fullest pool's (max). vLLM's KV-cache
  size (`vllm:cache_config_info`) is already the whole replica's on every rank: the largest.
- vLLM counts why requests wait (`num_requests_waiting_by_reason`): only those waiting for
  `capacity` (not `deferred`) say the engine is full.
- vLLM observes `request_queue_time_seconds` when a request *finishes*, TGI its queue
  duration when a request leaves the queue: `queue_time_at_finish` says which, since a wait
  recorded at finish describes the queue one service time ago.
- A value that is not finite (NaN, ±Inf) makes its whole field unknown: a sum missing one
  rank would understate the load. A line that does not parse is skipped, as if absent.

Speed matters: this runs every 250 ms per replica on expositions of 50-150 KB, nearly all of
it histogram buckets that are never read. One compiled pattern per engine, the wanted names
after a newline, lets the regex engine's C loop skip every other line at its first letters;
only the dozen lines that match reach Python (about 80 us for an 85 KB vLLM exposition).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from backends.errors import BackendError
from backends.http import HttpUpstream, server_root

Engine = Literal["vllm", "sglang", "tgi", "none"]


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One scrape of one replica; every field is `None` where the engine did not say."""

    running: float | None = None  # requests in the running batch
    waiting: float | None = None  # requests queued inside the engine
    kv_usage: float | None = None  # fraction of the KV cache in use, 0..1 (fullest rank)
    kv_capacity_tokens: int | None = None  # KV-cache size in tokens, summed over ranks
    kv_tokens_used: float | None = None  # tokens held in the KV cache (SGLang), reserved (TGI)
    preemptions: float | None = None  # counter: requests evicted because the KV cache ran out
    prompt_tokens: float | None = None  # counter: prompt tokens processed
    generation_tokens: float | None = None  # counter: tokens generated
    # counters: seconds finished requests waited in the engine's queue, and their number
    queue_time_sum: float | None = None
    queue_time_count: float | None = None
    queue_time_at_finish: bool = False  # the counters move when a request ends (vLLM)
    waiting_for_capacity: float | None = None  # waiting for room, not deferred (vLLM)


_BY_REASON = "vllm:num_requests_waiting_by_reason"
_CAPACITY_REASON = re.compile(r'[{,][ \t]*+reason[ \t]*+=[ \t]*+"capacity"')

# field -> (names, newest first; how series combine). The order of names is the preference.
_Combine = Literal["sum", "max"]
_Fields = dict[str, tuple[tuple[str, ...], _Combine]]
_SUM: _Combine = "sum"
_MAX: _Combine = "max"
_VLLM: _Fields = {
    "running": (("vllm:num_requests_running",), _SUM),
    "waiting": (("vllm:num_requests_waiting",), _SUM),
    "kv_usage": (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), _MAX),
    "preemptions": (("vllm:num_preemptions_total",), _SUM),
    "prompt_tokens": (("vllm:prompt_tokens_total",), _SUM),
    "generation_tokens": (("vllm:generation_tokens_total",), _SUM),
    "queue_time_sum": (("vllm:request_queue_time_seconds_sum",), _SUM),
    "queue_time_count": (("vllm:request_queue_time_seconds_count",), _SUM),
    "waiting_for_capacity": ((_BY_REASON,), _SUM),
}
_SGLANG: _Fields = {
    "running": (("sglang:num_running_reqs",), _SUM),
    "waiting": (("sglang:num_queue_reqs",), _SUM),
    "kv_usage": (("sglang:token_usage",), _MAX),
    "kv_tokens_used": (("sglang:num_used_tokens",), _SUM),
    # SGLang "retracts" a running request when the KV pool runs out: vLLM's preemption.
    "preemptions": (("sglang:num_retracted_requests_total",), _SUM),
    "prompt_tokens": (("sglang:prompt_tokens_total",), _SUM),
    "generation_tokens": (("sglang:generation_tokens_total",), _SUM),
}
_TGI: _Fields = {
    "running": (("tgi_batch_current_size",), _SUM),
    "waiting": (("tgi_queue_size",), _SUM),
    "kv_tokens_used": (("tgi_batch_current_max_tokens",), _SUM),
    # Histograms of finished requests' lengths: their _sum series are token counters.
    "prompt_tokens": (("tgi_request_input_length_sum",), _SUM),
    "generation_tokens": (("tgi_request_generated_tokens_sum",), _SUM),
    "queue_time_sum": (("tgi_request_queue_duration_sum",), _SUM),
    "queue_time_count": (("tgi_request_queue_duration_count",), _SUM),
}
_FIELDS: dict[Engine, _Fields] = {"vllm": _VLLM, "sglang": _SGLANG, "tgi": _TGI, "none": {}}

# KV-cache size in tokens. vLLM states it only as labels of an info gauge, each rank the
# whole replica's (num_gpu_blocks is summed over data-parallel engines before it is
# exported): the largest series, never their sum. SGLang per rank: summed. TGI not at all.
_CACHE_INFO = "vllm:cache_config_info"
_CAPACITY: dict[Engine, tuple[str, _Combine]] = {
    "vllm": (_CACHE_INFO, _MAX),
    "sglang": ("sglang:max_total_num_tokens", _SUM),
}
_CACHE_LABELS = frozenset({"block_size", "num_gpu_blocks", "kv_cache_size_tokens"})

# A label set: `{name="value",...}`, the values may hold `}`, `,`, spaces and escaped quotes.
# Possessive quantifiers: a line cut short fails at once instead of backtracking.
_PAIR = r'[A-Za-z_][A-Za-z0-9_]*+[ \t]*+=[ \t]*+"(?:[^"\\\n]++|\\.)*+"'
_LABELS = rf"\{{[ \t]*+(?:{_PAIR}(?:[ \t]*+,[ \t]*+{_PAIR})*+[ \t]*+,?[ \t]*+)?\}}"
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*+)[ \t]*+=[ \t]*+"((?:[^"\\\n]++|\\.)*+)"')


def _sample_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    """A sample line of one of `names`: name, labels, value, optional timestamp.

    It starts with the newline before the line: the regex engine then jumps from newline to
    newline in C and gives up on a line at its first letters unless it starts with a wanted
    name (`^` in MULTILINE mode is tried at every character: six times slower here).
    """
    alternatives = "|".join(re.escape(name) for name in names)
    return re.compile(
        rf"\n({alternatives})({_LABELS})?[ \t]++(\S++)(?:[ \t]++-?\d++)?[ \t]*+\r?$",
        re.MULTILINE,
    )


def _names(engine: Engine) -> tuple[str, ...]:
    names = [name for names, _ in _FIELDS[engine].values() for name in names]
    return (*names, _CAPACITY[engine][0]) if engine in _CAPACITY else tuple(names)


_PATTERNS: dict[Engine, re.Pattern[str]] = {
    engine: _sample_pattern(_names(engine)) for engine in ("vllm", "sglang", "tgi")
}


def parse(engine: Engine, text: str | bytes) -> EngineSample:
    """The sample an exposition describes; all `None` for `engine="none"` or no known name."""
    pattern = _PATTERNS.get(engine)
    if pattern is None:
        return EngineSample()
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    series: dict[str, list[float]] = {}
    for name, labels, raw in pattern.findall("\n" + text):
        if name == _BY_REASON and not _CAPACITY_REASON.search(labels):
            continue  # `deferred` (or a reason added later): not waiting for room
        value = _cache_tokens(labels) if name == _CACHE_INFO else _number(raw)
        if value is not None:
            series.setdefault(name, []).append(value)
    fields = {
        field: _combine(series, names, how) for field, (names, how) in _FIELDS[engine].items()
    }
    capacity = None
    if engine in _CAPACITY:
        name, how = _CAPACITY[engine]
        capacity = _combine(series, (name,), how)
    tokens = None if capacity is None else int(capacity)
    at_finish = engine == "vllm" and fields["queue_time_count"] is not None
    return EngineSample(**fields, kv_capacity_tokens=tokens, queue_time_at_finish=at_finish)


def _number(raw: str) -> float | None:
    """The sample's value (NaN for ±Inf too, unknown downstream); None if not a number."""
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else math.nan


def _cache_tokens(labels: str) -> float:
    """`kv_cache_size_tokens` from `vllm:cache_config_info`'s labels (vLLM 0.3x), else
    block_size * num_gpu_blocks (older releases); NaN if unset."""
    # No unescaping: an escape yields a backslash, a quote or a newline, never a digit.
    found = {key: value for key, value in _LABEL.findall(labels) if key in _CACHE_LABELS}
    try:
        if "kv_cache_size_tokens" in found:
            return float(int(found["kv_cache_size_tokens"]))
        return float(int(found["block_size"]) * int(found["num_gpu_blocks"]))
    except (KeyError, ValueError, OverflowError):
        return math.nan  # "None" before the engine has profiled its memory


def _combine(series: dict[str, list[float]], names: tuple[str, ...], how: _Combine) -> float | None:
    """The first of `names` present decides, even where its value is unknown (it is the
    newer name: an engine that still exports the old one beside it is in transition)."""
    for name in names:
        values = series.get(name)
        if values is not None:
            if any(math.isnan(value) for value in values):  # max() would skip some NaNs
                return None
            total = sum(values) if how == "sum" else max(values)
            return total if math.isfinite(total) else None
    return None


def metrics_url(base_url: str, path: str = "/metrics") -> str:
    """Where a replica's engine serves its metrics: at the server root, not under `/v1`.

    `path` may be an absolute http(s) URL (a sidecar, another port), returned as it is.
    """
    if path.startswith(("http://", "https://")):
        return path
    return f"{server_root(base_url)}/{path.lstrip('/')}"


async def scrape(
    upstream: HttpUpstream, url: str, engine: Engine, timeout_s: float
) -> EngineSample | None:
    """One replica's sample; None where there is none to be had (no answer in time, not 200,
    `engine="none"`): the caller then treats the engine as one without metrics.

    Parsing stays on the event loop: it takes a fraction of a millisecond, less than a
    hop to a worker thread and back.
    """
    if engine == "none":
        return None
    try:
        status, body = await upstream.fetch(url, timeout_s)
    except BackendError:
        return None
    return parse(engine, body) if status == 200 else None
