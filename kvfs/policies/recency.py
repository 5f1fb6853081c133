"""A recency list that can place a block next to its parent instead of at the new end."""

from __future__ import annotations

__all__ = ["RecencyList"]


class RecencyList:
    """Keys from least to most recent, as a doubly linked list over two dicts. O(1) per call.

    ``add(key, anchor)`` puts *key* just on the older side of *anchor* when the anchor is
    in the list, else at the most recent end. An engine reads a chain root first, so a
    block is added right after its parent; anchoring it to the parent keeps every chain
    ordered leaf (older) before root (newer), and evicting from the old end takes leaves
    first, without tracking children.
    """

    __slots__ = ("_next", "_prev")

    _END = object()  # sentinel: its next is the oldest key, its prev the newest

    def __init__(self) -> None:
        self._next: dict = {self._END: self._END}
        self._prev: dict = {self._END: self._END}

    def __len__(self) -> int:
        return len(self._next) - 1

    def __contains__(self, key) -> bool:
        return key in self._next

    def __iter__(self):
        """Oldest first."""
        k = self._next[self._END]
        while k is not self._END:
            yield k
            k = self._next[k]

    def add(self, key, anchor=None) -> None:
        """Insert *key* (not present) before *anchor* if present, else as the newest."""
        before = anchor if anchor is not None and anchor in self._next else self._END
        p = self._prev[before]
        self._next[p] = key
        self._prev[key] = p
        self._next[key] = before
        self._prev[before] = key

    def discard(self, key) -> bool:
        """Unlink *key*; False if it was not there."""
        p = self._prev.pop(key, None)
        if p is None:
            return False
        n = self._next.pop(key)
        self._next[p] = n
        self._prev[n] = p
        return True

    def oldest(self):
        """The least recent key, or ``None`` when empty."""
        k = self._next[self._END]
        return None if k is self._END else k
