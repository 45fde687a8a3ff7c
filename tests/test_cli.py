"""The `gateway` CLI as a user meets it: the README's examples against the demo configuration,
`make run`'s hint, where the configuration comes from, and `keys list` with configured keys."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from bench.processes import ROOT
from common.redis_client import redacted_url
from tests.conftest import GatewayFactory, hash_of

VENV_BIN = Path(sys.executable).parent
GATEWAY = VENV_BIN / "gateway"


def _env(**extra: str) -> dict[str, str]:
    """The environment minus what would pick the configuration or the demo's state for us."""
    drop = {"GATEWAY_CONFIG", "GATEWAY_DATA_DIR", "GATEWAY_DEMO_KEY", "MAKEFLAGS", "MAKELEVEL"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _gateway(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GATEWAY), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )


def _rows(listing: str) -> list[list[str]]:
    lines = listing.splitlines()
    assert lines[0].split() == ["KEY", "ID", "TENANT", "SOURCE", "CREATED"]
    return [line.split(maxsplit=3) for line in lines[1:]]


def _readme_cli_examples() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## CLI reference\n") : readme.index("\n## API\n")]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the CLI reference has no bash example block"
    return str(blocks[0])


def test_readme_cli_examples_work_as_pasted_against_the_demo(tmp_path: Path) -> None:
    block = _readme_cli_examples()
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands[0] == "export GATEWAY_CONFIG=config/demo.yaml"
    assert all(c.startswith(".venv/bin/gateway ") for c in commands[1:])
    assert {c.split()[1] for c in commands[1:]} >= {"check", "keys", "report"}
    # As pasted, but with this test's venv and a real id for the placeholder.
    stored_id = '"$(.venv/bin/gateway keys list | awk \'$3 == "stored" {print $1; exit}\')"'
    script = block.replace("KEY_ID", stored_id).replace(".venv/bin/", f"{VENV_BIN}/")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        env=_env(GATEWAY_DATA_DIR=str(tmp_path)),
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "config/demo.yaml: ok" in result.stdout
    created = re.search(r"created (key_[0-9a-f]{12}) for tenant demo", result.stderr)
    assert created, result.stderr
    listed = rf"^{created.group(1)} +demo +stored +\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\dZ$"
    assert re.search(listed, result.stdout, re.M), result.stdout
    assert f"revoked {created.group(1)}\n" in result.stdout
    assert re.search(r"^\$GATEWAY_DEMO_KEY +demo +config +-$", result.stdout, re.M)
    assert "Cache report" in result.stdout
    assert (tmp_path / "state.json").exists() and not (ROOT / "gateway.yaml").exists()


