"""Loads the YAML configuration and turns validation errors into messages naming key and line."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from gateway.settings import ConfigError, Settings, expand_env

Location = tuple[str | int, ...]


def load_settings(path: Path, environ: Mapping[str, str]) -> Settings:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read configuration: {exc.strerror}") from exc
    return parse_settings(text, str(path), environ)


def parse_settings(text: str, source: str, environ: Mapping[str, str]) -> Settings:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the configuration must be a YAML mapping")
    lines = _line_numbers(node, ()) if node is not None else {}
    try:
        return Settings.model_validate(expand_env(raw, dict(environ)))
    except ValidationError as exc:
        raise ConfigError(_describe(exc, lines, source)) from exc


def _line_numbers(node: yaml.Node, here: Location) -> dict[Location, int]:
    """Maps each key path of the document to its 1-based line."""
    found: dict[Location, int] = {here: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*here, key.value)
            found[path] = key.start_mark.line + 1
            found.update({k: v for k, v in _line_numbers(value, path).items() if k != path})
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found.update(_line_numbers(item, (*here, index)))
    return found


def _describe(exc: ValidationError, lines: dict[Location, int], source: str) -> str:
    problems = []
    for error in exc.errors():
        location = tuple(error["loc"])
        key = ".".join(str(part) for part in location) or "(top level)"
        line = _nearest_line(location, lines)
        problems.append(f"{source}:{line}: {key}: {error['msg']}")
    return "invalid configuration:\n  " + "\n  ".join(problems)


def _nearest_line(location: Location, lines: dict[Location, int]) -> int:
    for size in range(len(location), -1, -1):
        if location[:size] in lines:
            return lines[location[:size]]
    return 1
