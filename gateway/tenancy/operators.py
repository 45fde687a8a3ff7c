"""Who may read the gateway's operational pages: `/metrics` (every tenant's traffic by
name) and `/readyz`'s details (backends, replica URLs, learned capacity).

Not the public: an operator key (`admin.operator_keys`, or $GATEWAY_OPERATOR_KEY), as a
Prometheus scraper holds, or an admin key. Plain `/readyz` answers its status to anyone,
for load balancers and kubelet probes, which send no key.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from gateway.settings import AdminSettings, hash_key
from gateway.tenancy.keys import ADMIN_KEY_ENV, admin_key_hashes

OPERATOR_KEY_ENV = "GATEWAY_OPERATOR_KEY"


def operator_key_hashes(admin: AdminSettings, environ: Mapping[str, str]) -> frozenset[str]:
    """Hashes of the operator keys: declared in `admin.operator_keys` (read as admin keys
    are), and $GATEWAY_OPERATOR_KEY if set. Admin keys are not among them (`Operators`)."""
    others = {name: value for name, value in environ.items() if name != ADMIN_KEY_ENV}
    found = set(admin_key_hashes(AdminSettings(keys=admin.operator_keys), others))
    if environ.get(OPERATOR_KEY_ENV):
        found.add(hash_key(environ[OPERATOR_KEY_ENV]))
    return frozenset(found)


class Operators:
    """The keys that read the operational pages: operator keys and admin keys."""

    def __init__(self, hashes: frozenset[str]) -> None:
        self._hashes = hashes

    def allows(self, authorization: str | None) -> bool:
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if not key or not hmac.compare_digest(scheme.lower().encode(), b"bearer"):
            return False
        return hash_key(key) in self._hashes
