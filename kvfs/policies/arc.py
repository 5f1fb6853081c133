"""ARC (Megiddo and Modha, FAST'03): recency and frequency lists balanced by ghost hits."""

from __future__ import annotations

from collections import OrderedDict

from .base import EvictionPolicy

__all__ = ["ARC", "remember_evicted"]


def remember_evicted(ghost: OrderedDict, key, b1: OrderedDict, b2: OrderedDict, t1: int, t2: int, c: int) -> None:
    """Record an evicted *key* in its *ghost* list and trim the ghosts to ARC's bounds:
    ``|T1| + |B1| <= c`` and ``|T1| + |T2| + |B1| + |B2| <= 2c`` (oldest ghosts go first)."""
    ghost[key] = None
    while b1 and t1 + len(b1) > c:
        b1.popitem(last=False)
    while t1 + t2 + len(b1) + len(b2) > 2 * c:
        (b2 or b1).popitem(last=False)


class ARC(EvictionPolicy):
    """Adaptive replacement: T1 holds blocks seen once, T2 blocks seen twice or more.

    ``victim`` is the least recent block of T1 while T1 is longer than the target ``p``
    (or T2 is empty), else the least recent of T2. An evicted block's key goes to the
    matching ghost list (B1, B2). Inserting a key found in B1 grows ``p`` (recency was
    short), one found in B2 shrinks it; either way the block goes to T2. Ghost lists are
    trimmed so that T1+B1 ≤ c and all four lists ≤ 2c.

    The tier's capacity ``c`` is not passed in: it is the most blocks held at once. The
    tie rule of the paper that looks at the incoming key is dropped, because the store
    inserts before it asks for a victim. O(1) per operation.
    """

    name = "arc"

    def __init__(self) -> None:
        self._t1: OrderedDict = OrderedDict()
        self._t2: OrderedDict = OrderedDict()
        self._b1: OrderedDict = OrderedDict()
        self._b2: OrderedDict = OrderedDict()
        self._p = 0.0
        self._c = 0
        self._pending = None

    def insert(self, key, size: int = 0, parent=None) -> None:
        if key in self._t1 or key in self._t2:
            self.touch(key)
            return
        if key in self._b1:
            self._p = min(float(self._c), self._p + max(len(self._b2) / len(self._b1), 1.0))
            del self._b1[key]
            self._t2[key] = None
        elif key in self._b2:
            self._p = max(0.0, self._p - max(len(self._b1) / len(self._b2), 1.0))
            del self._b2[key]
            self._t2[key] = None
        else:
            self._t1[key] = None
        n = len(self._t1) + len(self._t2)
        self._c = max(self._c, n)

    def touch(self, key) -> None:
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        elif key in self._t2:
            self._t2.move_to_end(key)

    def remove(self, key) -> None:
        if key in self._t1:
            del self._t1[key]
            ghost = self._b1
        elif key in self._t2:
            del self._t2[key]
            ghost = self._b2
        else:
            return
        if self._pending is not None and self._pending == key:
            self._pending = None
            remember_evicted(ghost, key, self._b1, self._b2, len(self._t1), len(self._t2), self._c)

    def victim(self):
        t1, t2 = self._t1, self._t2
        if t1 and (len(t1) > self._p or not t2):
            key = next(iter(t1))
        elif t2:
            key = next(iter(t2))
        else:
            return None
        self._pending = key
        return key

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __contains__(self, key) -> bool:
        return key in self._t1 or key in self._t2
