"""The pure parts of bench/slo_goodput.py and what it asks of the open-loop load generator."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from bench.loadgen import PhaseResult, PhaseSpec, Record, RoundResult, StreamSpec
from bench.loadgen_open import _plan
from bench.slo_goodput import (
    ABLATED,
    DEADLINES,
    FULL,
    MIX,
    POOLED,
    QUICK,
    TPOT_MIN_TOKENS,
    Bench,
    Bodies,
    Objective,
    Phase,
    Plan,
    Run,
    bare_again_ratio,
    figures,
    limit_figures,
    limit_trace,
    load1_throughput,
    load_figures,
    meets,
    offered,
    per_token_ms,
    pooled_throughput_ratios,
    prefix_hit_rate,
    streams,
    versus_bare,
)

OBJECTIVE = Objective(ttft_ms=100.0, tpot_ms=10.0)


def record(first_ms: float, latency_ms: float, tokens: int, status: int = 200) -> Record:
    code = None if status == 200 else "x"
    return Record(0, 1.0, first_ms, latency_ms, status, code, False, tokens)


def test_lengths_are_heavy_tailed_clipped_and_replayed_by_seed() -> None:
    mix = MIX["interactive"]
    drawn = [mix.draw(random.Random(f"s{i}")) for i in range(2000)]
    prompts = [p for p, _ in drawn]
    outputs = [o for _, o in drawn]
    assert max(prompts) == mix.prompt_max and max(outputs) == mix.output_max
    assert statistics.mean(prompts) > 1.3 * statistics.median(prompts)  # a long right tail
    assert 0.1 < sum(o >= TPOT_MIN_TOKENS for o in outputs) / len(outputs) < 0.5
    again = [mix.draw(random.Random(f"s{i}")) for i in range(2000)]
    assert again == drawn


def test_bodies_are_the_same_for_every_mode_but_the_priority() -> None:
    bodies = Bodies("vllm")
    direct = [orjson.loads(b) for b in bodies.variants("batch", 5, seed=3, direct=True)]
    via = [orjson.loads(b) for b in bodies.variants("batch", 5, seed=3, direct=False)]
    assert [d.pop("priority") for d in direct] == [1] * 5
    assert direct == via
    assert len({b["messages"][0]["content"].split()[0] for b in via}) == 5  # no shared prefix
    assert all(b["ignore_eos"] and "stream" not in b for b in via)
    other = [orjson.loads(b) for b in bodies.variants("batch", 5, seed=4, direct=False)]
    assert other != via


def test_the_unloaded_references_write_exactly_their_tokens_from_prompts_of_their_own() -> None:
    bodies = Bodies("vllm")
    phase = [orjson.loads(b) for b in bodies.variants("interactive", 20, 1, True)]
    long_ = [orjson.loads(b) for b in bodies.variants("interactive", 20, 1, True, TPOT_MIN_TOKENS)]
    assert all(b["max_tokens"] == TPOT_MIN_TOKENS and b["ignore_eos"] for b in long_)
    assert all(b["stream"] for b in long_)
    assert len({b["max_tokens"] for b in phase}) > 1  # the phases keep the mix's lengths
    prompts = {b["messages"][0]["content"] for b in phase}
    assert prompts.isdisjoint(b["messages"][0]["content"] for b in long_)


def test_the_per_token_reference_spreads_a_streams_time_after_its_first_token() -> None:
    result = RoundResult(2, 0, None, 7.0, [520.0, 660.0], 0.1, first_byte_ms=[16.0, 30.0])
    assert per_token_ms(result, 64) == [8.0, 10.0]


def test_below_load_1_the_warm_up_is_shorter_and_overloaded_it_outlasts_every_client() -> None:
    assert QUICK.warm_up_s(0.3) < QUICK.warm_up_s(1.0) < QUICK.warm_up_s(5.0)
    assert FULL.warm_up_s(5.0) == max(client_s for _, client_s in DEADLINES.values())


def test_an_answer_meets_its_class_objective() -> None:
    assert meets(record(90, 900, 20), "interactive", OBJECTIVE)
    assert not meets(record(110, 900, 20), "interactive", OBJECTIVE)  # first token late
    # a long stream is judged on its time per token too: (latency - first) / (tokens - 1)
    assert meets(record(50, 50 + 10 * 99, 100), "interactive", OBJECTIVE)
    assert not meets(record(50, 50 + 11 * 99, 100), "interactive", OBJECTIVE)
    assert not meets(record(50, 5001, 2), "interactive", OBJECTIVE)  # past its deadline
    assert meets(record(9000, 14_000, 16), "batch", OBJECTIVE)
    assert not meets(record(9000, 15_001, 16), "batch", OBJECTIVE)
    assert not meets(record(10, 20, 16, status=503), "batch", OBJECTIVE)


def test_overload_goes_to_the_noisy_tenant() -> None:
    assert offered(0.5) == {"interactive": 0.3, "batch": 0.125, "noisy": 0.075}
    five = offered(5.0)
    assert five["interactive"] == 0.6 and five["batch"] == 0.25
    assert abs(five["noisy"] - 4.15) < 1e-9


def test_slo_goodput_counts_the_window_and_compares_with_bare() -> None:
    records = [
        Record(0, 0.2, 50.0, 500.0, 200, None, False, 10),  # ended before the window
        Record(0, 0.8, 50.0, 500.0, 200, None, False, 10),  # sent before, ended in it
        Record(0, 2.8, 50.0, 500.0, 200, None, False, 10),  # ended after it
        Record(0, 1.5, 150.0, 500.0, 200, None, False, 10),  # first token too late
        Record(1, 1.5, 800.0, 800.0, 200, None, False, 10),
        Record(1, 2.5, 1.0, 1.0, 503, "shed", False, 0),
    ]
    phase = Phase(PhaseResult(records=records), ["interactive", "batch"], (1.0, 3.0))
    assert phase.slo_goodput(OBJECTIVE) == 1.0
    assert phase.slo_goodput(OBJECTIVE, "interactive") == 0.5
    own = {("slo_goodput_rps", k): 1.0 for k in (None, "interactive", "batch")}
    own |= {
        ("output_tokens_per_s", None): 5.0,
        ("in_deadline_tokens_per_s", None): 3.0,
        ("ttft_p50_ms", None): 2.0,
        ("ttft_p99_ms", None): 4.0,
    }
    bare = {key: 2 * value for key, value in own.items()}
    compared = versus_bare(own, bare)
    assert compared[("slo_goodput_ratio_vs_bare", None)] == 0.5
    assert compared[("throughput_ratio_vs_bare", None)] == 0.5
    assert compared[("in_deadline_throughput_ratio_vs_bare", None)] == 0.5
    assert compared[("ttft_p99_ratio_vs_bare", None)] == 0.5


def test_in_deadline_throughput_leaves_out_answers_that_ended_past_their_deadline() -> None:
    """The bare engine's clients wait a second past their deadline, so it finishes answers
    a gateway would have cut there; the in-deadline figure counts neither."""
    records = [
        Record(0, 0.5, 50.0, 4_900.0, 200, None, False, 10),  # interactive, in time
        Record(0, 0.5, 50.0, 5_400.0, 200, None, False, 20),  # interactive, 0.4 s late
        Record(1, 0.5, 50.0, 5_400.0, 200, None, False, 40),  # batch (15 s), in time
        Record(0, 0.5, 50.0, 5_000.0, 200, "stream:deadline_exceeded", False, 80),  # cut
    ]
    phase = Phase(PhaseResult(records=records), ["interactive", "batch"], (5.0, 7.0))
    assert phase.tokens_per_s() == 35.0
    assert phase.tokens_per_s(in_deadline=True) == 25.0
    shown = figures(phase, OBJECTIVE, {"interactive": 1.0, "batch": 1.0, "noisy": 0.0})
    assert shown[("in_deadline_tokens_per_s", None)] == 25.0


def test_the_load_generator_numbers_each_streams_arrivals_and_keeps_bodies_and_urls() -> None:
    stream = StreamSpec("t", None, 20.0, "", False, None, 5.0, variants=["a", "b"])
    spec = PhaseSpec("http://one", 2.0, 3.0, 9, [stream, stream], urls=["http://one", "http://two"])
    plan = _plan(spec)
    for index in (0, 1):
        numbers = [nth for _, i, nth in plan if i == index]
        assert numbers == list(range(len(numbers))) and len(numbers) > 10
    assert [t for t, _, _ in plan] == sorted(t for t, _, _ in plan)
    again = PhaseSpec.from_json(spec.to_json())
    assert again == spec


def test_clients_send_their_deadline_unless_told_not_to_and_give_up_the_same() -> None:
    rates = {"interactive": 2.0, "batch": 1.0, "noisy": 0.0}
    sent = streams(Bodies("fake"), rates, 5.0, 1, direct=False)
    silent = streams(Bodies("fake"), rates, 5.0, 1, direct=False, send_deadlines=False)
    bare = streams(Bodies("fake"), rates, 5.0, 1, direct=True)
    assert [s.tenant for s in sent] == ["interactive", "batch"]  # no stream at rate 0
    assert [s.header_timeout_s for s in sent] == [5.0, 15.0]
    assert [s.header_timeout_s for s in silent] == [None, None]
    assert [s.header_timeout_s for s in bare] == [None, None]
    assert [s.client_timeout_s for s in silent] == [s.client_timeout_s for s in sent]
    assert [s.key for s in bare] == [None, None] and all(s.key for s in sent)


def test_limit_figures_read_the_first_replicas_limiters_from_readyz() -> None:
    def readyz(engine: float, latency: float, phase: str) -> str:
        replica = {
            "mode": "adaptive",
            "engine_limit": engine,
            "latency_limit": latency,
            "latency": {"phase": phase},
        }
        return orjson.dumps({"capacity": {"gpu": {"limit": 9, "replicas": [replica]}}}).decode()

    texts = [readyz(10, 4, "measuring_min"), readyz(20, 8, "probing"), "error: refused"]
    figures = limit_figures([texts])
    assert figures[("engine_limit_mean", None)] == 15
    assert figures[("latency_limit_mean", None)] == 6
    assert figures[("latency_measuring_share", None)] == 0.5
    fixed = orjson.dumps({"capacity": {"gpu": {"replicas": [{"mode": "fixed"}]}}}).decode()
    assert limit_figures([[fixed]]) == {} and limit_figures([]) == {}


def test_the_limit_trace_follows_the_first_gateway_with_the_engine_nearest_in_time() -> None:
    def readyz(limit: int, phase: str) -> str:
        cause = "outgrown" if phase == "measuring_min" else None
        view = {
            "limit": limit,
            "in_flight": 3,
            "queued": 1,
            "replicas": [{"latency": {"phase": phase, "cause": cause}}],
        }
        return orjson.dumps({"capacity": {"gpu": view}}).decode()

    def engine(running: int) -> str:
        lines = [f'vllm:num_requests_running{{engine="0"}} {running}']
        lines.append('vllm:num_requests_waiting{engine="0"} 2')
        return "\n".join(lines) + "\n"

    polls = {
        "readyz-0": [
            (0.5, readyz(8, "measuring_min")),
            (1.0, "error: refused"),
            (1.5, readyz(12, "probing")),
        ],
        "readyz-1": [(0.5, readyz(99, "probing"))],
        "engine": [(0.4, engine(5)), (1.6, engine(11))],
    }
    phase = Phase(PhaseResult(polls=polls), [], (0.0, 2.0))
    rows = limit_trace(phase)
    assert [(r["t_s"], r["limit"], r["latency_phase"], r["latency_cause"]) for r in rows] == [
        (0.5, 8, "measuring_min", "outgrown"),
        (1.5, 12, "probing", None),
    ]
    assert [(r["engine_running"], r["engine_waiting"]) for r in rows] == [(5, 2), (11, 2)]
    assert rows[0]["in_flight"] == 3 and rows[0]["queued"] == 1


def test_the_prefix_hit_rate_is_the_windows_hits_over_its_lookups() -> None:
    def engine(hits: int, queries: int) -> str:
        lines = [f'vllm:prefix_cache_hits_total{{engine="{e}"}} {hits / 2}' for e in (0, 1)]
        lines.append(f'vllm:prefix_cache_queries_total{{engine="0"}} {queries}')
        return "\n".join(lines) + "\n"

    polls = {
        "engine": [
            (0.1, "error: refused"),
            (0.2, engine(100, 1000)),
            (1.5, engine(150, 2000)),
            (2.5, engine(900, 9000)),
        ]
    }
    rate = ("engine_prefix_hit_rate", None)
    phase = Phase(PhaseResult(polls=polls), [], (0.0, 2.0))
    assert load_figures(phase)[rate] == 50 / 1000  # the window's polls, the error skipped
    one = Phase(PhaseResult(polls={"engine": polls["engine"][:2]}), [], (0.0, 2.0))
    assert math.isnan(load_figures(one)[rate])
    assert math.isnan(prefix_hit_rate([]))


def test_late_refusals_are_those_after_a_wait_in_the_queue_of_those_sent_in_the_window() -> None:
    def refused(sent_s: float, code: str, status: int = 503) -> Record:
        return Record(1, sent_s, 5.0, 5.0, status, code, False, 0)

    records = [
        refused(0.5, "overloaded:deadline_slipped"),  # sent before the window
        refused(1.2, "overloaded:deadline_unreachable"),  # at arrival
        refused(1.4, "overloaded:deadline_slipped"),
        refused(1.6, "overloaded:deadline_passed"),
        refused(1.8, "rate_limit_exceeded", 429),  # a quota: at arrival
        Record(0, 1.9, 50.0, 500.0, 200, None, False, 10),
    ]
    phase = Phase(PhaseResult(records=records), ["interactive", "batch"], (1.0, 3.0))
    out = figures(phase, OBJECTIVE, {"interactive": 1.0, "batch": 1.0, "noisy": 1.0})
    assert out[("refused_share", None)] == 4 / 5
    assert out[("refused_late_share", None)] == 2 / 4
    assert out[("refused_at_deadline_share", None)] == 1 / 4
    # By class: stream 1 is the batch tenant's; the interactive answer was not refused.
    assert out[("refused_share", "batch")] == 4 / 4
    assert out[("refused_at_deadline_share", "batch")] == 1 / 4
    assert out[("refused_share", "interactive")] == 0.0
    assert math.isnan(out[("refused_late_share", "interactive")])


def test_load_1_is_judged_against_both_bare_phases_and_their_spread_is_printed() -> None:
    """The bare engine's load-1 output moved by 17% between phases of the same arrivals, so
    a full run takes it twice, before and after the gateway modes, and judges against the
    mean."""
    tokens = ("output_tokens_per_s", None)
    results = {
        (7, "bare", 1.0): {tokens: 600.0},
        (7, "adaptive-metrics", 1.0): {tokens: 630.0},
        (7, "adaptive-latency", 0.3): {tokens: 200.0},  # no load-1 phase: no ratio
    }
    again = {tokens: 660.0}
    assert bare_again_ratio(results[(7, "bare", 1.0)], again) == 1.1
    pooled = pooled_throughput_ratios(results, 7, ["adaptive-metrics", "adaptive-latency"], again)
    assert pooled == {"adaptive-metrics": 1.0}  # 630 / mean(600, 660); 1.05 against the first
    assert FULL.bare_again and not QUICK.bare_again


def test_the_load_1_target_takes_both_bare_phases_where_the_run_has_them() -> None:
    medians = {"throughput_ratio_vs_bare": 0.9, POOLED: 0.97}
    assert load1_throughput(lambda load, metric: medians[metric]) == 0.97
    medians[POOLED] = math.nan  # a quick run: bare at load 1 once
    assert load1_throughput(lambda load, metric: medians[metric]) == 0.9


class _Order(Bench):
    """Bench's driver with every phase replaced by a note of it."""

    def __init__(self, plan: Plan) -> None:
        run = Run(5, "fake", 1, False, "sent", None)
        super().__init__(plan, "fake", Path("."), run, ["bare", "adaptive-metrics", "fixed"])
        self.steps: list[tuple[str, int, str]] = []

    def find_bound(self) -> dict[str, Any]:
        self.bound = 10.0
        return {}

    def objective(self, run: Run) -> Objective:
        return OBJECTIVE

    def mode_phases(self, run: Run, objective: Objective, mode: str) -> None:
        self.steps.append(("phases", run.seed, mode))

    def warm_gateways(self, run: Run, mode: str) -> None:
        self.steps.append(("warm", run.seed, mode))
        super().warm_gateways(run, mode)  # a plan without a warm-up: returns at once

    def bare_again(self, run: Run, objective: Objective) -> None:
        self.steps.append(("bare again", run.seed, "bare"))


