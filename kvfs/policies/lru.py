"""Least recently used."""

from __future__ import annotations

from collections import OrderedDict

from .base import EvictionPolicy

__all__ = ["LRU"]


class LRU(EvictionPolicy):
    """Evicts the block whose last insert or touch is oldest.

    Order: an ``OrderedDict`` from least to most recently used; touch moves a key to the
    end, ``victim`` is the first key. O(1) for every operation.
    """

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict = OrderedDict()

    def insert(self, key, size: int = 0, parent=None) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def remove(self, key) -> None:
        self._order.pop(key, None)

    def victim(self):
        return next(iter(self._order), None)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key) -> bool:
        return key in self._order
