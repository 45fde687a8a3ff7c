"""Static checks of the Dockerfile and .dockerignore (no Docker engine needed)."""

from __future__ import annotations

import fnmatch
import json
import re

from tests.infra.manifests import ROOT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if current and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    found = []
    for text in logical:
        keyword, _, arguments = text.strip().partition(" ")
        found.append((keyword.upper(), arguments.strip()))
    return found


def _stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage, the global ARGs before the first FROM excluded."""
    stages: list[list[tuple[str, str]]] = []
    for keyword, arguments in instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, arguments))
    return stages


def _run_text() -> str:
    return " ".join(args for keyword, args in instructions() if keyword == "RUN")


def test_variant_build_argument_selects_cpu_by_default() -> None:
    found = instructions()
    first_from = next(i for i, (k, _) in enumerate(found) if k == "FROM")
    global_args = [args for keyword, args in found[:first_from] if keyword == "ARG"]
    assert "VARIANT=cpu" in global_args
    froms = [args for keyword, args in found if keyword == "FROM"]
    assert any(re.search(r"\$\{?VARIANT\b", args) for args in froms), "no stage picks VARIANT"


def test_is_multi_stage() -> None:
    stages = _stages()
    assert len(stages) >= 3
    names = [re.search(r"\bAS\s+(\S+)", s[0][1], re.IGNORECASE) for s in stages]
    assert all(names), "name every stage"
    final = stages[-1]
    assert any(k == "COPY" and "--from=" in a for k, a in final), "the runtime copies a build"
    assert not any(k == "RUN" and "pip install" in a for k, a in final), "build in build stages"


def test_runs_as_a_non_root_user() -> None:
    final = _stages()[-1]
    users = [args for keyword, args in final if keyword == "USER"]
    assert users, "the runtime stage must set USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert re.fullmatch(r"\d+", user), "a numeric USER lets Kubernetes check runAsNonRoot"


def test_entrypoint_cmd_and_healthcheck() -> None:
    final = dict(_stages()[-1])
    assert json.loads(final["ENTRYPOINT"]) == ["gateway"]
    assert json.loads(final["CMD"]) == ["serve", "--config", "/etc/gateway/gateway.yaml"]
    assert "/healthz" in final["HEALTHCHECK"]
    assert "EXPOSE" in final


def test_installs_the_project_with_its_constraints() -> None:
    run = _run_text()
    assert "pip install -c constraints.txt ." in run
    assert ".[gpu]" in run
    assert "-e " not in run, "install the package, not an editable checkout"
    args = dict(a.split("=", 1) for k, a in instructions() if k == "ARG" and "=" in a)
    assert args.get("TORCH_VERSION") == "2.13.0"
    assert args.get("TORCH_CPU_INDEX") == "https://download.pytorch.org/whl/cpu"
    assert args.get("CUDA_IMAGE", "").startswith("nvidia/cuda:")
    assert "runtime" in args["CUDA_IMAGE"]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves `path` (or a folder above it) out of the build context."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatch(prefix.rsplit("/", 1)[-1], bare)
            ):
                return True
    return False


def _ignore_patterns() -> list[str]:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    patterns = [line.rstrip("/") for line in lines if line and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "exceptions are not modelled here"
    return patterns


def test_dockerignore_keeps_what_the_build_copies_and_drops_the_rest() -> None:
    patterns = _ignore_patterns()
    for keyword, arguments in instructions():
        if keyword != "COPY" or "--from=" in arguments:
            continue
        *sources, _ = arguments.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
            assert not _ignored(source, patterns), f"COPY {source} is excluded by .dockerignore"
    for private in (".git", ".venv", ".gateway", ".env", "tests", "infra/terraform"):
        assert _ignored(private, patterns), f"{private} would be sent to the build"
    assert not _ignored("gateway/app.py", patterns)
    assert _ignored("gateway/__pycache__/app.cpython-311.pyc", patterns)


def test_project_packages_are_all_copied() -> None:
    copied = {
        source.rstrip("/")
        for keyword, arguments in instructions()
        if keyword == "COPY" and "--from=" not in arguments
        for source in arguments.split()[:-1]
    }
    packages = re.search(r"include = \[([^\]]*)\]", (ROOT / "pyproject.toml").read_text())
    assert packages
    for package in re.findall(r'"(\w+)\*"', packages.group(1)):
        assert package in copied, f"package {package} is not copied into the image"
    assert (ROOT / "config" / "example.yaml").is_file()
