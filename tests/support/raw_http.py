"""Reading an HTTP/1.1 answer off a raw socket, for tests that hold connections themselves."""

from __future__ import annotations

import re
import socket


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """The status line and body of one answer with a content-length, read from `sock`;
    ConnectionError if the connection closes before it is whole."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError(f"connection closed after {answer[:200]!r}")
        answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    if length is None:
        raise ValueError(f"no content-length: {head[:200]!r}")
    while len(body) < int(length.group(1)):
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed mid-answer")
        body += data
    return head.split(b"\r\n", 1)[0], body
