"""Host tensors as bytes, and vectored file I/O into and out of them.

One way for every part of gpu/ to see a CPU tensor's memory as a writable byte view
(the prefix cache, the SGLang backend, the transfer paths and the integrity checks had a
copy each), and ``readv``/``writev`` loops that finish short transfers.
"""

from __future__ import annotations

import os

import torch

__all__ = ["host_bytes", "read_full", "write_full"]


def host_bytes(t: torch.Tensor) -> memoryview:
    """A flat, writable byte view of a contiguous CPU tensor's own memory (any dtype,
    bfloat16 too). A non-contiguous tensor is refused: viewing it would mean a copy, and
    writes into a copy would be lost."""
    if not t.is_contiguous():
        raise ValueError("host_bytes needs a contiguous tensor (call .contiguous() and keep that tensor)")
    return t.view(-1).view(torch.uint8).numpy().data


def _advance(segs: list[memoryview], n: int) -> list[memoryview]:
    """The segments still to fill after a vectored call moved *n* bytes."""
    while segs and n >= len(segs[0]):
        n -= len(segs[0])
        segs = segs[1:]
    return [segs[0][n:], *segs[1:]] if n else segs


def read_full(fd: int, segments: list[memoryview]) -> int:
    """``readv`` until every segment is full or the file ends; returns the bytes read."""
    total, segs = 0, segments
    while segs:
        n = os.readv(fd, segs)
        if n == 0:
            break
        total += n
        segs = _advance(segs, n)
    return total


def write_full(fd: int, segments: list[memoryview]) -> int:
    """``writev`` until every segment is written; returns the bytes written."""
    total, segs = 0, segments
    while segs:
        n = os.writev(fd, segs)
        total += n
        segs = _advance(segs, n)
    return total
