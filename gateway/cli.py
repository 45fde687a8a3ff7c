"""`gateway` command line: serve, check a configuration, manage API keys."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from gateway.config_file import load_settings
from gateway.settings import ConfigError, Settings
from gateway.state import StateStoreError

DEFAULT_CONFIG = "gateway.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load_settings(Path(args.config), os.environ)
        return int(args.run(settings, args))
    except ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    except StateStoreError as exc:
        print(f"gateway: state store: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument(
        "--config",
        default=os.environ.get("GATEWAY_CONFIG", DEFAULT_CONFIG),
        help="YAML configuration (default: $GATEWAY_CONFIG or gateway.yaml)",
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
    listing = keys.add_parser("list", parents=[config], help="list keys (ids, never the keys)")
    listing.set_defaults(run=_keys_list)
    revoke = keys.add_parser("revoke", parents=[config], help="revoke a key by its id")
    revoke.add_argument("key_id")
    revoke.set_defaults(run=_keys_revoke)
    return parser


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.server import serve

    host = args.host or settings.listen.host
    port = args.port if args.port is not None else int(os.environ.get("PORT", settings.listen.port))
    return serve(settings, host, port)


def _check(settings: Settings, args: argparse.Namespace) -> int:
    models = ", ".join(settings.model_names())
    print(
        f"{args.config}: ok ({len(settings.backends)} backends: {models}; "
        f"{len(settings.tenants)} tenants)"
    )
    return 0


def _stage(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.staging import stage_by_hand

    return asyncio.run(stage_by_hand(settings, args.model))


def _keys_create(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.app import open_state_store
    from gateway.keys import create_key

    if args.tenant not in {t.name for t in settings.tenants}:
        known = ", ".join(t.name for t in settings.tenants) or "none"
        print(f"gateway: unknown tenant {args.tenant!r} (configured: {known})", file=sys.stderr)
        return 2

    async def run() -> str:
        store = open_state_store(settings)
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
    from gateway.app import open_state_store

    async def run() -> None:
        store = open_state_store(settings)
        try:
            records = await store.list_keys()
        finally:
            await store.close()
        print(f"{'KEY ID':<18} {'TENANT':<24} CREATED")
        for r in records:
            created = datetime.fromtimestamp(r.created_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            print(f"{r.key_id:<18} {r.tenant:<24} {created}")

    asyncio.run(run())
    return 0


def _keys_revoke(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.app import open_state_store

    async def run() -> bool:
        store = open_state_store(settings)
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
