"""Token features of one prompt: what the pair verifier reads, stored with each entry as bytes.

The embedder computes them in the same forward pass as the sentence vector, so a lookup
costs no second model call. Layout (little-endian), version 1:

    b"TF" | version u8 | flags u8 | n u16 | ids u16[n] | embeddings f16[n, dim]

`ids` are the model's word-piece ids ([CLS] and [SEP] included); `embeddings` are the
model's last-layer token vectors, unnormalised. float16 halves the size for a cosine error
below 1e-3, far under anything the verifier resolves.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

_MAGIC = b"TF"
_VERSION = 1
_HEADER = struct.Struct("<2sBBH")
_TRUNCATED = 1


class FeatureFormatError(ValueError):
    """The bytes are not token features this version can read."""


@dataclass(frozen=True, eq=False)  # arrays: compare to_bytes() instead
class TokenFeatures:
    ids: npt.NDArray[np.uint16]  # shape (n,)
    embeddings: npt.NDArray[np.float16]  # shape (n, dim)
    truncated: bool  # the model stopped reading before the end of the text

    def to_bytes(self) -> bytes:
        flags = _TRUNCATED if self.truncated else 0
        header = _HEADER.pack(_MAGIC, _VERSION, flags, len(self.ids))
        ids = np.ascontiguousarray(self.ids, dtype="<u2").tobytes()
        vectors = np.ascontiguousarray(self.embeddings, dtype="<f2").tobytes()
        return header + ids + vectors

    @classmethod
    def from_bytes(cls, data: bytes) -> TokenFeatures:
        if len(data) < _HEADER.size:
            raise FeatureFormatError("token features: too short")
        magic, version, flags, n = _HEADER.unpack_from(data)
        if magic != _MAGIC or version != _VERSION:
            raise FeatureFormatError(f"token features: unknown format {magic!r} v{version}")
        body = len(data) - _HEADER.size - 2 * n
        if n == 0 or body <= 0 or body % (2 * n):
            raise FeatureFormatError("token features: length does not match the header")
        ids = np.frombuffer(data, dtype="<u2", count=n, offset=_HEADER.size)
        vectors = np.frombuffer(data, dtype="<f2", offset=_HEADER.size + 2 * n)
        return cls(ids, vectors.reshape(n, -1), bool(flags & _TRUNCATED))
