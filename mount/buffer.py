"""The bytes of one file being written: sparse, in 1 MiB chunks, optionally over a base block.

A :class:`WriteBuffer` holds what a writer has written so far. Holes cost nothing: a
file ``ftruncate``d to 1 GiB holds no memory until it is written, and reads of a hole are
zeros. A new version of an existing block opened without ``O_TRUNC`` starts *over* the old
block (``base``, a read-only view kept by the caller): unwritten regions read through to
it, and a chunk is copied out of it only when a write touches that chunk (copy on write).

Chunks are ``CHUNK`` bytes of the file (chunk *k* covers ``[k*CHUNK, (k+1)*CHUNK)``); a
chunk holds the bytes from its start up to the last one written (shorter chunks end in
zeros). A FUSE write of a whole aligned chunk (1 MiB, the kernel's largest request) is
kept as the ``bytes`` object it arrived in, without a copy.

``allocated`` is the memory the chunks hold (the base is not counted here: the caller
accounts for it). Not thread-safe: the mount's loop owns it; :meth:`snapshot` returns
bytes that later writes do not change.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator

from kvfs.pieces import Pieces

__all__ = ["CHUNK", "WriteBuffer", "keep_freed_memory"]

log = logging.getLogger("kvfs.mount.buffer")

CHUNK = 1 << 20

_ZEROS = memoryview(bytes(CHUNK))  # holes' bytes: shared, read-only

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 128 << 20, arena_max: int = 2) -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of returning it at once,
    in at most *arena_max* arenas.

    Every FUSE write arrives as a fresh ``bytes`` of up to 1 MiB, and every seal joins a
    block; by default glibc serves such sizes with fresh ``mmap``s (or trims them off the
    heap when freed), so each block costs the daemon a page fault per 4 KiB, which was
    two thirds of the time of writing a 2 MiB block (docs/benchmarks-fuse.md). Allocations
    below *mmap_threshold* come from the heap, and up to *trim_threshold* bytes of freed
    heap stay mapped, warm.

    glibc also gives each thread that allocates an arena of its own (up to 8 per core),
    each keeping its freed memory: with the daemon's many threads (FUSE, the store's
    workers, the tiers' pools) its RSS climbed with every burst they served -- 2.7 MiB/min
    over a 30-minute ``kvfs bench soak``, in steps at its faults, into 15 arenas (issue
    20, item 10). Two arenas held it flat (+0.3 MiB/min, 148 MiB against 300): the
    interpreter serializes most allocation anyway. Returns False where this is not glibc
    (nothing changes)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    ok: bool = (  # mallopt is an untyped ctypes function
        mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1
        and mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1
        and mallopt(_M_ARENA_MAX, arena_max) == 1
    )
    if not ok:  # pragma: no cover - glibc accepts these values
        log.info("mallopt refused the thresholds; freed buffers go back to the kernel")
    return ok


class WriteBuffer:
    """A sparse, growable file image. See the module docstring."""

    __slots__ = ("_base", "_base_len", "_chunks", "allocated", "size")

    def __init__(self, base: memoryview | None = None) -> None:
        self._chunks: dict[int, bytes | bytearray] = {}
        self._base = base
        self._base_len = len(base) if base is not None else 0
        self.size = self._base_len
        self.allocated = 0

    # -- changing it ---------------------------------------------------------------

    @staticmethod
    def growth_bound(n: int) -> int:
        """The most :meth:`write` of *n* bytes (at most one chunk) can add to ``allocated``:
        the bytes plus the zeros or base bytes copied around them in the two chunks it
        may touch."""
        return n + 2 * CHUNK

    def write(self, off: int, data: bytes) -> None:
        """Write *data* at *off*, growing the file if it ends past ``size``."""
        n = len(data)
        if n == 0:
            return
        end = off + n
        mv = None
        pos = off
        while pos < end:
            k, lo = divmod(pos, CHUNK)
            hi = min(CHUNK, lo + end - pos)
            take = hi - lo
            if lo == 0 and take == CHUNK:
                # a whole chunk: keep the object as it came (no copy) when it is all of it
                if n == CHUNK and isinstance(data, bytes):
                    piece: bytes = data
                else:
                    mv = mv if mv is not None else memoryview(data)
                    piece = bytes(mv[pos - off : pos - off + take])
                self._set(k, piece)
            else:
                mv = mv if mv is not None else memoryview(data)
                self._patch(k, lo, mv[pos - off : pos - off + take])
            pos += take
        self.size = max(self.size, end)

    def _set(self, k: int, chunk: bytes | bytearray) -> None:
        old = self._chunks.get(k)
        self.allocated += len(chunk) - (len(old) if old is not None else 0)
        self._chunks[k] = chunk

    def _patch(self, k: int, lo: int, piece: memoryview) -> None:
        """Write *piece* at offset *lo* of chunk *k* (less than a whole chunk)."""
        old = self._chunks.get(k)
        before = len(old) if old is not None else 0
        if old is None:
            c = self._from_base(k)
            if not c and lo == 0:
                self._set(k, bytes(piece))  # the common first write of a small file: one copy
                return
        else:
            c = old if isinstance(old, bytearray) else bytearray(old)
        if lo > len(c):
            c.extend(bytes(lo - len(c)))
        c[lo : lo + len(piece)] = piece
        self._chunks[k] = c
        self.allocated += len(c) - before

    def _from_base(self, k: int) -> bytearray:
        """A new chunk *k*: the base's bytes of that chunk (copy on write), or empty."""
        start = k * CHUNK
        if start >= self._base_len:
            return bytearray()
        assert self._base is not None
        return bytearray(self._base[start : min(start + CHUNK, self._base_len)])

    def truncate(self, n: int) -> None:
        """Set the size to *n*: bytes past it are dropped; growing adds a hole (no memory)."""
        if n < self.size:
            k_last, lo = divmod(n, CHUNK)
            for k in [k for k in self._chunks if k > k_last or (k == k_last and lo == 0)]:
                self.allocated -= len(self._chunks.pop(k))
            c = self._chunks.get(k_last)
            if c is not None and len(c) > lo:
                self.allocated -= len(c) - lo
                self._chunks[k_last] = c[:lo]
            self._base_len = min(self._base_len, n)
        self.size = n

    def release(self) -> None:
        """Drop every chunk and the base (the version is finished)."""
        self._chunks.clear()
        self._base = None
        self._base_len = 0
        self.allocated = 0

    # -- reading it ----------------------------------------------------------------

    def _pieces(self, off: int, end: int) -> Iterator[bytes | bytearray | memoryview]:
        """The bytes of ``[off, end)`` as a sequence of buffers (chunks, base views, zeros)."""
        pos = off
        while pos < end:
            k, lo = divmod(pos, CHUNK)
            hi = min(CHUNK, lo + end - pos)
            c = self._chunks.get(k)
            if c is not None:
                have = min(len(c), hi)
                if lo < have:
                    yield c if lo == 0 and have == len(c) else memoryview(c)[lo:have]
                if hi > max(lo, have):
                    yield _ZEROS[: hi - max(lo, have)]
            else:
                start = k * CHUNK
                base_hi = min(max(self._base_len - start, 0), hi)
                if lo < base_hi:
                    assert self._base is not None
                    yield self._base[start + lo : start + base_hi]
                if hi > max(lo, base_hi):
                    yield _ZEROS[: hi - max(lo, base_hi)]
            pos += hi - lo

    def read(self, off: int, n: int) -> bytes:
        """Up to *n* bytes at *off* (fewer at the end of the file; holes are zeros)."""
        end = min(off + n, self.size)
        if off >= end:
            return b""
        return b"".join(self._pieces(off, end))

    def pages(self, indexes: list[int], size: int, page: int = 4096) -> list[tuple[int, bytes]]:
        """``(offset, bytes)`` of the pages *indexes* (each up to *size*, the file's end)."""
        out = []
        for i in indexes:
            off = i * page
            if off < size:
                out.append((off, self.read(off, min(page, size - off))))
        return out

    def snapshot(self, final: bool = False) -> Pieces:
        """The whole file as the pieces of one block, not joined: the chunks, views of the
        base, zeros for holes (sealed as they are, :mod:`kvfs.pieces`).

        Later changes to this buffer do not affect them: ``bytes`` chunks, the base and the
        zeros never change; a chunk a later write would change in place (a ``bytearray``)
        is copied, unless *final* (no write can follow: the caller is done with this
        buffer; its chunks must stay until the pieces are sealed)."""
        pieces = self._pieces(0, self.size)
        if final:
            return Pieces(pieces)
        return Pieces(p if _frozen(p) else bytes(p) for p in pieces)


def _frozen(piece: bytes | bytearray | memoryview) -> bool:
    """Whether nothing can change *piece* (a ``bytes``, or a read-only view: the base, the zeros)."""
    return isinstance(piece, bytes) or (isinstance(piece, memoryview) and piece.readonly)
