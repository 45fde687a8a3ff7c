"""Creating API keys, and the keys declared in configuration."""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Mapping
from typing import TextIO

from gateway.settings import AdminSettings, ConfigError, DeclaredKey, Settings, Tenant, hash_key
from gateway.tenancy.auth import Principal
from gateway.tenancy.state import KeyRecord, StateStore

KEY_PREFIX = "sk-gw-"
ADMIN_KEY_ENV = "GATEWAY_ADMIN_KEY"
OPERATOR_KEY_ENV = "GATEWAY_OPERATOR_KEY"  # reads /metrics (gateway/tenancy/operators.py)

# The shortest admin or operator key the gateway starts with: one a person made up is
# guessable, and the keys it makes are 38 characters (`new_key`).
MIN_KEY_CHARS = 32
# Keys anyone tries first (one of them shipped in an example configuration once): refused
# as any key declared in configuration, given by digest or in the environment.
_GUESSED = (
    "",
    "test",
    "testing",
    "password",
    "secret",
    "admin",
    "changeme",
    "change-me",
    "demo",
    "example",
    "key",
    "apikey",
    "api-key",
    "token",
    "default",
    "gateway",
    "letmein",
    "123456",
    "12345678",
    "qwerty",
    "sk-test",
)
GUESSED_DIGESTS = frozenset(hash_key(key) for key in _GUESSED)


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(24)


def key_id_for(key_hash: str) -> str:
    """A public handle for a key (to list and revoke it); derived from the hash, not the key."""
    return "key_" + key_hash[:12]


def config_key_id(key_hash: str) -> str:
    """The public handle of a key declared in config (the admin API lists it too)."""
    return "cfg_" + key_hash[:12]


async def create_key(store: StateStore, tenant: str) -> tuple[str, KeyRecord]:
    key = new_key()
    key_hash = hash_key(key)
    record = KeyRecord(key_id_for(key_hash), tenant, time.time())
    await store.put_key(key_hash, record)
    return key, record


def configured_keys(
    tenants: list[Tenant], environ: Mapping[str, str], announce: TextIO = sys.stderr
) -> dict[str, Principal]:
    """Key hash → principal for keys declared in config; generates missing demo keys."""
    found: dict[str, Principal] = {}
    for tenant in tenants:
        for declared in tenant.keys:
            key_hash = _declared_hash(declared, f"tenant {tenant.name!r}", environ, announce)
            if key_hash is not None:
                found[key_hash] = Principal(tenant.name, config_key_id(key_hash))
    return found


def declared_key_ids(tenants: list[Tenant], environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(tenant, key id) for each key declared in config, generating none: the id the gateway
    gives the key (`cfg_` and 12 hex digits of its digest), or `$VAR` for a key read from an
    environment variable that is unset here (a gateway with `generate: true` makes its own)."""
    found: list[tuple[str, str]] = []
    for tenant in tenants:
        for declared in tenant.keys:
            if declared.sha256 is not None:
                found.append((tenant.name, config_key_id(declared.sha256)))
            elif declared.env is not None and environ.get(declared.env):
                found.append((tenant.name, config_key_id(hash_key(environ[declared.env]))))
            elif declared.env is not None:
                found.append((tenant.name, "$" + declared.env))
    return found


def admin_key_hashes(
    admin: AdminSettings, environ: Mapping[str, str], announce: TextIO = sys.stderr
) -> frozenset[str]:
    """Hashes of the admin keys: declared in `admin.keys`, and $GATEWAY_ADMIN_KEY if set."""
    found = {_declared_hash(d, "the admin API", environ, announce) for d in admin.keys}
    if environ.get(ADMIN_KEY_ENV):
        found.add(hash_key(environ[ADMIN_KEY_ENV]))
    return frozenset(h for h in found if h is not None)


def _declared_hash(
    declared: DeclaredKey, owner: str, environ: Mapping[str, str], announce: TextIO
) -> str | None:
    if declared.sha256 is not None:
        return declared.sha256
    assert declared.env is not None
    key = environ.get(declared.env, "")
    if key:
        return hash_key(key)
    if not declared.generate:
        return None
    key = new_key()
    # Printed once, on purpose, to the operator's terminal: it is never written to the log.
    print(
        f"\n  {declared.env} is not set; generated a key for {owner}:\n\n"
        f"    export {declared.env}={key}\n",
        file=announce,
        flush=True,
    )
    return hash_key(key)


def refuse_weak_keys(settings: Settings, environ: Mapping[str, str]) -> None:
    """Raises ConfigError naming every weak key the gateway would start with: an admin or
    operator key under MIN_KEY_CHARS characters (where the environment gives it, so its
    length is known), or any configured key whose digest is of a well-known key."""
    admin = settings.admin
    problems = [
        *_weak_declared(admin.keys, "admin.keys", environ, strict=True),
        *_weak_declared(admin.operator_keys, "admin.operator_keys", environ, strict=True),
        *(_weak_key(environ.get(name, ""), f"${name}", strict=True) for name in _SERVICE_ENVS),
    ]
    for i, tenant in enumerate(settings.tenants):
        problems += _weak_declared(tenant.keys, f"tenants.{i}.keys", environ, strict=False)
    found = [problem for problem in problems if problem is not None]
    if found:
        raise ConfigError(
            "refusing to start with weak keys (make one with `gateway keys create` or "
            "`openssl rand -base64 32`): " + "; ".join(found)
        )


_SERVICE_ENVS = (ADMIN_KEY_ENV, OPERATOR_KEY_ENV)


def _weak_declared(
    declared: list[DeclaredKey], where: str, environ: Mapping[str, str], *, strict: bool
) -> list[str | None]:
    found: list[str | None] = []
    for i, key in enumerate(declared):
        if key.sha256 is not None and key.sha256 in GUESSED_DIGESTS:
            found.append(f"{where}.{i}.sha256 is the digest of a well-known key")
        elif key.env is not None and environ.get(key.env):
            found.append(_weak_key(environ[key.env], f"{where}.{i} (${key.env})", strict=strict))
    return found


def _weak_key(key: str, where: str, *, strict: bool) -> str | None:
    """Why `key` is weak, or None; an unset (empty) key is no key at all, and not weak."""
    if not key:
        return None
    if hash_key(key) in GUESSED_DIGESTS:
        return f"{where} is a well-known key"
    if strict and len(key) < MIN_KEY_CHARS:
        return f"{where} has {len(key)} characters, fewer than {MIN_KEY_CHARS}"
    return None
