"""Files the gateway writes hold tenants' data (batch files and results, request events)
or its keys' digests (the state file): created readable by the gateway's user alone,
whatever the umask, so another account on the host reads none of them."""

from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def owner_only(path: str, flags: int) -> int:
    """An `opener` for open(): a file it creates is the owner's alone."""
    return os.open(path, flags, FILE_MODE)


def private_dir(path: Path) -> None:
    """`path` and its missing parents, each folder it creates the owner's alone (mkdir's
    `parents` would make the parents with the umask's mode)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=DIR_MODE, exist_ok=True)


def write_private(path: Path, data: bytes) -> None:
    """Writes `path` afresh (a temporary file, to be renamed), the owner's alone."""
    path.unlink(missing_ok=True)  # a leftover would keep its mode
    with open(path, "xb", opener=owner_only) as out:
        out.write(data)
