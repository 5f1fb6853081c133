"""ARC whose lists keep prefix chains ordered leaf before root."""

from __future__ import annotations

from collections import OrderedDict

from .arc import remember_evicted
from .base import EvictionPolicy
from .recency import RecencyList

__all__ = ["PrefixARC"]


class PrefixARC(EvictionPolicy):
    """Adaptive replacement (see :class:`~kvfs.policies.arc.ARC`) with leaf-first lists.

    T1 holds blocks seen once, T2 blocks seen twice or more; ``victim`` is the oldest of
    T1 while T1 is longer than the adaptive target ``p`` (or T2 is empty), else the oldest
    of T2; ghost hits in B1 grow ``p``, in B2 shrink it. The difference from ARC is where
    a block goes when it is inserted or hit: just on the older side of its parent if the
    parent is in the same list, else at the new end. An engine reads a chain root first,
    so every chain in a list stays ordered leaf (oldest) to root, and a list gives up a
    chain's leaves before its parents; a shared root stays newer than all its children.

    ARC balances recency (a conversation's last turn) against frequency (a system prompt
    read by many requests); the leaf-first order keeps what it keeps usable. Capacity ``c``
    is the most blocks held at once, as in ARC. O(1) per operation.
    """

    name = "prefix-arc"

    def __init__(self) -> None:
        self._t1 = RecencyList()
        self._t2 = RecencyList()
        self._b1: OrderedDict = OrderedDict()
        self._b2: OrderedDict = OrderedDict()
        self._parent: dict = {}  # resident key -> its parent key
        self._p = 0.0
        self._c = 0
        self._pending = None

    def insert(self, key, size: int = 0, parent=None) -> None:
        if key in self._t1 or key in self._t2:
            self.touch(key)
            return
        if parent is not None and parent != key:
            self._parent[key] = parent
        b1, b2 = self._b1, self._b2
        if key in b1:
            self._p = min(float(self._c), self._p + max(len(b2) / len(b1), 1.0))
            del b1[key]
            self._t2.add(key, self._parent.get(key))
        elif key in b2:
            self._p = max(0.0, self._p - max(len(b1) / len(b2), 1.0))
            del b2[key]
            self._t2.add(key, self._parent.get(key))
        else:
            self._t1.add(key, self._parent.get(key))
        n = len(self._t1) + len(self._t2)
        self._c = max(self._c, n)

    def touch(self, key) -> None:
        if self._t1.discard(key) or self._t2.discard(key):
            self._t2.add(key, self._parent.get(key))

    def remove(self, key) -> None:
        if self._t1.discard(key):
            ghost = self._b1
        elif self._t2.discard(key):
            ghost = self._b2
        else:
            return
        self._parent.pop(key, None)
        if self._pending is not None and self._pending == key:
            self._pending = None
            remember_evicted(ghost, key, self._b1, self._b2, len(self._t1), len(self._t2), self._c)

    def victim(self):
        t1, t2 = self._t1, self._t2
        if len(t1) and (len(t1) > self._p or not len(t2)):
            key = t1.oldest()
        elif len(t2):
            key = t2.oldest()
        else:
            return None
        self._pending = key
        return key

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __contains__(self, key) -> bool:
        return key in self._t1 or key in self._t2
