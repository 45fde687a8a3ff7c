"""A fake continuous-batching LLM engine: a fake of vLLM's documented behaviour, not vLLM.

What each engine covers: the real vLLM (its CPU build, backends/local_vllm.py, tests/engine)
judges what the gateway does against an engine: its scheduler, priority, prefix-cache salts,
usage, errors and /metrics as vLLM really serves them, at CPU speed with a 17M-parameter
model. This fake stands in where the real one cannot run here or would be too slow: an
A100-sized engine (hundreds of sequences, an 8B model's step times) for fast tests and
benchmarks, KV-cache pressure and preemption, and sleep mode (needs CUDA). Its /metrics
names, label keys and semantics are checked against a captured vLLM exposition
(tests/traffic/test_fake_engine.py); its numbers are estimates, not measurements.

No GPU runs here, so the gateway's adaptive concurrency work is measured against this
stand-in for one vLLM V1 server (OpenAI API, run with `--no-enable-prefix-caching`): one
engine loop that steps like vLLM V1's scheduler, in real time. `EngineParams` holds the
defaults, each with its source: Llama-3.1-8B-Instruct in BF16 on one A100 40GB.

The engine admits any number of requests. Each step it schedules the running requests in
admission order (one token for each that decodes, the next prefill chunk for each that is
still prefilling), then admits waiting requests, FIFO or by (priority, arrival) under
`--scheduling-policy priority`, while fewer than `max_num_seqs` run, the step's token budget
`max_num_batched_tokens` lasts (chunked prefill) and the KV blocks for the tokens computed
this step are free. A running request that cannot get a block preempts the newest running
request (under the priority policy, the one of largest (priority, arrival)), as vLLM V1
does, by recompute: its blocks are freed, it goes back to the front of the waiting queue
and later re-prefills its prompt and the tokens generated so far; a step with a preemption
admits no one. A step takes `a + max(b·scheduled, c·prefill tokens)` (the weight and KV
read against the prefill's compute), times a jitter of ±`step_jitter` and `step_scale`, and at
its end each request whose tokens are all computed samples one token. Every request
generates exactly `max_tokens` tokens (256 when unset), as a benchmark with `ignore_eos`
does, each token " tok". Prompt tokens are approximated as ceil(characters / 4) over the
message contents or the completion prompt (a list of token ids counts its length), at least
1. A request longer than the whole KV cache is refused (400), as vLLM refuses one longer
than max_model_len.

Capacity depends on the mix: short requests are capped by `max_num_seqs`, long ones by the
KV budget (a request holds prompt + generated tokens), and prompt tokens cost step time.
`steady_capacity()` gives the steady state for a uniform mix; with the defaults, 100-token
prompts and outputs: 256 running, 36.9 requests/s (measured on this fake: 33-36);
2,000-token prompts and 500-token outputs: 68 running, 2.8 requests/s (measured: 2.2, with
preemptions that recompute whole prompts).

    POST /v1/chat/completions, /v1/completions   OpenAI shapes, whole or streamed (SSE,
                               `data: [DONE]`, `stream_options.include_usage`). `priority`
                               (int, lower first) takes effect under the priority policy; as
                               in vLLM, a non-zero one is refused (400) otherwise. A client
                               that disconnects aborts its request at once, waiting or
                               running, and its KV blocks are freed.
    GET  /v1/models, /health
    GET  /metrics              Prometheus text, vLLM's names and semantics (404 with
                               `--no-metrics` or after {"metrics": false})
    POST /_control             {"step_scale": 2.0} multiplies step time; {"kv_tokens": N}
                               resizes the KV cache, preempting as needed (a request that no
                               longer fits even alone ends, finish_reason "length", counted
                               as truncated); {"metrics": bool}
    GET  /_stats               counts since start (served, aborted, rejected, truncated,
                               preemptions, prompt_tokens, generation_tokens, busy_steps),
                               running, waiting, max_running, max_waiting, kv_cache_usage,
                               num_gpu_blocks, step_scale, busy_s and clock_s (the server's
                               monotonic clock)

`--stream-interval K` sends stream chunks every K tokens, the first token always at once,
as vLLM's `--stream-interval` does (https://github.com/vllm-project/vllm/pull/27869).

`--enable-sleep-mode` serves vLLM's sleep endpoints (POST /sleep?level=1, POST /wake_up,
GET /is_sleeping) with vLLM's states and answers; a sleep takes `--doze-s`, a wake
`--wake-s` (see bench/fake_sleep.py).

Run: python -m bench.fake_engine --port PORT [--max-num-seqs 256] [--kv-tokens 155648]
       [--block-size 16] [--step-a-ms 13] [--step-b-ms 0.12] [--prefill-ms-per-token 0.1]
       [--max-num-batched-tokens 2048] [--scheduling-policy fcfs|priority]
       [--stream-interval 1] [--no-metrics] [--model NAME]
       [--enable-sleep-mode] [--doze-s 0.1] [--wake-s 0.26]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import math
import random
import time
import uuid
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Literal

import orjson

from bench.asgi import read_body, send_json, serve
from bench.fake_sleep import FakeSleep

Scope = dict[str, Any]
Policy = Literal["fcfs", "priority"]


@dataclass(frozen=True)
class EngineParams:
    """Defaults: Llama-3.1-8B-Instruct (BF16) under vLLM V1 on one A100-SXM4-40GB."""

    # vLLM's OpenAI-server defaults below 70 GiB of GPU memory and on any A100
    # (EngineArgs.get_batch_defaults in vllm/engine/arg_utils.py).
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    # vLLM's --long-prefill-token-threshold: the most prompt tokens one request computes in
    # a step (0, the default with one partial prefill at a time, leaves it to the budget).
    long_prefill_token_threshold: int = 0
    # KV per token, Llama-3-8B: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes
    # = 128 KiB. Left for KV on a 40 GB A100 at gpu_memory_utilization 0.9: 0.9 x 39.4 GiB
    # - 15.0 GiB of weights - ~1.4 GiB of activations and non-torch memory = 19 GiB, i.e.
    # 155,648 tokens (9,728 blocks). The same accounting as vLLM's own startup log for this
    # model on a 24 GB card (14.99 GB of weights, 3.81 GiB of KV cache):
    # https://github.com/vllm-project/vllm/issues/10517
    kv_tokens: int = 155_648
    block_size: int = 16  # vLLM's default on CUDA
    # Decode at batch 1 runs at ~75 tokens/s, 13.3 ms a step, for Llama-3.1-8B-Instruct on
    # one A100 40GB under vLLM, and batch 8 costs almost no more ("vLLM throughput-latency
    # sweep on NVIDIA A100", https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on);
    # the memory roofline is 16.06 GB of weights / 1.555 TB/s = 10.3 ms.
    step_a_ms: float = 13.0
    # Each sequence in the batch adds its KV reads and its share of the GEMMs. A batch of
    # 256 reads the weights (10 ms) and up to 19 GiB of KV (13 ms) and does 256 x 16 GFLOP
    # (26 ms at half the A100's 312 TFLOPS); 0.12 ms makes it 43.7 ms, 3.4x batch 1 and
    # 5,860 generated tokens/s.
    step_b_ms: float = 0.12
    # Prefill is compute-bound: 2 x 8.03e9 FLOP per token at half the A100's 312 TFLOPS
    # (BF16, dense) = 0.10 ms per prompt token, ~205 ms for a 2,048-token chunk.
    prefill_ms_per_token: float = 0.10
    # A real engine's steps vary (kernel choice, Python overhead, the host's other work):
    # each step's time is scaled by a uniform draw in [1 - jitter, 1 + jitter], from `seed`.
    step_jitter: float = 0.05
    seed: int = 0
    scheduling_policy: Policy = "fcfs"  # vLLM's default; "priority": lower value first
    stream_interval: int = 1  # vLLM's default
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    metrics: bool = True
    enable_sleep_mode: bool = False  # vLLM's flag (its endpoints also need dev mode)
    doze_s: float = 0.1  # what POST /sleep?level=1 takes: the weights copied to host memory
    wake_s: float = 0.26  # what POST /wake_up takes: vLLM's figure for a small model

    def __post_init__(self) -> None:
        counts = (self.max_num_seqs, self.max_num_batched_tokens, self.stream_interval)
        costs = (self.step_a_ms, self.step_b_ms, self.prefill_ms_per_token, self.step_jitter)
        if (
            min(counts) < 1
            or self.long_prefill_token_threshold < 0
            or not 1 <= self.block_size <= self.kv_tokens
            or min(costs) < 0
            or self.step_jitter >= 1
        ):
            raise ValueError(f"engine parameters out of range: {self}")


def steady_capacity(params: EngineParams, prompt: int, output: int) -> tuple[int, float]:
    """Requests running and requests/s in steady state under full load, for a uniform mix.

    A request holds prompt + output/2 KV tokens on average over its life; the batch is the
    smaller of max_num_seqs and what the KV blocks hold; each request costs `output` decode
    steps shared by the batch plus its prefill. Preemption churn is left out (an upper bound).
    """
    per_request = math.ceil((prompt + output / 2) / params.block_size)
    running = max(
        1, min(params.max_num_seqs, (params.kv_tokens // params.block_size) // per_request)
    )
    step_ms = params.step_a_ms + params.step_b_ms * running
    per_request_ms = output * step_ms / running + params.prefill_ms_per_token * prompt
    return running, 1000.0 / per_request_ms


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Request:
    """One sequence in the engine; the handler waits on `event` for tokens to send."""

    __slots__ = (
        "arrival",
        "blocks",
        "computed",
        "event",
        "finish_reason",
        "generated",
        "gone",
        "max_tokens",
        "priority",
        "prompt",
        "scheduled_at",
        "sent",
        "seq",
        "state",
        "stream",
    )

    def __init__(self, prompt: int, max_tokens: int, priority: int, stream: bool) -> None:
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.priority = priority
        self.stream = stream
        self.arrival = time.monotonic()
        self.seq = 0
        self.state = "new"  # new -> waiting <-> running -> done
        self.computed = 0  # tokens whose KV is held (computed so far)
        self.blocks = 0
        self.generated = 0
        self.sent = 0  # tokens the handler has sent
        self.scheduled_at: float | None = None
        self.finish_reason = ""
        self.gone = False
        self.event = asyncio.Event()

    @property
    def total(self) -> int:
        return self.prompt + self.generated


class WaitingQueue:
    """FIFO (a preempted request goes back to the front), or a heap on (priority, arrival)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.fifo: deque[Request] = deque()
        self.heap: list[tuple[int, float, int, Request]] = []

    def __len__(self) -> int:
        return len(self.fifo) + len(self.heap)

    def push(self, request: Request, front: bool = False) -> None:
        if self.policy == "priority":
            heapq.heappush(self.heap, (request.priority, request.arrival, request.seq, request))
        elif front:
            self.fifo.appendleft(request)
        else:
            self.fifo.append(request)

    def peek(self) -> Request:
        return self.heap[0][3] if self.policy == "priority" else self.fifo[0]

    def pop(self) -> Request:
        return heapq.heappop(self.heap)[3] if self.policy == "priority" else self.fifo.popleft()

    def remove(self, request: Request) -> None:
        if self.policy == "priority":
            self.heap = [entry for entry in self.heap if entry[3] is not request]
            heapq.heapify(self.heap)
        else:
            self.fifo.remove(request)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                return

    def samples(self, name: str, labels: str) -> list[str]:
        lines, cumulative = [], 0
        for bound, count in zip(self.buckets, self.counts, strict=True):
            cumulative += count
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(cumulative)}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        lines.append(f"{name}_count{{{labels}}} {float(self.count)}")
        lines.append(f"{name}_sum{{{labels}}} {self.sum}")
        return lines


