"""ARC (Megiddo and Modha, FAST'03): recency and frequency lists balanced by ghost hits."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from .base import EvictionPolicy
from .recency import RecencyList

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

    The algorithm is written against a list that can place a key next to an anchor
    (:meth:`_list`, :meth:`_anchor`): here a plain queue that ignores the anchor;
    :class:`~kvfs.policies.prefix_arc.PrefixARC` anchors each block to its parent.
    """

    name = "arc"

    def __init__(self) -> None:
        self._t1 = self._list()
        self._t2 = self._list()
        self._b1: OrderedDict = OrderedDict()
        self._b2: OrderedDict = OrderedDict()
        self._p = 0.0
        self._c = 0
        self._pending = None

    @staticmethod
    def _list() -> _Queue | RecencyList:
        """A new resident list (T1, T2)."""
        return _Queue()

    def _anchor(self, key) -> Hashable | None:
        """The key next to which *key* goes when it enters T1 or T2 (None: the new end)."""
        return None

    def _forget(self, key) -> None:
        """*key* left the resident lists."""

    def insert(self, key, size: int = 0, parent=None) -> None:
        if key in self._t1 or key in self._t2:
            self.touch(key)
            return
        b1, b2 = self._b1, self._b2
        if key in b1:
            self._p = min(float(self._c), self._p + max(len(b2) / len(b1), 1.0))
            del b1[key]
            self._t2.add(key, self._anchor(key))
        elif key in b2:
            self._p = max(0.0, self._p - max(len(b1) / len(b2), 1.0))
            del b2[key]
            self._t2.add(key, self._anchor(key))
        else:
            self._t1.add(key, self._anchor(key))
        n = len(self._t1) + len(self._t2)
        self._c = max(self._c, n)

    def touch(self, key) -> None:
        if self._t1.discard(key) or self._t2.discard(key):
            self._t2.add(key, self._anchor(key))

    def remove(self, key) -> None:
        if self._t1.discard(key):
            ghost = self._b1
        elif self._t2.discard(key):
            ghost = self._b2
        else:
            return
        self._forget(key)
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


class _Queue(OrderedDict):
    """ARC's resident list: keys from least to most recent, with
    :class:`~kvfs.policies.recency.RecencyList`'s calls; an anchor is ignored (a key is
    added at the newest end)."""

    def add(self, key, anchor=None) -> None:
        self[key] = None

    def discard(self, key) -> bool:
        if key in self:
            del self[key]
            return True
        return False

    def oldest(self):
        return next(iter(self), None)