def test_make_run_says_how_to_call_the_cli_then_serves_in_the_foreground(
    tmp_path: Path,
) -> None:
    venv = VENV_BIN.parent
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "run", f"VENV={venv}", f"DATA={tmp_path}"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[-1] == f"{venv}/bin/gateway serve --config config/demo.yaml"
    echoes = [line for line in lines if line.startswith("echo ")]
    assert echoes and lines.index(echoes[-1]) < len(lines) - 1
    shown = subprocess.run(
        ["bash", "-c", "\n".join(echoes)], capture_output=True, text=True, check=True
    ).stdout
    assert "GATEWAY_CONFIG=config/demo.yaml" in shown
    hinted = [line.strip() for line in shown.splitlines() if "/bin/gateway " in line]
    assert len(hinted) == 1 and hinted[0].endswith("--config config/demo.yaml")
    # The command it shows works, from the repository root, on the demo's state (here in
    # DATA, where a key is made first).
    demo = ["--config", "config/demo.yaml"]
    created = _gateway(
        "keys", "create", "--tenant", "demo", *demo, env=_env(GATEWAY_DATA_DIR=str(tmp_path))
    )
    key_id = re.search(r"created (key_[0-9a-f]{12})", created.stderr)
    assert created.returncode == 0 and key_id, created.stderr
    result = subprocess.run(
        ["bash", "-c", hinted[0]], capture_output=True, text=True, env=_env(), cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert rows[0] == ["$GATEWAY_DEMO_KEY", "demo", "config", "-"]
    assert [row[:3] for row in rows[1:]] == [[key_id.group(1), "demo", "stored"]]


def test_configuration_from_gateway_config_else_a_hint(tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text((ROOT / "config" / "demo.yaml").read_text())
    env = _env(GATEWAY_DATA_DIR=str(tmp_path), GATEWAY_CONFIG=str(config))
    by_env = _gateway("check", env=env, cwd=tmp_path)
    assert by_env.returncode == 0 and by_env.stdout.startswith(f"{config}: ok"), by_env.stderr
    flag_wins = _gateway("check", "--config", str(ROOT / "config/demo.yaml"), env=env)
    assert flag_wins.returncode == 0 and "config/demo.yaml: ok" in flag_wins.stdout

    missing = _gateway("keys", "list", env=_env(), cwd=tmp_path)
    assert missing.returncode == 2 and "gateway.yaml: cannot read" in missing.stderr
    assert "--config FILE or $GATEWAY_CONFIG" in missing.stderr
    assert "--config config/demo.yaml" in missing.stderr
    # A configuration that exists but is wrong gets its error, not the hint.
    broken = tmp_path / "broken.yaml"
    broken.write_text("backends: 3\n")
    wrong = _gateway("check", env=_env(GATEWAY_CONFIG=str(broken)), cwd=tmp_path)
    assert wrong.returncode == 2 and "broken.yaml" in wrong.stderr
    assert "GATEWAY_CONFIG" not in wrong.stderr


def test_keys_list_shows_configured_keys_by_id_never_the_keys(tmp_path: Path) -> None:
    declared, from_env = "sk-declared-in-yaml-0123456789", "sk-from-the-environment-98765"
    config = tmp_path / "gateway.yaml"
    backend = {"name": "b", "base_url": "http://127.0.0.1:9/v1", "models": ["m"]}
    tenants = [
        {"name": "acme", "keys": [{"sha256": hash_of(declared)}, {"env": "ACME_KEY"}]},
        {"name": "beta", "keys": [{"env": "BETA_KEY", "generate": True}]},
    ]
    state = {"url": "memory", "path": str(tmp_path / "state.json")}
    config.write_text(yaml.safe_dump({"state": state, "backends": [backend], "tenants": tenants}))
    env = _env(ACME_KEY=from_env)

    created = _gateway("keys", "create", "--tenant", "acme", env=env, cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    stored_key = created.stdout.strip()
    stored_id = re.search(r"created (key_[0-9a-f]{12})", created.stderr)
    assert stored_id

    listed = _gateway("keys", "list", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = _rows(listed.stdout)
    assert rows[:3] == [
        ["cfg_" + hash_of(declared)[:12], "acme", "config", "-"],
        ["cfg_" + hash_of(from_env)[:12], "acme", "config", "-"],
        ["$BETA_KEY", "beta", "config", "-"],
    ]
    assert len(rows) == 4 and rows[3][:3] == [stored_id.group(1), "acme", "stored"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", rows[3][3])
    output = listed.stdout + listed.stderr
    for secret in (declared, from_env, stored_key):
        assert secret not in output and hash_of(secret) not in output
    assert "sk-gw-" not in output, "listing generated a key for $BETA_KEY"

    refused = _gateway("keys", "revoke", rows[0][0], env=env, cwd=tmp_path)
    assert refused.returncode == 1
    assert "declared in the configuration (tenant acme)" in refused.stderr
    revoked = _gateway("keys", "revoke", stored_id.group(1), env=env, cwd=tmp_path)
    assert revoked.returncode == 0, revoked.stderr
    after = _rows(_gateway("keys", "list", env=env, cwd=tmp_path).stdout)
    assert after == rows[:3]


def test_the_gateway_says_in_one_line_where_it_serves(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """Address, config file, backends, where state lives; never a credential."""
    secret = "hunter2-redis-password"
    config = {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "cache": {"enabled": False},
        "backends": [{"name": "up", "base_url": "http://127.0.0.1:9/v1", "models": ["m1", "m2"]}],
        "tenants": [],
    }
    gw = gateway_factory(config)
    lines = [line for line in gw.server.log().splitlines() if "serving" in line]
    assert len(lines) == 1, gw.server.log()
    line = lines[0]
    assert f"serving http://127.0.0.1:{gw.port}/v1" in line
    assert str(gw.config_path) in line and "up [m1, m2]" in line
    assert f"memory, {tmp_path / 'state.json'}" in line
    assert secret not in line
    assert redacted_url(f"redis://user:{secret}@10.0.0.5:6379/0") == "redis://10.0.0.5:6379/0"
