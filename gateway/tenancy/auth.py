"""API key → tenant.

A key is looked up by its SHA-256, so the secret itself is never compared byte by byte
(no timing signal) and never stored. Answers from the state store are cached for
`cache_ttl_s` (under a second), which bounds how long a revoked key keeps working on
any replica. While the store is unreachable, answers cached in the last `stale_grace_s`
are still used; keys never seen before get 503, not 401.

Admin keys (`AdminAuthenticator`) are a separate set, looked up the same way: a tenant key
on an admin route gets 403, an admin key on an OpenAI route 401 (it is no tenant's key).
"""

from __future__ import annotations

import hmac
import time
from collections import OrderedDict
from dataclasses import dataclass

from gateway.errors import GatewayError, StateUnavailable, Unauthenticated
from gateway.settings import hash_key
from gateway.tenancy.state import StateStore, StateStoreError

# Bounds of the answers kept (LRU): every key a deployment has, and recent unknown keys.
KNOWN_KEYS = 100_000
UNKNOWN_KEYS = 10_000


@dataclass(frozen=True)
class Principal:
    tenant: str
    key_id: str


class Authenticator:
    def __init__(
        self,
        store: StateStore,
        static_keys: dict[str, Principal],
        cache_ttl_s: float = 0.5,
        stale_grace_s: float = 60.0,
    ) -> None:
        self._store = store
        self._static = static_keys
        self._ttl = cache_ttl_s
        self._grace = stale_grace_s
        # Answers by key hash, least recently used first. Unknown keys apart from known
        # ones: a flood of random keys then only turns the unknown keys' cache over, and
        # cannot push out (or, as a plain cap would, clear) the keys tenants use.
        self._known: OrderedDict[str, tuple[float, Principal | None]] = OrderedDict()
        self._unknown: OrderedDict[str, tuple[float, Principal | None]] = OrderedDict()

    async def authenticate(self, authorization: str | None) -> Principal:
        key = _bearer(authorization)
        key_hash = hash_key(key)
        principal = self._static.get(key_hash) or await self._lookup(key_hash)
        if principal is None:
            raise Unauthenticated("Incorrect API key provided.")
        return principal

    async def _lookup(self, key_hash: str) -> Principal | None:
        now = time.monotonic()
        cached = self._cached(key_hash)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        try:
            record = await self._store.get_key(key_hash)
        except StateStoreError as exc:
            if cached is not None and now - cached[0] < self._grace:
                return cached[1]
            raise StateUnavailable(
                "The key store is unreachable; try again shortly.", retry_after=1
            ) from exc
        principal = None if record is None else Principal(record.tenant, record.key_id)
        self._remember(key_hash, (now, principal))
        return principal

    def _cached(self, key_hash: str) -> tuple[float, Principal | None] | None:
        for cache in (self._known, self._unknown):
            cached = cache.get(key_hash)
            if cached is not None:
                cache.move_to_end(key_hash)
                return cached
        return None

    def _remember(self, key_hash: str, answer: tuple[float, Principal | None]) -> None:
        known = answer[1] is not None
        cache, other = (self._known, self._unknown) if known else (self._unknown, self._known)
        other.pop(key_hash, None)  # a key created or revoked since its last answer
        cache[key_hash] = answer
        cache.move_to_end(key_hash)
        if len(cache) > (KNOWN_KEYS if known else UNKNOWN_KEYS):
            cache.popitem(last=False)


class AdminDisabled(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "admin_disabled"


class AdminKeyRequired(GatewayError):
    status = 403
    type = "permission_error"
    code = "admin_key_required"


class AdminAuthenticator:
    def __init__(self, admin_hashes: frozenset[str], tenants: Authenticator) -> None:
        self._hashes = admin_hashes
        self._tenants = tenants

    async def authenticate(self, authorization: str | None) -> None:
        if not self._hashes:
            # Never open: without a configured admin key there is no admin API at all.
            raise AdminDisabled(
                "The admin API is disabled: configure admin.keys or set GATEWAY_ADMIN_KEY."
            )
        if hash_key(_bearer(authorization)) in self._hashes:
            return
        await self._tenants.authenticate(authorization)  # unknown key: 401
        raise AdminKeyRequired("This is a tenant key; the admin API needs an admin key.")


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthenticated(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'."
        )
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if not hmac.compare_digest(scheme.lower().encode(), b"bearer") or not key:
        raise Unauthenticated("Malformed Authorization header; expected 'Bearer YOUR_KEY'.")
    return key
