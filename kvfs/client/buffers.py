"""The caller's buffers as byte views: anything with the buffer protocol (bytes,
bytearray, memoryview, numpy arrays, mmap) and CPU torch tensors, which do not speak the
buffer protocol, by duck typing (``data_ptr``, ``is_contiguous``, ``device``) so that
nothing here imports torch. A block may be scattered over several buffers (a list or
tuple of them, filled or read in order), as ``readv``/``writev`` take them.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

__all__ = ["Segments", "address", "checksum", "copy", "copy_hashed", "gather", "read_file", "scatter", "segments"]

Segments = list[memoryview]

_NOWAIT = getattr(os, "RWF_NOWAIT", 8)


def _tensor_view(t: Any, writable: bool) -> memoryview:
    """A byte view of a contiguous CPU torch tensor's memory (no copy, no torch import)."""
    device = getattr(getattr(t, "device", None), "type", "cpu")
    if device != "cpu":
        raise ValueError(f"a {device} tensor is not host memory; the batch client reads and writes CPU buffers")
    if not t.is_contiguous():
        raise ValueError("the tensor is not contiguous; pass tensor.contiguous() or its contiguous slices")
    n = int(t.numel()) * int(t.element_size())
    if n == 0:
        return memoryview(bytearray(0))
    raw = (ctypes.c_char * n).from_address(int(t.data_ptr()))
    mv = memoryview(raw).cast("B")
    return mv if writable else mv.toreadonly()


def view(buf: Any, *, writable: bool) -> memoryview:
    """*buf* as a flat byte memoryview; ``ValueError`` for a buffer that cannot be used
    (read-only where one is written, not contiguous, on a GPU)."""
    if hasattr(buf, "data_ptr") and hasattr(buf, "element_size") and not hasattr(buf, "__buffer__"):
        return _tensor_view(buf, writable)
    try:
        mv = memoryview(buf)
    except TypeError:
        raise TypeError(f"{type(buf).__name__} is not a buffer (bytes, bytearray, numpy array, torch tensor)") from None
    if not mv.contiguous:
        raise ValueError("the buffer is not contiguous")
    if writable and mv.readonly:
        raise ValueError(f"a read-only {type(buf).__name__} cannot be read into")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def segments(buf: Any, *, writable: bool) -> Segments:
    """One block's buffers: a buffer, or a list/tuple of buffers in order."""
    if isinstance(buf, (list, tuple)):
        return [view(b, writable=writable) for b in buf]
    return [view(buf, writable=writable)]


def total(segs: Sequence[memoryview]) -> int:
    return sum(len(s) for s in segs)


_PAGE = 4096
_ALIAS = 256  # (dst - src) mod a page below this: the string copy stalls (see copy)
_VECTOR_MIN = 64 << 10  # smaller copies: the check costs more than it can save


def address(buf: memoryview) -> int:
    """Where *buf*'s first byte lies in this process's memory."""
    if not buf.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))  # 0.5 us, a quarter of numpy's
    at: int = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
    return at


def copy(dst: memoryview, src: memoryview, src_at: int | None = None) -> None:
    """``dst[:] = src`` (same length), at memory speed whatever the two addresses;
    *src_at*: :func:`address` of *src* when the caller knows it.

    glibc copies a few KiB or more with ``rep movsb``, which on some x86 CPUs (measured:
    AMD EPYC, glibc 2.36) runs 2-8x slower when the destination lies a little above the
    source modulo a page (``(dst - src) % 4096`` in (0, 256)): each load waits for the
    store just before it (4 KiB aliasing). A block at a page-aligned arena offset copied
    into a buffer from ``malloc`` (numpy's: 16 bytes past a page) is that case. There the
    bytes go through numpy's vector loop over 8-byte words instead, which does not stall;
    every other copy is a plain ``memcpy``."""
    n = len(src)
    if n >= _VECTOR_MIN and not dst.readonly:
        da = address(dst)
        sa = address(src) if src_at is None else src_at
        if 0 < (da - sa) % _PAGE < _ALIAS and not (da | sa | n) & 7:
            np.positive(np.frombuffer(src, np.uint64), out=np.frombuffer(dst, np.uint64))
            return
    dst[:] = src


def scatter(src: memoryview, segs: Sequence[memoryview], src_at: int | None = None) -> None:
    """Copy *src* into *segs* in order (they hold at least ``len(src)`` bytes); *src_at*:
    :func:`address` of *src* when the caller knows it."""
    pos, n = 0, len(src)
    for s in segs:
        if pos >= n:
            break
        k = min(len(s), n - pos)
        at = None if src_at is None else src_at + pos
        copy(s if k == len(s) else s[:k], src if k == n else src[pos : pos + k], at)
        pos += k


def gather(dst: memoryview, segs: Sequence[memoryview]) -> None:
    """Copy *segs* in order into *dst* (exactly ``len(dst)`` bytes in all)."""
    pos = 0
    for s in segs:
        dst[pos : pos + len(s)] = s
        pos += len(s)


_CHUNK = 256 << 10  # copied, then hashed while it is still in the cache


def copy_hashed(dst: memoryview, segs: Sequence[memoryview]) -> int:
    """:func:`gather` *segs* into *dst* and return the xxh3-64 of the bytes, hashing each
    piece of the source right after copying it (cache-warm), so the checksum says what
    was meant to be written: a copy that went wrong fails the daemon's check."""
    h = xxhash.xxh3_64()
    pos = 0
    for s in segs:
        n = len(s)
        for a in range(0, n, _CHUNK):
            piece = s[a : a + _CHUNK]
            dst[pos + a : pos + a + len(piece)] = piece
            h.update(piece)
        pos += n
    out: int = h.intdigest()
    return out


def checksum(segs: Sequence[memoryview], length: int | None = None) -> int:
    """xxh3-64 of the first *length* bytes of *segs* (all of them by default): the
    checksum kvfs keeps for a block."""
    if len(segs) == 1 and (length is None or length == len(segs[0])):
        digest: int = xxhash.xxh3_64_intdigest(segs[0])
        return digest
    h = xxhash.xxh3_64()
    left = total(segs) if length is None else length
    for s in segs:
        if left <= 0:
            break
        h.update(s[:left] if len(s) > left else s)
        left -= len(s)
    out: int = h.intdigest()
    return out


def _advance(segs: Segments, n: int) -> Segments:
    while segs and n >= len(segs[0]):
        n -= len(segs[0])
        segs = segs[1:]
    return [segs[0][n:], *segs[1:]] if n else segs


def read_file(path: str, offset: int, length: int, segs: Sequence[memoryview], *, nowait: bool = False) -> int:
    """``preadv`` *length* bytes at *offset* of *path* into *segs*; returns the bytes read
    (fewer when the file is shorter). ``OSError`` passes through. *nowait*: only if the
    bytes are in the page cache (``RWF_NOWAIT``); else :class:`BlockingIOError` at once,
    so that the caller can read it where waiting is cheap (a thread of its own)."""
    todo: Segments = []
    left = length
    for s in segs:
        if left <= 0:
            break
        todo.append(s[:left] if len(s) > left else s)
        left -= len(todo[-1])
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        got = 0
        if nowait and todo:
            try:
                got = os.preadv(fd, todo, offset, _NOWAIT)
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a filesystem that cannot say
                    raise BlockingIOError(errno.EAGAIN, "the file cannot be read without waiting") from exc
                raise
            todo = _advance(todo, got)
        while todo:
            n = os.preadv(fd, todo, offset + got)
            if n == 0:
                break
            got += n
            todo = _advance(todo, n)
        return got
    finally:
        os.close(fd)
