"""Write a randomly initialised Llama of a chosen size, for tests and benchmarks.

    python scripts/make_synthetic_model.py --size-gb 1.0 /tmp/models/synthetic-1gb

Prints the folder, its shape and its weight bytes. Running it again with the same options
reuses the folder; the model itself is `backends.worker.synthetic_model`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from backends.worker.synthetic_model import DTYPE_BYTES, write_synthetic_model  # noqa: E402
from backends.worker.weights import weight_files  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--size-gb", type=float, default=1.0, help="weight bytes, decimal GB")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16")
    parser.add_argument("--shard-gb", type=float, default=0.5, help="largest weight file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from transformers.utils import logging

    logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    started = time.perf_counter()
    folder = write_synthetic_model(
        args.dest, args.size_gb, dtype=args.dtype, shard_gb=args.shard_gb, seed=args.seed
    )
    files = weight_files(folder)
    size = sum(path.stat().st_size for path in files)
    print(f"{folder}: {len(files)} file(s), {size / 1e9:.3f} GB", file=sys.stderr)
    print(f"took {time.perf_counter() - started:.1f} s", file=sys.stderr)
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
