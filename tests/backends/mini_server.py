"""A tiny stand-in model server for provider tests (stdlib only, so it starts in ~50 ms).

    python tests/backends/mini_server.py --port P --state-dir D [--ready-after S]
        [--ignore-sigterm] [--weights W]

- `GET /health`: 503 until `--ready-after` seconds after start (weights "loading"), then 200.
  The port is open from the start, so a provider that trusts an open port is caught.
- `GET /slow?s=SECONDS`: answers 200 after sleeping, to hold a request in flight.
- `GET /crash`: exits at once with code 3.
- SIGTERM: stops accepting, finishes in-flight requests, exits 0 (like uvicorn);
  with `--ignore-sigterm` it ignores SIGTERM, so only SIGKILL ends it.
- Writes `D/<pid>.json` (pid, port, argv, WORKER_SPAWNED_AT) once it listens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse


class Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins request threads: SIGTERM drains
    block_on_close = True
    ready_at: float


class Handler(BaseHTTPRequestHandler):
    server: Server

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == "/health":
            self._answer(200 if time.monotonic() >= self.server.ready_at else 503)
        elif url.path == "/slow":
            time.sleep(float(parse_qs(url.query).get("s", ["1"])[0]))
            self._answer(200)
        elif url.path == "/crash":
            os._exit(3)
        else:
            self._answer(404)

    def _answer(self, status: int) -> None:
        body = json.dumps({"status": status}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--weights", default=None)
    args = parser.parse_args()
    server = Server(("127.0.0.1", args.port), Handler)
    server.ready_at = time.monotonic() + args.ready_after
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        stop = lambda *_: threading.Thread(target=server.shutdown).start()  # noqa: E731
        signal.signal(signal.SIGTERM, stop)
    state = {
        "pid": os.getpid(),
        "port": args.port,
        "weights": args.weights,
        "spawned_at": os.environ.get("WORKER_SPAWNED_AT"),
    }
    partial = args.state_dir / f".{os.getpid()}.tmp"
    partial.write_text(json.dumps(state))
    partial.rename(args.state_dir / f"{os.getpid()}.json")  # readers never see half a file
    server.serve_forever(poll_interval=0.05)
    server.server_close()


if __name__ == "__main__":
    main()
