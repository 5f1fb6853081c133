"""First in, first out: the baseline that ignores hits."""

from __future__ import annotations

from collections import OrderedDict

from .base import EvictionPolicy

__all__ = ["FIFO"]


class FIFO(EvictionPolicy):
    """Evicts the block that arrived first; hits do not change the order.

    Re-inserting a present key is a touch, so it keeps its place. O(1) per operation.
    """

    name = "fifo"

    def __init__(self) -> None:
        self._order: OrderedDict = OrderedDict()

    def insert(self, key, size: int = 0, parent=None) -> None:
        if key not in self._order:
            self._order[key] = None

    def touch(self, key) -> None:
        pass

    def remove(self, key) -> None:
        self._order.pop(key, None)

    def victim(self):
        return next(iter(self._order), None)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key) -> bool:
        return key in self._order
