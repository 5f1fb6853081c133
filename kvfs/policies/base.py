"""The eviction-policy interface: decisions only, no I/O, no knowledge of tiers.

One policy instance orders the blocks of one tier. The store tells it what happens
(``insert``, ``touch``, ``remove``) and asks it for the next victim. Pinned blocks are
never in a policy: the store removes a block when it is pinned and inserts it again when
it is unpinned, so ``victim()`` always names a block that may be evicted.

Two optional parts have defaults here, so every policy supports them:

- :meth:`EvictionPolicy.admit` — asked before a block is written into this tier from a
  hotter one (the demotion of its last copy, a write-through copy): whether the write is
  worth it. A tier that refuses keeps its device from wearing out on blocks that would
  never be read from it. The default admits everything.
- :meth:`EvictionPolicy.hint` — what the engine or router knows ahead: ``Hint.SOON``
  (these blocks are in a request queue and will be read soon), ``Hint.ENDED`` (the
  session these blocks belong to is over). The default ignores hints.
"""

from __future__ import annotations

import abc
import enum
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar

__all__ = ["EvictionPolicy", "Hint", "PolicyContext", "namespace_of_name"]


def namespace_of_name(key: Hashable) -> Hashable:
    """The namespace of a kvfs block name: its first path component (``None`` for
    keys that are not names, such as the replayer's integers)."""
    if isinstance(key, str):
        return key.partition("/")[0]
    return None


@dataclass(frozen=True, kw_only=True)
class PolicyContext:
    """What a policy may know besides the calls it gets (policies with ``takes_context``).

    ``clock``: seconds, monotonic (the store's clock; the trace's time in the replayer).
    ``namespace_of``: a key's namespace, for per-namespace statistics.
    ``admit_threshold``: a colder tier admits a kind of block only if at least this share
    of such blocks was read from it (``0`` admits everything; see
    :mod:`kvfs.policies.admission`). ``hint_ttl``: how long a ``Hint.SOON`` keeps its
    blocks from eviction if they are not read (clock units).
    """

    clock: Callable[[], float] = field(default=time.monotonic)
    namespace_of: Callable[[Hashable], Hashable] = field(default=namespace_of_name)
    admit_threshold: float = 0.02
    hint_ttl: float = 30.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.admit_threshold < 1.0:
            raise ValueError(f"admit_threshold={self.admit_threshold}: a share, at least 0 and below 1")
        if not self.hint_ttl >= 0.0:
            raise ValueError(f"hint_ttl={self.hint_ttl}: a duration, at least 0")


class Hint(enum.Enum):
    """What a hint says about the blocks it names."""

    SOON = "soon"
    """They will be read soon: the requests are queued at the engine or router."""
    ENDED = "ended"
    """The session they belong to is over: its own blocks will not be read again (blocks
    it shares with other sessions, such as a system prompt, still may be)."""


class EvictionPolicy(abc.ABC):
    """Orders one tier's evictable blocks.

    Keys are block names (any hashable works, the trace replayer uses ints). ``size`` is
    the block's footprint in bytes; ``parent`` is the key of the previous block of the
    same prefix chain when known, so prefix-aware policies can evict leaves first.
    Every method is O(1) or O(log n) amortized: the store calls them on every access.

    ``takes_context``: the constructor takes a :class:`PolicyContext` (a clock and the
    tuning); :func:`kvfs.policies.make_policy` passes it.
    """

    name: ClassVar[str]
    takes_context: ClassVar[bool] = False

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

    def admit(self, key, parent=None, *, hits: int = 0, idle: float | None = None) -> bool:
        """Whether to write *key* into this tier when a hotter tier gives it up.

        Asked of the colder tier's policy before the store demotes the last copy of a
        block into it (or copies it down for write-through); *hits* is how many times
        the block has been read so far and *idle* how long ago it was last accessed,
        in the clock's unit (the store's record has both), *parent* as in
        :meth:`insert`. ``False`` means: do not write it here (the store drops the
        block, or tries the next colder tier), and the policy is not told ``insert``
        for it; ``True`` means the store goes on to ``insert`` it. Never changes the
        order of resident blocks. The default admits every block.
        """
        return True

    def hint(self, keys: Iterable, when: Hint) -> None:
        """Advice about *keys* (any of them may be absent from this tier: ignored).

        ``Hint.SOON``: keep them, they are about to be read. ``Hint.ENDED``: their
        session is over; blocks used only by it may go first. A hint never removes a
        block and never makes ``victim`` return a key that is not resident. The store
        passes every hint to every tier's policy. The default ignores hints.
        """
