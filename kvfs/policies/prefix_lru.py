"""LRU over the leaves of prefix chains: a chain is evicted from its end back to its root."""

from __future__ import annotations

from collections import OrderedDict

from .base import EvictionPolicy
from .chains import ChainIndex

__all__ = ["PrefixLRU"]


class PrefixLRU(EvictionPolicy):
    """Evicts the least recently used *leaf*: a block none of whose children is resident.

    Plain LRU evicts a chain's root first, because an engine reads a chain from its root,
    so the root is always the oldest touch of the chain; that makes the whole chain useless
    while it still takes the space. Here inner blocks wait outside the LRU order; when the
    last child of a block leaves, the block joins the order at the least-recent end (its
    last use is never later than its children's, so it is the oldest leaf when its last
    child was the victim). Shared roots (system prompts) stay while any child stays.
    O(1) per operation.
    """

    name = "prefix-lru"

    def __init__(self) -> None:
        self._leaves: OrderedDict = OrderedDict()  # least recently used first
        self._inner: dict = {}  # resident blocks with resident children
        self._chains = ChainIndex()

    def insert(self, key, size: int = 0, parent=None) -> None:
        if key in self._leaves or key in self._inner:
            self.touch(key)
            return
        p = self._chains.add(key, parent)
        if p is not None and p in self._leaves:
            del self._leaves[p]
            self._inner[p] = None
        if self._chains.is_leaf(key):
            self._leaves[key] = None
        else:
            self._inner[key] = None

    def touch(self, key) -> None:
        if key in self._leaves:
            self._leaves.move_to_end(key)

    def remove(self, key) -> None:
        if key in self._leaves:
            del self._leaves[key]
        elif key in self._inner:
            del self._inner[key]
        else:
            return
        p = self._chains.drop(key)
        if p is not None and p in self._inner:
            del self._inner[p]
            self._leaves[p] = None
            self._leaves.move_to_end(p, last=False)

    def victim(self):
        if self._leaves:
            return next(iter(self._leaves))
        # Only a cycle of parents (never from a hash chain) leaves no leaf: fall back.
        return next(iter(self._inner), None)

    def __len__(self) -> int:
        return len(self._leaves) + len(self._inner)

    def __contains__(self, key) -> bool:
        return key in self._leaves or key in self._inner