# vLLM V1's buckets (vllm/v1/metrics/loggers.py).
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
COUNTERS = ("served", "aborted", "rejected", "truncated", "preemptions", "prompt_tokens",
            "generation_tokens", "busy_steps")
# fmt: on


class Engine:
    """The scheduler and its one loop; every method runs on the event loop, none blocks."""

    def __init__(self, params: EngineParams) -> None:
        self.params = params
        self.step_scale = 1.0
        self.pause = ""  # asleep: "new" admits no one (vLLM's PAUSED_NEW), "all" runs nothing
        self.total_blocks = params.kv_tokens // params.block_size
        self.free_blocks = self.total_blocks
        self.running: list[Request] = []
        self.waiting = WaitingQueue(params.scheduling_policy)
        self.wake = asyncio.Event()
        self.seq = itertools.count(1)
        self.stats = dict.fromkeys(COUNTERS, 0)
        self.max_waiting = 0
        self.max_running = 0
        self.busy_s = 0.0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)
        self.queue_time = Histogram(LATENCY_BUCKETS)
        self.rng = random.Random(params.seed)

    # -- requests in and out ------------------------------------------------------------

    def max_model_len(self) -> int:
        return self.total_blocks * self.params.block_size

    def add(self, request: Request) -> None:
        request.seq = next(self.seq)
        request.state = "waiting"
        self.waiting.push(request)
        self.max_waiting = max(self.max_waiting, len(self.waiting))
        self.wake.set()

    def abort(self, request: Request) -> None:
        if request.state == "running":
            self.running.remove(request)
            self._free(request)
        elif request.state == "waiting":
            self.waiting.remove(request)
        else:
            return
        request.state = "done"
        request.finish_reason = "abort"
        self.stats["aborted"] += 1

    def resize(self, kv_tokens: int) -> None:
        """A new KV budget; preempts the newest running requests until the used blocks fit."""
        used = self.total_blocks - self.free_blocks
        self.total_blocks = max(1, kv_tokens // self.params.block_size)
        self.free_blocks = self.total_blocks - used
        while self.free_blocks < 0:
            self._preempt(self._victim())
        for request in [*self.running, *self.waiting_list()]:
            if not self._fits_alone(request):
                self._truncate(request)
        self.wake.set()

    # -- the loop -----------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                began = loop.time()
            plan, prefill_tokens, preempted = self._schedule()
            if not plan:
                if not preempted:
                    self.wake.clear()
                    await self.wake.wait()
                began = loop.time()
                continue
            step_s = self.step_scale * self._step_ms(len(plan), prefill_tokens) / 1000.0
            await asyncio.sleep(max(0.0, began + step_s - loop.time()))
            # The next step starts now: completing this one and scheduling the next take
            # part of its time, so the steps' real durations stay what they should be.
            ended = loop.time()
            self.busy_s += ended - began
            self.stats["busy_steps"] += 1
            began = ended
            self._complete(plan, time.monotonic())

    def _step_ms(self, scheduled: int, prefill_tokens: int) -> float:
        """A step reads the weights and the batch's KV (memory-bound: a + b per sequence)
        while it computes the prefill tokens (compute-bound: a + c per token): the slower of
        the two, not their sum, so a small prefill hides under the weight read (vLLM on a
        GPU; the sum made small prefills cost 3-5x what they do there). Then jitter."""
        p = self.params
        memory = p.step_b_ms * scheduled
        compute = p.prefill_ms_per_token * prefill_tokens
        jitter = 1.0 + p.step_jitter * (2.0 * self.rng.random() - 1.0)
        return (p.step_a_ms + max(memory, compute)) * jitter

    def _schedule(self) -> tuple[dict[Request, int], int, bool]:
        """One step's plan {request: tokens to compute}, its prefill tokens, any preemption.

        As vLLM V1's scheduler: the running requests first, in admission order, each taking
        its decode token or next prefill chunk from the token budget and the KV blocks those
        tokens need, preempting the newest running request while the blocks are short; then,
        in a step without preemption, waiting requests while a sequence slot, budget and
        blocks for their first chunk are there.
        """
        budget = self.params.max_num_batched_tokens
        plan: dict[Request, int] = {}
        preempted = False
        if self.pause == "all":
            return plan, 0, preempted
        for request in list(self.running):
            if budget == 0:
                break
            if request.state != "running":
                continue  # preempted earlier in this step
            tokens = self._chunk(request, budget)
            while not self._allocate(request, tokens):
                victim = self._victim()
                self._preempt(victim)
                preempted = True
                budget += plan.pop(victim, 0)
                if victim is request:
                    break
            if request.state != "running":
                break  # it preempted itself: no request after it can get a block either
            plan[request] = tokens
            budget -= tokens
        while not preempted and self.waiting and budget > 0 and not self.pause:
            if len(self.running) >= self.params.max_num_seqs:
                break
            request = self.waiting.peek()
            tokens = self._chunk(request, budget)
            if not self._allocate(request, tokens):
                break
            self._admit(self.waiting.pop())
            plan[request] = tokens
            budget -= tokens
        prefill = sum(n for r, n in plan.items() if n > 1 or r.generated == 0)
        return plan, prefill, preempted

    def _chunk(self, request: Request, budget: int) -> int:
        """The tokens `request` computes this step: the rest of its prompt (and generated
        tokens, after a preemption) or its decode token, within the budget and, as vLLM V1's
        scheduler does, at most `long_prefill_token_threshold` when that is set."""
        tokens = min(request.total - request.computed, budget)
        limit = self.params.long_prefill_token_threshold
        return min(tokens, limit) if limit > 0 else tokens

    def _admit(self, request: Request) -> None:
        request.state = "running"
        self.running.append(request)
        self.max_running = max(self.max_running, len(self.running))
        if request.scheduled_at is None:
            request.scheduled_at = time.monotonic()

    def _complete(self, plan: dict[Request, int], now: float) -> None:
        """The step's end: every request whose tokens are all computed samples one token."""
        finished = False
        interval = self.params.stream_interval
        for request, tokens in plan.items():
            if request.state != "running":
                continue  # aborted, preempted or truncated during the step
            request.computed += tokens
            if request.computed < request.total:
                continue
            request.generated += 1
            self.stats["generation_tokens"] += 1
            if request.generated == 1:
                self.stats["prompt_tokens"] += request.prompt
                self.ttft.observe(now - request.arrival)
            if request.generated >= request.max_tokens:
                self._finish(request, now)
                finished = True
            elif request.stream and (
                request.sent == 0 or request.generated - request.sent >= interval
            ):
                request.event.set()
        if finished:
            self.running = [r for r in self.running if r.state == "running"]

    # -- KV blocks and preemption -------------------------------------------------------

    def _allocate(self, request: Request, tokens: int) -> bool:
        size = self.params.block_size
        needed = -(-(request.computed + tokens) // size) - request.blocks
        if needed > self.free_blocks:
            return False
        self.free_blocks -= needed
        request.blocks += needed
        return True

    def _free(self, request: Request) -> None:
        self.free_blocks += request.blocks
        request.blocks = 0
        request.computed = 0

    def _victim(self) -> Request:
        if self.params.scheduling_policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival))
        return self.running[-1]

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._free(request)
        request.state = "waiting"
        self.waiting.push(request, front=True)
        self.max_waiting = max(self.max_waiting, len(self.waiting))
        self.stats["preemptions"] += 1

    def _fits_alone(self, request: Request) -> bool:
        return request.prompt + request.max_tokens <= self.max_model_len()

    def _truncate(self, request: Request) -> None:
        """Only after /_control shrank the KV below what the request needs on its own."""
        if request.state == "running":
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._free(request)
        request.state = "done"
        request.finish_reason = "length"
        request.event.set()
        self.stats["truncated"] += 1

    def _finish(self, request: Request, now: float) -> None:
        self._free(request)
        request.state = "done"
        request.finish_reason = "length"
        request.event.set()
        self.stats["served"] += 1
        self.e2e.observe(now - request.arrival)
        # As vLLM: the time a request waited is observed when it finishes, not when it
        # is scheduled (so a queue shows in this histogram one service time late).
        if request.scheduled_at is not None:
            self.queue_time.observe(request.scheduled_at - request.arrival)

    def waiting_list(self) -> list[Request]:
        return [e[3] for e in self.waiting.heap] + list(self.waiting.fifo)

    # -- what is observed ---------------------------------------------------------------

    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks

    def snapshot(self) -> dict[str, Any]:
        return {
            **self.stats,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "max_waiting": self.max_waiting,
            "max_running": self.max_running,
            "kv_cache_usage": self.kv_usage(),
            "num_gpu_blocks": self.total_blocks,
            "step_scale": self.step_scale,
            "busy_s": self.busy_s,
            "clock_s": time.monotonic(),
        }