def test_a_full_run_warms_a_gateway_once_before_its_first_gateway_mode() -> None:
    """The first gateway mode of a run did worse at load 1 than the next in six runs of
    six, so a full run sends load 1 through a gateway of that mode first, measured by
    nothing; once a run, and bare's load 1 again after each seed's modes."""
    bench = _Order(replace(FULL, gateway_warm_s=0.0))
    bench.measure(repeats=2)
    first, second = bench.mode_order(bench.run)[1], bench.mode_order(replace(bench.run, seed=6))
    assert bench.steps == [
        ("phases", 5, "bare"),
        ("warm", 5, first),
        *[("phases", 5, m) for m in bench.mode_order(bench.run)[1:]],
        ("bare again", 5, "bare"),
        *[("phases", 6, m) for m in second],
        ("bare again", 6, "bare"),
    ]
    assert FULL.gateway_warm_s >= FULL.warm_s + FULL.window_s  # a whole load-1 phase
    assert QUICK.gateway_warm_s == 0.0


def test_a_mode_and_its_ablations_run_one_after_the_other_in_a_seeded_order() -> None:
    """With `--ablate`, each adaptive mode's ablations run next to it (the machine's
    speed drifts within a run), the groups and the order within each drawn from the
    seed; without, the order is the one every earlier seed was run in."""
    modes = ["bare", "adaptive-metrics", "adaptive-latency"]
    ablated = [f"{m}{ABLATED}{c}" for m in modes[1:] for c in ("pacing", "prefill_gate")]
    orders = set()
    for seed in range(20):
        run = Run(seed, "fake", 1, False, "sent", None)
        plain = Bench(QUICK, "fake", Path("."), run, modes).mode_order(run)
        legacy = modes[1:]
        random.Random(f"{seed}/order").shuffle(legacy)
        assert plain == ["bare", *legacy]
        order = Bench(QUICK, "fake", Path("."), run, modes + ablated).mode_order(run)
        assert order == Bench(QUICK, "fake", Path("."), run, modes + ablated).mode_order(run)
        assert order[0] == "bare" and sorted(order[1:]) == sorted(modes[1:] + ablated)
        bases = [m.partition(ABLATED)[0] for m in order[1:]]
        assert bases[:3] == [bases[0]] * 3 and bases[3:] == [bases[3]] * 3
        orders.add(tuple(order))
    assert len(orders) > 4  # drawn, not fixed
