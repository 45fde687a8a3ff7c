"""The per-tenant opt-in to error-bounded hits: parsed, validated, and kept by the tenant
store's JSON round trip; per-entry evidence is refused with a message saying why."""

from __future__ import annotations

import pytest

from gateway.config_file import parse_settings
from gateway.settings import ConfigError, ErrorBound, TenantProfile

CONFIG = """\
backends:
  - name: up
    base_url: http://127.0.0.1:9/v1
    models: [m1]
tenants:
  - name: t1
  - name: t2
    cache_error_bound: {delta: 0.02}
"""


def test_off_unless_a_tenant_opts_in() -> None:
    settings = parse_settings(CONFIG, "c.yaml", {})
    first, second = settings.tenants
    assert first.cache_error_bound is None
    assert second.cache_error_bound == ErrorBound(delta=0.02, scope="namespace")


@pytest.mark.parametrize(
    ("bound", "expected"),
    [
        ("{delta: 0}", "tenants.1.cache_error_bound.delta"),
        ("{delta: 0.5}", "tenants.1.cache_error_bound.delta"),
        ("{}", "tenants.1.cache_error_bound.delta"),
        ("{delta: 0.01, scope: tenant}", "tenants.1.cache_error_bound.scope"),
        ("{delta: 0.01, scope: entry}", "scope 'entry' is not supported yet"),
    ],
)
def test_a_bad_bound_names_its_key(bound: str, expected: str) -> None:
    text = CONFIG.replace("{delta: 0.02}", bound)
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        parse_settings(text, "c.yaml", {})


def test_survives_the_tenant_store_round_trip() -> None:
    profile = TenantProfile(name="t", cache_error_bound=ErrorBound(delta=0.01))
    stored = profile.model_dump(mode="json")
    assert TenantProfile.model_validate(stored) == profile
    assert TenantProfile.model_validate({"name": "old"}).cache_error_bound is None
