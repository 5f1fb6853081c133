"""ARC whose lists keep prefix chains ordered leaf before root."""

from __future__ import annotations

from collections.abc import Hashable

from .arc import ARC
from .recency import RecencyList

__all__ = ["PrefixARC"]


class PrefixARC(ARC):
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
        super().__init__()
        self._parent: dict = {}  # resident key -> its parent key

    @staticmethod
    def _list() -> RecencyList:
        return RecencyList()

    def _anchor(self, key) -> Hashable | None:
        return self._parent.get(key)

    def _forget(self, key) -> None:
        self._parent.pop(key, None)

    def insert(self, key, size: int = 0, parent=None) -> None:
        if parent is not None and parent != key and key not in self:
            self._parent[key] = parent
        super().insert(key, size, parent)
