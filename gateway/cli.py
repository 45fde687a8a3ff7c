"""`gateway` command line: serve, check a configuration, manage API keys, reports, and
pre-warm a backend of a running gateway (through its admin API)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from common.redis_client import RedisFactory
from gateway.cli_reports import report_parsers
from gateway.config_file import load_settings
from gateway.settings import Backend, ConfigError, Settings
from gateway.tenancy.state import KeyRecord, StateStoreError

if TYPE_CHECKING:
    pass

DEFAULT_CONFIG = "gateway.yaml"
CONFIG_ENV = "GATEWAY_CONFIG"
_CONFIG_HINT = (
    f"name the configuration with --config FILE or ${CONFIG_ENV} "
    "(the demo's, from the repository root: --config config/demo.yaml)"
)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load_settings(Path(args.config), os.environ)
        return int(args.run(settings, args))
    except ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        if not Path(args.config).exists():
            print(f"gateway: {_CONFIG_HINT}", file=sys.stderr)
        return 2
    except StateStoreError as exc:
        print(f"gateway: state store: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument(
        "--config",
        default=os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG,
        help=f"YAML configuration (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG})",
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", parents=[config], help="run the gateway")
    serve.add_argument("--host", help="listen address (overrides listen.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides $PORT and listen.port)")
    serve.set_defaults(run=_serve)

    check = commands.add_parser("check", parents=[config], help="validate the configuration")
    check.set_defaults(run=_check)

    stage = commands.add_parser(
        "stage", parents=[config], help="stage a model's weights to local disk, with progress"
    )
    stage.add_argument("model", help="a model served by a backend that declares `weights`")
    stage.set_defaults(run=_stage)

    keys = commands.add_parser("keys", help="manage API keys").add_subparsers(
        required=True, metavar="ACTION"
    )
    create = keys.add_parser("create", parents=[config], help="create a key; printed once")
    create.add_argument("--tenant", required=True)
    create.set_defaults(run=_keys_create)
    listing = keys.add_parser(
        "list", parents=[config], help="list keys, stored and from the config (ids, never keys)"
    )
    listing.set_defaults(run=_keys_list)
    revoke = keys.add_parser("revoke", parents=[config], help="revoke a key by its id")
    revoke.add_argument("key_id")
    revoke.set_defaults(run=_keys_revoke)
    report_parsers(commands, config, _redis)
    _warm_parser(commands, config)
    return parser


def _warm_parser(commands: Any, config: argparse.ArgumentParser) -> None:
    warm = commands.add_parser(
        "warm", parents=[config], help="start a backend's replicas now, ahead of known traffic"
    )
    warm.add_argument("backend", help="a process or kubernetes backend's name")
    warm.add_argument("--replicas", type=int, default=1, help="keep at least this many (1)")
    warm.add_argument("--hold", type=float, help="for this many seconds (scaling.idle_s)")
    warm.add_argument(
        "--url",
        default=os.environ.get("GATEWAY_URL"),
        help="the running gateway (default: $GATEWAY_URL, else listen.host and port)",
    )
    warm.set_defaults(run=_warm)

    cache = commands.add_parser("cache", help="the semantic cache").add_subparsers(
        required=True, metavar="ACTION"
    )
    calibrate = cache.add_parser(
        "calibrate",
        parents=[config],
        help="choose cache.embedder_endpoint's similarity threshold on labelled pairs",
    )
    calibrate.add_argument(
        "--pairs", required=True, type=Path, help='JSON lines {"a", "b", "duplicate"}'
    )
    calibrate.add_argument(
        "--precision", type=float, default=0.95, help="the hits' precision to reach (0.95)"
    )
    calibrate.set_defaults(run=_calibrate)


def _redis(settings: Settings) -> RedisFactory:
    """The Redis clients of a command: each command is its own composition root."""
    return RedisFactory(settings.state.url, name="gateway-cli")


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.batches.blobs import refuse_unshared_blobs
    from gateway.server import serve
    from gateway.tenancy.keys import refuse_weak_keys

    refuse_weak_keys(settings, os.environ)  # before anything listens
    refuse_unshared_blobs(settings)
    _refuse_tracing_protocol(settings)
    host = args.host or settings.listen.host
    port = args.port if args.port is not None else int(os.environ.get("PORT", settings.listen.port))
    return serve(settings, host, port, str(args.config))


def _check(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.batches.blobs import refuse_unshared_blobs

    refuse_unshared_blobs(settings)
    _refuse_tracing_protocol(settings)
    models = ", ".join(settings.model_names())
    print(
        f"{args.config}: ok ({len(settings.backends)} backends: {models}; "
        f"{len(settings.tenants)} tenants)"
    )
    return 0


def _calibrate(settings: Settings, args: argparse.Namespace) -> int:
    """Writes the calibration of the configured embedder endpoint next to the cache."""
    from cache.calibration import calibrate, read_pairs
    from cache.remote_embedder import RemoteEmbedderError, RemoteEncoder

    endpoint = settings.cache.embedder_endpoint
    if endpoint is None:
        raise ConfigError(
            "cache.embedder_endpoint is not set: the packaged MiniLM's decision ships "
            "calibrated; calibrate names the endpoint's embedder"
        )
    if not 0 < args.precision <= 1:
        raise ConfigError("--precision: a share between 0 and 1")
    key = endpoint.api_key.get_secret_value() if endpoint.api_key else None
    try:
        pairs = read_pairs(args.pairs)
        encoder = RemoteEncoder(endpoint.base_url, endpoint.model, key, endpoint.timeout_s * 10)
        found = calibrate(pairs, encoder, encoder.identity, args.precision)
    except (OSError, ValueError, RemoteEmbedderError) as exc:
        print(f"gateway: calibrate: {exc}", file=sys.stderr)
        return 1
    path = settings.cache.calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(found.to_json())
    if found.threshold is None:
        print(
            f"no threshold reaches precision {args.precision} on {found.pairs} pairs: the "
            f"semantic tier stays off for {endpoint.model} ({path})"
        )
        return 1
    print(
        f"{endpoint.model}: threshold {found.threshold:.4f}, precision {found.precision}, "
        f"recall {found.recall} on {found.pairs} pairs ({found.duplicates} duplicates); "
        f"written to {path}; restart the gateway to use it"
    )
    return 0


def _refuse_tracing_protocol(settings: Settings) -> None:
    """Traces asked for over a protocol the gateway cannot export: a config error, before
    anything listens."""
    from gateway.tracing import TracingConfigError, TracingOptions, check_protocol, wanted

    options = TracingOptions(settings.tracing.enabled, settings.tracing.endpoint)
    if not wanted(options, os.environ):
        return
    try:
        check_protocol(os.environ)
    except TracingConfigError as exc:
        raise ConfigError(str(exc)) from exc


def _warm(settings: Settings, args: argparse.Namespace) -> int:
    key = _admin_key(settings)
    if key is None:
        print(
            'gateway: set $GATEWAY_ADMIN_KEY to an admin key (README "Admin API")', file=sys.stderr
        )
        return 2
    base = (args.url or _listen_url(settings)).rstrip("/")
    if not base.startswith(("http://", "https://")):
        print(f"gateway: --url must be an http(s) URL, not {base!r}", file=sys.stderr)
        return 2
    order: dict[str, Any] = {"replicas": args.replicas}
    if args.hold is not None:
        order["hold_s"] = args.hold
    url = f"{base}/admin/backends/{quote(args.backend, safe='')}/warm"
    try:
        status, answer = _post_json(url, order, key)
    except OSError as exc:  # refused, unreachable, timed out
        print(f"gateway: cannot reach {base}: {exc}", file=sys.stderr)
        return 1
    if status != 202:
        message = answer.get("error", {}).get("message", "no error message")
        print(f"gateway: {status}: {message}", file=sys.stderr)
        return 1
    until = datetime.fromtimestamp(answer["until"], UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    print(
        f"{answer['backend']}: at least {answer['replicas']} ready until {until} "
        f"(ready {answer['ready']}, target {answer['target']}: {answer['reason']})"
    )
    return 0


def _admin_key(settings: Settings) -> str | None:
    """$GATEWAY_ADMIN_KEY, else the first admin key the configuration reads from a variable."""
    names = ["GATEWAY_ADMIN_KEY", *(k.env for k in settings.admin.keys if k.env)]
    return next((os.environ[name] for name in names if os.environ.get(name)), None)


def _listen_url(settings: Settings) -> str:
    host = settings.listen.host
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    port = int(os.environ.get("PORT", settings.listen.port))
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _post_json(url: str, body: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
    import json
    import urllib.error
    import urllib.request

    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    # The caller checked the scheme: http(s) only, never file: or others.
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return int(response.status), _json_object(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _json_object(exc.read())


def _json_object(raw: bytes) -> dict[str, Any]:
    import json

    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _stage(settings: Settings, args: argparse.Namespace) -> int:
    return asyncio.run(_stage_by_hand(settings, args.model))


async def _stage_by_hand(settings: Settings, model: str) -> int:
    from gateway.compose.pools import build_stager
    from warmpool.errors import StagingError
    from warmpool.progress import stage_with_progress

    backend = _backend_for_weights(settings, model)
    if backend is None or backend.weights is None:
        print(f"gateway: no backend declares weights for model {model!r}", file=sys.stderr)
        return 2
    try:
        async with build_stager(settings) as stager:
            if backend.weights.staged == "always":
                stager.pin(backend.name)
            staged = await stage_with_progress(stager, backend.name, backend.weights.uri)
    except StagingError as exc:
        print(f"gateway: staging {model} failed: {exc}", file=sys.stderr)
        return 1
    print(staged.path)
    return 0


def _backend_for_weights(settings: Settings, model: str) -> Backend | None:
    for backend in settings.backends:
        if backend.weights is not None and (model in backend.models or model == backend.name):
            return backend
    return None


def _keys_create(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.compose import open_state_store
    from gateway.tenancy.keys import create_key

    if args.tenant not in {t.name for t in settings.tenants}:
        known = ", ".join(t.name for t in settings.tenants) or "none"
        print(f"gateway: unknown tenant {args.tenant!r} (configured: {known})", file=sys.stderr)
        return 2

    async def run() -> str:
        store = open_state_store(settings, _redis(settings))
        try:
            key, record = await create_key(store, args.tenant)
        finally:
            await store.close()
        print(
            f"created {record.key_id} for tenant {record.tenant}; the key is shown only once:",
            file=sys.stderr,
        )
        return key

    print(asyncio.run(run()))
    return 0


def _keys_list(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.compose import open_state_store
    from gateway.tenancy.keys import declared_key_ids

    async def run() -> list[KeyRecord]:
        store = open_state_store(settings, _redis(settings))
        try:
            return await store.list_keys()
        finally:
            await store.close()

    records = asyncio.run(run())
    print(f"{'KEY ID':<18} {'TENANT':<24} {'SOURCE':<7} CREATED")
    for tenant, key_id in declared_key_ids(settings.tenants, os.environ):
        print(f"{key_id:<18} {tenant:<24} {'config':<7} -")
    for r in records:
        created = datetime.fromtimestamp(r.created_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        print(f"{r.key_id:<18} {r.tenant:<24} {'stored':<7} {created}")
    return 0


def _keys_revoke(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.compose import open_state_store
    from gateway.tenancy.keys import declared_key_ids

    for tenant, key_id in declared_key_ids(settings.tenants, os.environ):
        if key_id == args.key_id:
            print(
                f"gateway: {key_id} is declared in the configuration (tenant {tenant}); "
                "remove it there",
                file=sys.stderr,
            )
            return 1

    async def run() -> bool:
        store = open_state_store(settings, _redis(settings))
        try:
            return await store.revoke_key(args.key_id)
        finally:
            await store.close()

    if not asyncio.run(run()):
        print(f"gateway: no key with id {args.key_id!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.key_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
