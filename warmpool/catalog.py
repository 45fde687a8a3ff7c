"""What an earlier run left in the cache folder, and the last-use times kept there.

Published models are the folders with a valid `.complete` marker (its mtime is the last
use); partial downloads are the `.partial/` folders with a readable `state.json`. A
folder named like ours but without a marker is a publish a crash cut short and is removed;
folders with other names are left alone, since the cache folder may hold other things.
Everything here blocks: call it through the pool.
"""

from __future__ import annotations

import contextlib
import os

from warmpool.budget import CacheEntry
from warmpool.layout import MARKER, CacheLayout, allocated_bytes, discard, is_safe_name, read_json
from warmpool.staged import StagedModel


def save_last_use(layout: CacheLayout, times: dict[str, float]) -> None:
    for model, when in times.items():
        with contextlib.suppress(FileNotFoundError):  # evicted meanwhile
            os.utime(layout.marker(model), (when, when))


def scan(layout: CacheLayout) -> tuple[list[tuple[StagedModel, float]], list[CacheEntry]]:
    """Published models (with their last use) and interrupted downloads, from an earlier run."""
    layout.create()
    return scan_published(layout), scan_partials(layout)


def scan_published(layout: CacheLayout) -> list[tuple[StagedModel, float]]:
    found = []
    for folder in layout.root.iterdir():
        if not (folder.is_dir() and is_safe_name(folder.name)):
            continue  # not ours: the cache folder may be shared with other things
        marker = read_json(folder / MARKER)
        try:
            staged = StagedModel.from_marker(marker, folder)
        except (TypeError, KeyError, ValueError):
            staged = None
        if staged is None or layout.published(staged.model) != folder:
            discard(folder, layout.trash)  # a crash between publish and marker: not usable
            continue
        found.append((staged, (folder / MARKER).stat().st_mtime))
    return found


def scan_partials(layout: CacheLayout) -> list[CacheEntry]:
    found = []
    for folder in layout.partial_root.iterdir():
        state = read_json(folder / "state.json")
        model = state.get("model") if isinstance(state, dict) else None
        if not isinstance(model, str) or layout.partial(model) != folder:
            discard(folder, layout.trash)
            continue
        size = allocated_bytes(folder)
        found.append(CacheEntry(model, size, folder.stat().st_mtime, partial=True))
    return found
