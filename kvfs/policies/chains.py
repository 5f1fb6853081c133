"""Prefix chains seen by one policy: which resident blocks still have resident children.

A block is a *leaf* when no block inserted with it as ``parent`` is resident. An engine
uses a block only if every block before it in the chain is cached, so evicting a parent
before its children leaves the children useless; prefix-aware policies evict only leaves.
"""

from __future__ import annotations

__all__ = ["ChainIndex"]


class ChainIndex:
    """Counts resident children per parent key. O(1) per call.

    Children are counted whether or not the parent itself is resident, so a parent that
    arrives after its children (demoted to a lower tier later than them, or unpinned) is
    an inner block at once. A key given as its own parent is ignored.
    """

    __slots__ = ("_kids", "_parent")

    def __init__(self) -> None:
        self._parent: dict = {}  # resident key -> parent key (only when not None)
        self._kids: dict = {}  # key -> number of resident children (> 0 only)

    def add(self, key, parent):
        """*key* became resident under *parent*. Returns *parent* if it just stopped being a leaf."""
        if parent is None or parent == key:
            return None
        self._parent[key] = parent
        n = self._kids.get(parent, 0)
        self._kids[parent] = n + 1
        return parent if n == 0 else None

    def drop(self, key):
        """*key* left. Returns its parent if that parent just became a leaf."""
        parent = self._parent.pop(key, None)
        if parent is None:
            return None
        n = self._kids[parent] - 1
        if n:
            self._kids[parent] = n
            return None
        del self._kids[parent]
        return parent

    def is_leaf(self, key) -> bool:
        return key not in self._kids
