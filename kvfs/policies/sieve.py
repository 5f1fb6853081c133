"""SIEVE (Zhang et al., NSDI'24): a FIFO queue with one visited bit and a moving hand."""

from __future__ import annotations

from .base import EvictionPolicy

__all__ = ["SIEVE"]

_HEAD = object()  # sentinel: the list is circular through it; after it comes the oldest key


class SIEVE(EvictionPolicy):
    """Evicts the oldest block not visited since the hand last passed it.

    Blocks join at the new end of a FIFO list and never move. A hit sets the block's
    visited bit. ``victim`` moves the hand from where it stopped toward newer blocks
    (wrapping to the oldest), clearing visited bits, and stops at the first unvisited
    block; it returns that block and leaves the hand on it, so asking again before the
    ``remove`` gives the same answer. Amortized O(1) per operation.
    """

    name = "sieve"

    def __init__(self) -> None:
        # Doubly linked list over dicts; _next points toward newer keys.
        self._next: dict = {_HEAD: _HEAD}
        self._prev: dict = {_HEAD: _HEAD}
        self._visited: dict = {}
        self._hand = _HEAD  # _HEAD means "start at the oldest"

    def insert(self, key, size: int = 0, parent=None) -> None:
        if key in self._visited:
            self._visited[key] = True
            return
        last = self._prev[_HEAD]
        self._next[last] = key
        self._prev[key] = last
        self._next[key] = _HEAD
        self._prev[_HEAD] = key
        self._visited[key] = False

    def touch(self, key) -> None:
        if key in self._visited:
            self._visited[key] = True

    def remove(self, key) -> None:
        if self._visited.pop(key, None) is None:
            return
        prev, nxt = self._prev.pop(key), self._next.pop(key)
        self._next[prev] = nxt
        self._prev[nxt] = prev
        if self._hand == key:
            self._hand = nxt  # the hand continues toward newer blocks

    def victim(self):
        if not self._visited:
            return None
        hand = self._hand
        while True:
            if hand is _HEAD:
                hand = self._next[_HEAD]
            if not self._visited[hand]:
                self._hand = hand
                return hand
            self._visited[hand] = False
            hand = self._next[hand]

    def __len__(self) -> int:
        return len(self._visited)

    def __contains__(self, key) -> bool:
        return key in self._visited
