"""bench/snapshot_write.py measures a real snapshot write and read, in its JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "snapshot_write.py"


def test_its_children_measure_every_metric_of_a_snapshot_of_their_entries(tmp_path: Path) -> None:
    path = str(tmp_path / "entries.bin")
    lines = []
    for step in ("--write", "--read"):
        done = subprocess.run(
            [sys.executable, str(BENCH), step, "500", path],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        lines += [json.loads(line) for line in done.stdout.splitlines()]
    values = {line["metric"]: line["value"] for line in lines}
    assert {line["bench"] for line in lines} == {"snapshot_write"}
    assert {line["entries"] for line in lines} == {500}
    assert set(values) == {
        "snapshot_mb",
        "raw_write_s",
        "snapshot_write_s",
        "snapshot_write_ratio",
        "snapshot_peak_extra_mb",
        "loop_lag_idle_p99_ms",
        "loop_lag_p99_ms",
        "loop_lag_max_ms",
        "snapshot_read_s",
        "snapshot_read_held_mb",
        "snapshot_read_peak_mb",
    }
    assert 4 < values["snapshot_mb"] < 8  # 500 entries of ~11 KB
    assert values["snapshot_write_s"] > 0 and values["raw_write_s"] > 0