def render_metrics(engine: Engine) -> bytes:
    """vLLM's /metrics names, types, help and label sets (V1, 0.10 and later)."""
    labels = f'engine="0",model_name="{engine.params.model}"'
    stats = engine.stats
    lines: list[str] = []
    for name, kind, help_text, value in (
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
         len(engine.running)),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
         len(engine.waiting)),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
         engine.kv_usage()),
        ("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine.",
         stats["preemptions"]),
        ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
         stats["prompt_tokens"]),
        ("vllm:generation_tokens", "counter", "Number of generation tokens processed.",
         stats["generation_tokens"]),
    ):  # fmt: skip
        # vLLM's exposition names a counter's family with its `_total` (as captured).
        sample = name + "_total" if kind == "counter" else name
        lines += [f"# HELP {sample} {help_text}", f"# TYPE {sample} {kind}"]
        lines.append(f"{sample}{{{labels}}} {float(value)}")
    lines += [
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{engine.params.block_size}",cache_dtype="auto",'
        'enable_prefix_caching="False",engine="0",gpu_memory_utilization="0.9",'
        f'kv_cache_size_tokens="{engine.max_model_len()}",'
        f'num_gpu_blocks="{engine.total_blocks}"}} 1.0',
        "# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.",
        "# TYPE vllm:num_requests_waiting_by_reason gauge",
        # Every waiting request here waits for room: nothing is ever deferred.
        f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} '
        f"{float(len(engine.waiting))}",
        f'vllm:num_requests_waiting_by_reason{{{labels},reason="deferred"}} 0.0',
    ]
    for name, help_text, histogram in (
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         engine.ttft),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
         engine.e2e),
        ("vllm:request_queue_time_seconds",
         "Histogram of time spent in WAITING phase for request.", engine.queue_time),
    ):  # fmt: skip
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        lines += histogram.samples(name, labels)
    return ("\n".join(lines) + "\n").encode()


