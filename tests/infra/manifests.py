"""Reading infra/k8s the way kustomize does, as far as the static checks need.

`Kustomization` follows `resources` and `components` recursively and collects the
documents they hold, without applying patches: enough to check references, names and the
shape of the base objects, with PyYAML and nothing else.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
BASE = K8S / "base"
OVERLAYS = sorted(path for path in (K8S / "overlays").iterdir() if path.is_dir())
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")

Doc = dict[str, Any]


_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UniqueKeyLoader(_SafeLoader):
    """A SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last silently)."""


def _mapping_without_duplicates(loader: UniqueKeyLoader, node: yaml.MappingNode) -> Doc:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _mapping_without_duplicates,
)


def load_docs(path: Path) -> list[Doc]:
    """Every non-empty document of a YAML file (parsed once per test session)."""
    return list(_parsed(path.resolve()))


@functools.cache
def _parsed(path: Path) -> tuple[Doc, ...]:
    return tuple(doc for doc in yaml.load_all(path.read_text(), Loader=UniqueKeyLoader) if doc)


def yaml_files() -> list[Path]:
    return sorted(p for p in INFRA.rglob("*") if p.suffix in {".yaml", ".yml"} and p.is_file())


def kustomization_file(directory: Path) -> Path | None:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    return None


def kustomization_dirs() -> list[Path]:
    return sorted(
        {path.parent for name in KUSTOMIZATION_FILES for path in K8S.rglob(name)},
    )


def generator_paths(entry: Doc) -> Iterator[str]:
    """Files of a configMapGenerator/secretGenerator entry (`key=path` or `path`)."""
    for item in entry.get("files", []):
        yield item.split("=", 1)[-1]
    yield from entry.get("envs", [])


def literal_values(entry: Doc) -> Iterator[tuple[str, str]]:
    for item in entry.get("literals", []):
        key, _, value = item.partition("=")
        yield key, value


@dataclass
class Kustomization:
    """One kustomization directory and everything it reaches."""

    directory: Path
    spec: Doc = field(init=False)

    def __post_init__(self) -> None:
        found = kustomization_file(self.directory)
        assert found is not None, f"{self.directory} has no kustomization.yaml"
        (self.spec,) = load_docs(found)

    def references(self) -> Iterator[tuple[str, str]]:
        """(what, relative path) for every local file or directory it names."""
        for item in self.spec.get("resources", []):
            yield "resources", item
        for item in self.spec.get("components", []):
            yield "components", item
        for patch in self.spec.get("patches", []):
            if "path" in patch:
                yield "patches", patch["path"]
        for item in self.spec.get("patchesStrategicMerge", []):
            yield "patchesStrategicMerge", item
        for key in ("configMapGenerator", "secretGenerator"):
            for entry in self.spec.get(key, []):
                for item in generator_paths(entry):
                    yield key, item

    def children(self) -> list[Kustomization]:
        """The kustomizations named in resources and components."""
        names = [*self.spec.get("resources", []), *self.spec.get("components", [])]
        return [
            Kustomization((self.directory / name).resolve())
            for name in names
            if (self.directory / name).is_dir()
        ]

    def reaches(self) -> list[Path]:
        """This directory and every kustomization below it, depth first."""
        found = [self.directory]
        for child in self.children():
            found.extend(child.reaches())
        return found

    def documents(self) -> list[Doc]:
        """Resource documents (unpatched), plus stubs for generated ConfigMaps and Secrets."""
        docs: list[Doc] = []
        for name in [*self.spec.get("resources", []), *self.spec.get("components", [])]:
            path = self.directory / name
            if path.is_file():
                docs.extend(load_docs(path))
        for child in self.children():
            docs.extend(child.documents())
        for key, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")):
            for entry in self.spec.get(key, []):
                docs.append({"kind": kind, "metadata": {"name": entry["name"]}, "generated": True})
        return docs

    def patch_targets(self) -> Iterator[tuple[str, str, str]]:
        """(patch description, kind, name) for every object a patch of this level targets."""
        for patch in self.spec.get("patches", []):
            if "target" in patch:
                target = patch["target"]
                yield str(patch.get("path", "inline patch")), target["kind"], target["name"]
            elif "path" in patch:
                for doc in load_docs(self.directory / patch["path"]):
                    yield patch["path"], doc["kind"], doc["metadata"]["name"]


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    matches = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def of_kind(docs: list[Doc], *kinds: str) -> list[Doc]:
    return [doc for doc in docs if doc.get("kind") in kinds]


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def all_containers(spec: Doc) -> list[Doc]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def base_documents() -> list[Doc]:
    return Kustomization(BASE).documents()
