"""Least frequently used, ties broken by least recent use."""

from __future__ import annotations

from collections import OrderedDict

from .base import EvictionPolicy

__all__ = ["LFU"]


class LFU(EvictionPolicy):
    """Evicts the block with the fewest accesses; among equals, the least recently used.

    An insert counts as one access. Buckets of equal frequency are ``OrderedDict``s in
    recency order, and the lowest non-empty frequency is tracked, so every operation is
    O(1) (the constant-time LFU of Shah, Mitra and Matani).
    """

    name = "lfu"

    def __init__(self) -> None:
        self._freq: dict = {}
        self._buckets: dict[int, OrderedDict] = {}
        self._min = 0

    def _bump(self, key, f: int) -> None:
        bucket = self._buckets[f]
        del bucket[key]
        if not bucket:
            del self._buckets[f]
            if self._min == f:
                self._min = f + 1
        self._freq[key] = f + 1
        self._buckets.setdefault(f + 1, OrderedDict())[key] = None

    def insert(self, key, size: int = 0, parent=None) -> None:
        f = self._freq.get(key)
        if f is not None:
            self._bump(key, f)
            return
        self._freq[key] = 1
        self._buckets.setdefault(1, OrderedDict())[key] = None
        self._min = 1

    def touch(self, key) -> None:
        f = self._freq.get(key)
        if f is not None:
            self._bump(key, f)

    def remove(self, key) -> None:
        f = self._freq.pop(key, None)
        if f is None:
            return
        bucket = self._buckets[f]
        del bucket[key]
        if not bucket:
            del self._buckets[f]
            if self._min == f:
                self._min = min(self._buckets, default=0)

    def victim(self):
        if not self._freq:
            return None
        bucket = self._buckets.get(self._min)
        if bucket is None:  # pragma: no cover - _min is kept exact; defensive
            self._min = min(self._buckets)
            bucket = self._buckets[self._min]
        return next(iter(bucket))

    def __len__(self) -> int:
        return len(self._freq)

    def __contains__(self, key) -> bool:
        return key in self._freq