DEFAULT_MAX_TOKENS = 256  # when a request sets none (vLLM would fill the context instead)
TOKEN_TEXT = " tok"
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class Reply:
    """The OpenAI shapes of one request's answer: chat or text completion, whole or chunks."""

    def __init__(self, chat: bool, model: str, include_usage: bool) -> None:
        self.chat = chat
        self.model = model
        self.include_usage = include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, request: Request) -> dict[str, Any]:
        text = TOKEN_TEXT * request.generated
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = request.finish_reason
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [choice], "usage": usage(request)}

    def chunk(self, tokens: int, first: bool, finish: str | None) -> bytes:
        text = TOKEN_TEXT * tokens
        events = []
        if self.chat and first:  # vLLM's first chunk: the role, with the first token
            events.append(self._chat_chunk({"role": "assistant", "content": ""}, None))
        if self.chat:
            events.append(self._chat_chunk({"content": text} if text else {}, finish))
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            events.append({**self._head("text_completion"), "choices": [choice]})
        return b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events)

    def _chat_chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def tail(self, request: Request) -> bytes:
        tail = b""
        if self.include_usage:
            kind = "chat.completion.chunk" if self.chat else "text_completion"
            event = {**self._head(kind), "choices": [], "usage": usage(request)}
            tail = b"data: " + orjson.dumps(event) + b"\n\n"
        return tail + b"data: [DONE]\n\n"


