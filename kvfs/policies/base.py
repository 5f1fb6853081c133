"""The eviction-policy interface: decisions only, no I/O, no knowledge of tiers.

One policy instance orders the blocks of one tier. The store tells it what happens
(``insert``, ``touch``, ``remove``) and asks it for the next victim. Pinned blocks are
never in a policy: the store removes a block when it is pinned and inserts it again when
it is unpinned, so ``victim()`` always names a block that may be evicted.
"""

from __future__ import annotations

import abc
from typing import ClassVar

__all__ = ["EvictionPolicy"]


class EvictionPolicy(abc.ABC):
    """Orders one tier's evictable blocks.

    Keys are block names (any hashable works, the trace replayer uses ints). ``size`` is
    the block's footprint in bytes; ``parent`` is the key of the previous block of the
    same prefix chain when known, so prefix-aware policies can evict leaves first.
    Every method is O(1) or O(log n) amortized: the store calls them on every access.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def insert(self, key, size: int = 0, parent=None) -> None:
        """A block arrived in the tier (written, promoted or demoted into it).

        Inserting a key already present counts as a touch.
        """

    @abc.abstractmethod
    def touch(self, key) -> None:
        """The block was read from this tier (a hit). Unknown keys are ignored."""

    @abc.abstractmethod
    def remove(self, key) -> None:
        """The block left the tier (evicted, deleted, pinned). Unknown keys are ignored."""

    @abc.abstractmethod
    def victim(self):
        """The key to evict next, or ``None`` when the policy holds nothing.

        Does not remove it: the store calls :meth:`remove` once the block is gone.
        """

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def __contains__(self, key) -> bool: ...
