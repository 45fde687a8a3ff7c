"""Every metric of the request path's table is updated by its own method, under its name
and with its labels (the table is read by string keys: a wrong key fails here, not in a
request)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import Metrics


def test_every_method_updates_its_own_family_with_its_labels() -> None:
    m = Metrics()
    m.request_done("chat", "t", "m", 200, 0.1)
    m.upstream_done("b", 0.2)
    m.upstream_error("b", "timeout")
    m.retried("b", "status")
    m.queue_waited("b", "batch", 0.3)
    m.quota_rejected("t", "rpm")
    m.quota_fallback("local_share")
    m.tokens("t", 3, 4)
    m.cache_lookup("t", "m", "hit", "exact")
    m.cache_stage("embed", 0.004)
    m.cache_fail_open("budget")
    m.cache_deleted("t", "admin")
    m.cache_explored("t", "agreed")
    m.cache_coalesced("t")
    m.model_fallback("m", "f", "failing")
    m.degraded("t", "m", "max_tokens")
    m.prompt_size_routed("m", "long")
    m.cache_bad_hit_label("t", labelled=True)
    m.on_cold_start("b")
    m.on_phase("b", "total", 5.0)
    m.events_dropped("requests", "buffer_full", 2)
    m.in_flight = 7
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(m.exposition().decode())
        for sample in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("gateway_requests_total", tenant="t", model="m", status="200") == 1
    assert value("gateway_request_duration_seconds_count", route="chat") == 1
    assert value("gateway_upstream_duration_seconds_sum", backend="b") == 0.2
    assert value("gateway_upstream_errors_total", backend="b", kind="timeout") == 1
    assert value("gateway_retries_total", backend="b", reason="status") == 1
    assert value("gateway_queue_wait_seconds_count", backend="b", **{"class": "batch"}) == 1
    assert value("gateway_quota_rejections_total", tenant="t", reason="rpm") == 1
    assert value("gateway_quota_fallbacks_total", decision="local_share") == 1
    assert value("gateway_tokens_total", tenant="t", kind="prompt") == 3
    assert value("gateway_tokens_total", tenant="t", kind="completion") == 4
    lookup = {"tenant": "t", "model": "m", "result": "hit", "tier": "exact"}
    assert value("gateway_cache_lookups_total", **lookup) == 1
    assert value("gateway_cache_lookup_seconds_count", stage="embed") == 1
    assert value("gateway_cache_fail_open_total", reason="budget") == 1
    assert value("gateway_cache_deleted_entries_total", tenant="t", cause="admin") == 1
    assert value("gateway_cache_explores_total", tenant="t", outcome="agreed") == 1
    assert value("gateway_cache_coalesced_total", tenant="t") == 1
    fallback = {"model": "m", "fallback": "f", "reason": "failing"}
    assert value("gateway_model_fallbacks_total", **fallback) == 1
    assert value("gateway_degraded_total", tenant="t", model="m", action="max_tokens") == 1
    assert value("gateway_prompt_size_routed_total", model="m", backend="long") == 1
    assert value("gateway_cache_bad_hit_labels_total", tenant="t", labelled="yes") == 1
    assert value("gateway_cold_starts_total", backend="b") == 1
    assert value("gateway_cold_start_seconds_sum", backend="b", phase="total") == 5.0
    assert value("gateway_events_dropped_total", kind="requests", reason="buffer_full") == 2
    assert value("gateway_requests_in_flight") == 7