def usage(request: Request) -> dict[str, int]:
    return {
        "prompt_tokens": request.prompt,
        "completion_tokens": request.generated,
        "total_tokens": request.prompt + request.generated,
    }


def prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """ceil(characters / 4) over the message contents or the prompt; token ids count as such."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        chars = sum(
            _content_chars(m.get("content") if isinstance(m, dict) else None) for m in messages
        )
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return max(1, len(prompt))
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string or a list of token ids")
        chars = len(prompt)
    return max(1, math.ceil(chars / 4))


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    return 0


def parse_request(
    path: str, raw: bytes, params: EngineParams, max_model_len: int
) -> tuple[Request, Reply]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    chat = path == "/v1/chat/completions"
    model = body.get("model") or params.model
    if model != params.model:
        raise BadRequest(f"The model `{model}` does not exist.", 404)
    prompt = prompt_tokens(body, chat)
    max_tokens = _integer(body, "max_completion_tokens", 0) or _integer(
        body, "max_tokens", DEFAULT_MAX_TOKENS
    )
    priority = _integer(body, "priority", 0)
    if max_tokens < 1 or _integer(body, "n", 1) != 1:
        raise BadRequest("max_tokens must be at least 1, and n 1 (all this fake serves)")
    if priority != 0 and params.scheduling_policy != "priority":
        raise BadRequest(f"Got priority {priority} but Priority scheduling is not enabled.")
    if prompt + max_tokens > max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} "
            "in the completion). Please reduce the length of the messages or completion."
        )
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    return Request(prompt, max_tokens, priority, stream), Reply(chat, model, include_usage)


def _integer(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer")
    return value


def _error(message: str, status: int) -> dict[str, Any]:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


class FakeEngineApp:
    """Raw ASGI: the OpenAI routes, /metrics, and the benchmark's /_control and /_stats."""

    def __init__(self, params: EngineParams) -> None:
        self.params = params
        self.engine = Engine(params)
        self.metrics = params.metrics
        self.sleep = FakeSleep(self.engine, params.enable_sleep_mode, params.doze_s, params.wake_s)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        if await self.sleep.route(method, path, scope["query_string"], send):
            return
        try:
            if method == "GET":
                await self._get(path, send)
            elif path in ("/v1/chat/completions", "/v1/completions"):
                await self._generate(path, receive, send)
            elif path == "/_control":
                await self._control(await read_body(receive), send)
            else:
                await send_json(send, 404, _error("Not Found", 404))
        except BadRequest as exc:
            await send_json(send, exc.status, _error(str(exc), exc.status))

    async def _lifespan(self, receive: Any, send: Any) -> None:
        async with asyncio.TaskGroup() as tasks:
            await receive()  # lifespan.startup
            stepping = tasks.create_task(self.engine.run())
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            stepping.cancel()
        await send({"type": "lifespan.shutdown.complete"})

    async def _get(self, path: str, send: Any) -> None:
        if path == "/v1/models":
            model = {
                "id": self.params.model,
                "object": "model",
                "created": 0,
                "owned_by": "vllm",
                "root": self.params.model,
                "max_model_len": self.engine.max_model_len(),
            }
            await send_json(send, 200, {"object": "list", "data": [model]})
        elif path == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/metrics" and self.metrics:
            headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            sleep = "".join(line + "\n" for line in self.sleep.metrics(self.params.model))
            body = render_metrics(self.engine) + sleep.encode()
            await send({"type": "http.response.body", "body": body})
        elif path == "/_stats":
            stats = {**self.engine.snapshot(), **self.sleep.stats, "metrics": self.metrics}
            await send_json(send, 200, stats)
        else:
            await send_json(send, 404, _error("Not Found", 404))

    async def _control(self, raw: bytes, send: Any) -> None:
        try:
            body = orjson.loads(raw or b"{}")
            step_scale = float(body.get("step_scale", self.engine.step_scale))
            kv_tokens = int(body.get("kv_tokens", self.engine.max_model_len()))
            metrics = bool(body.get("metrics", self.metrics))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise BadRequest(f"bad control body: {exc}") from exc
        if step_scale <= 0 or kv_tokens < self.params.block_size:
            raise BadRequest("step_scale must be positive and kv_tokens hold one block")
        self.engine.step_scale = step_scale
        if kv_tokens != self.engine.max_model_len():
            self.engine.resize(kv_tokens)
        self.metrics = metrics
        await send_json(send, 200, {**self.engine.snapshot(), "metrics": self.metrics})

    async def _generate(self, path: str, receive: Any, send: Any) -> None:
        raw = await read_body(receive)
        try:
            request, reply = parse_request(path, raw, self.params, self.engine.max_model_len())
        except BadRequest:
            self.engine.stats["rejected"] += 1
            raise
        self.engine.add(request)
        async with asyncio.TaskGroup() as tasks:
            watcher = tasks.create_task(_watch_disconnect(receive, request))
            try:
                if request.stream:
                    await self._stream(request, reply, send)
                else:
                    await self._whole(request, reply, send)
            finally:
                watcher.cancel()
                self.engine.abort(request)  # a no-op once it is done

    async def _whole(self, request: Request, reply: Reply, send: Any) -> None:
        while request.state != "done" and not request.gone:
            await request.event.wait()
            request.event.clear()
        if not request.gone:
            await send_json(send, 200, reply.whole(request))

    async def _stream(self, request: Request, reply: Reply, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        while True:
            await request.event.wait()
            request.event.clear()
            if request.gone:
                return
            done = request.state == "done"
            new = request.generated - request.sent
            if new or done:
                first = request.sent == 0
                request.sent += new
                chunk = reply.chunk(new, first, request.finish_reason if done else None)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if done:
                break
        await send({"type": "http.response.body", "body": reply.tail(request)})


async def _watch_disconnect(receive: Any, request: Request) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    request.gone = True
    request.event.set()


def main() -> None:
    defaults = EngineParams()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    for field in fields(EngineParams):
        flag = "--" + field.name.replace("_", "-")
        if field.name == "metrics":
            parser.add_argument("--no-metrics", dest="metrics", action="store_false")
        elif field.name == "enable_sleep_mode":
            parser.add_argument(flag, action="store_true")
        elif field.name == "scheduling_policy":
            parser.add_argument(
                flag, choices=["fcfs", "priority"], default=defaults.scheduling_policy
            )
        else:
            default = getattr(defaults, field.name)
            parser.add_argument(flag, type=type(default), default=default)
    args = vars(parser.parse_args())
    host, port = args.pop("host"), args.pop("port")
    serve(FakeEngineApp(EngineParams(**args)), host, port, timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
