"""PartFile hashes its bytes as chunks land, in any order, and checks what the file holds."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from warmpool.partfile import PartFile
from warmpool.source import RemoteObject
from warmpool.verify import FileSpec

CHUNK = 4096


def part_file(tmp_path: Path, data: bytes) -> PartFile:
    obj = RemoteObject("weights", "m/w.bin", "w.bin", len(data), "etag")
    spec = FileSpec(obj, "sha256", hashlib.sha256(data).hexdigest())
    parts = tmp_path / "parts"
    pf = PartFile(spec, parts / "w.part", parts / "w.json", tmp_path / "files" / "w.bin", CHUNK)
    pf.open()
    return pf


def chunk(data: bytes, index: int) -> bytes:
    return data[index * CHUNK : (index + 1) * CHUNK]


def test_chunks_in_reverse_order_are_hashed_and_the_file_published(tmp_path: Path) -> None:
    data = os.urandom(5 * CHUNK + 123)
    pf = part_file(tmp_path, data)
    for index in reversed(range(pf.chunks)):
        pf.write_chunk(index, chunk(data, index))
        pf.digest_more()  # nothing to hash until chunk 0 lands, then all of it
    assert pf.finish() is None
    assert pf.ready.read_bytes() == data


def test_a_chunk_written_at_the_wrong_place_fails_the_check(tmp_path: Path) -> None:
    data = os.urandom(3 * CHUNK)
    pf = part_file(tmp_path, data)
    pf.write_chunk(0, chunk(data, 0))
    pf.write_chunk(1, chunk(data, 2))  # what the network sent is right; the file is not
    pf.write_chunk(2, chunk(data, 2))
    pf.digest_more()
    reason = pf.finish()
    assert reason is not None and "sha256" in reason
    assert not pf.part.exists() and not pf.ready.exists()


def test_resumed_chunks_are_read_back_into_the_digest(tmp_path: Path) -> None:
    data = os.urandom(4 * CHUNK)
    pf = part_file(tmp_path, data)
    pf.write_chunk(0, chunk(data, 0))
    pf.write_chunk(1, chunk(data, 1))
    pf.close()  # interrupted: the sidecar lists chunks 0 and 1
    resumed = part_file(tmp_path, data)
    assert resumed.missing() == [2, 3]
    for index in resumed.missing():
        resumed.write_chunk(index, chunk(data, index))
    assert resumed.finish() is None
    assert resumed.ready.read_bytes() == data
