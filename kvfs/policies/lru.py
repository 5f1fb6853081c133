"""Least recently used."""

from __future__ import annotations

from .fifo import FIFO

__all__ = ["LRU"]


class LRU(FIFO):
    """Evicts the block whose last insert or touch is oldest.

    Order: an ``OrderedDict`` from least to most recently used; touch moves a key to the
    end, ``victim`` is the first key. O(1) for every operation. A :class:`FIFO` whose
    inserts and touches move the key to the newest end (the order, ``remove`` and
    ``victim`` are FIFO's).
    """

    name = "lru"

    def insert(self, key, size: int = 0, parent=None) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key) -> None:
        if key in self._order:
            self._order.move_to_end(key)
