"""Extent allocation inside a fixed-size arena (the DRAM tier's shared memory, the GPU
agent's HBM pool). Pure bookkeeping: no memory is touched here.

Best fit over free extents kept sorted by (length, offset), with neighbours coalesced on
free, so blocks of one common size reuse each other's holes exactly and fragmentation
stays low. Every length is rounded up to ``granule`` (4 KiB: direct I/O and GDS need
aligned buffers).
"""

from __future__ import annotations

from bisect import bisect_left, insort

__all__ = ["ExtentAllocator"]


class ExtentAllocator:
    def __init__(self, size: int, granule: int = 4096) -> None:
        if size <= 0 or granule <= 0:
            raise ValueError("arena size and granule must be positive")
        self.granule = granule
        self.size = size - size % granule
        self._by_size: list[tuple[int, int]] = []  # (length, offset), sorted
        self._starts: dict[int, int] = {}  # offset -> length
        self._ends: dict[int, int] = {}  # offset + length -> offset
        self.allocated = 0
        if self.size:
            self._add_free(0, self.size)

    def round(self, n: int) -> int:
        g = self.granule
        return max(g, (n + g - 1) // g * g)

    def _add_free(self, off: int, length: int) -> None:
        insort(self._by_size, (length, off))
        self._starts[off] = length
        self._ends[off + length] = off

    def _remove_free(self, off: int, length: int) -> None:
        i = bisect_left(self._by_size, (length, off))
        del self._by_size[i]
        del self._starts[off]
        del self._ends[off + length]

    def alloc(self, n: int) -> int | None:
        """Offset of a new extent of ``round(n)`` bytes, or None if no hole is large enough."""
        need = self.round(n)
        i = bisect_left(self._by_size, (need, -1))
        if i == len(self._by_size):
            return None
        length, off = self._by_size[i]
        self._remove_free(off, length)
        if length > need:
            self._add_free(off + need, length - need)
        self.allocated += need
        return off

    def high_water(self) -> int:
        """The end of the highest extent handed out (0 when none is): every byte from it
        to ``size`` is free."""
        tail = self._ends.get(self.size)
        return self.size if tail is None else tail

    def free(self, off: int, n: int) -> None:
        """Return the extent at *off* that was allocated for *n* bytes."""
        length = self.round(n)
        self.allocated -= length
        before = self._ends.get(off)
        if before is not None:
            blen = self._starts[before]
            self._remove_free(before, blen)
            off, length = before, blen + length
        after_len = self._starts.get(off + length)
        if after_len is not None:
            self._remove_free(off + length, after_len)
            length += after_len
        self._add_free(off, length)

    @property
    def free_bytes(self) -> int:
        return self.size - self.allocated

    @property
    def largest_free(self) -> int:
        return self._by_size[-1][0] if self._by_size else 0

    @property
    def holes(self) -> int:
        return len(self._by_size)
