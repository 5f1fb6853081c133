"""Admission into a colder tier: write a block down only if blocks like it get read there.

Every block a hotter tier gives up is, under write-back, a write into the next tier: an
SSD write for a disk tier. Most of them are never read back (a conversation that never
returns, the partial last block of a request, a block whose next use comes after the
tier has long forgotten it), and an SSD wears out by the bytes written, which is why
Dynamo gates disk offload by frequency. A frequency gate alone refuses too much for KV
caches, though: the first turn of a conversation is read once before it is written
down, and the next turn, minutes later, needs it from disk.

:class:`Admission` learns instead which *kinds* of blocks are read from this tier, and
refuses the kinds that almost never are. A block's kind (:meth:`Admission.kind`) is
what is known when it is offered:

- its namespace (a model, a tenant: reuse differs most between them),
- whether it has been read at all (``hits``),
- whether a block below it in its chain has been offered here: a block offered with no
  child is the end of what the engine wrote, usually the partial last block, which the
  next turn replaces,
- whether it was admitted here before and left without being read (its reuse comes
  later than this tier keeps blocks),
- how long it has been idle (a session quiet for long is likely over), in powers of 4
  of the clock's unit,
- whether its session was said to have ended (``Hint.ENDED``) while it was not here.

For every admitted block the policy reports whether it was read here before it left
(:meth:`hit`, :meth:`left`); per kind, the share read is the estimate. A kind is refused
once at least ``min_samples`` of its blocks have been seen and fewer than ``threshold``
of them were read; one offer in ``explore`` of a refused kind is admitted anyway, so the
estimate follows a workload that changes. Counts halve every ``half_life`` outcomes.
Memory: a few entries per resident block and per recently offered parent (bounded by
twice the tier's block count, ``capacity``). O(1) per call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

__all__ = ["Admission"]

_IDLE_BUCKETS = 6  # idle < 4, < 16, < 64, < 256, < 1024, >= 1024 (clock units; seconds in the store)


def _idle_bucket(idle: float | None) -> int:
    if idle is None or idle < 4.0:
        return 0
    b = 0
    while idle >= 4.0 and b < _IDLE_BUCKETS - 1:
        idle /= 4.0
        b += 1
    return b


class Admission:
    """Learns, per kind of block, the share of admitted blocks read from this tier.

    *capacity* returns the tier's size in blocks (the policy's estimate); the bounded
    memories scale with it. *namespace_of* maps a key to its namespace (``None``: one).
    ``threshold <= 0`` admits everything and learns nothing.
    """

    def __init__(
        self,
        *,
        threshold: float,
        capacity: Callable[[], int],
        namespace_of: Callable[[Hashable], Hashable] | None = None,
        min_samples: int = 32,
        explore: int = 32,
        half_life: int = 4096,
    ) -> None:
        self.threshold = threshold
        self._capacity = capacity
        self._namespace_of = namespace_of
        self._min = min_samples
        self._explore = explore
        self._half_life = half_life
        self._stats: dict[tuple, list[float]] = {}  # kind -> [outcomes, reads]
        self._pending: dict = {}  # admitted and resident, not read yet -> its kind
        self._parents: OrderedDict = OrderedDict()  # keys offered as a parent, most recent last
        self._unread: OrderedDict = OrderedDict()  # admitted before, left unread
        self._ended: OrderedDict = OrderedDict()  # named by an ENDED hint while absent
        self._outcomes = 0
        self._refusals = 0
        self.offered = 0
        self.refused = 0

    def _bound(self, memory: OrderedDict) -> None:
        limit = max(64, 2 * self._capacity())
        while len(memory) > limit:
            memory.popitem(last=False)

    def kind(self, key, hits: int, idle: float | None) -> tuple:
        """The kind of *key* as offered now (see the module docstring)."""
        ns = self._namespace_of(key) if self._namespace_of is not None else None
        return (
            ns,
            hits > 0,
            key in self._parents,
            key in self._unread,
            _idle_bucket(idle),
            key in self._ended,
        )

    def estimate(self, kind: tuple) -> float | None:
        """The share of blocks of *kind* read here, or ``None`` before ``min_samples``."""
        st = self._stats.get(kind)
        if st is None or st[0] < self._min:
            return None
        return st[1] / st[0]

    def offer(self, key, parent, hits: int, idle: float | None) -> bool:
        """Whether to admit *key* now; remembers its kind if admitted."""
        if self.threshold <= 0:
            return True
        self.offered += 1
        if parent is not None:
            self._parents[parent] = None
            self._parents.move_to_end(parent)
            self._bound(self._parents)
        kind = self.kind(key, hits, idle)
        p = self.estimate(kind)
        if p is not None and p < self.threshold:
            self._refusals += 1
            if self._refusals % self._explore:
                self.refused += 1
                return False
        self._pending[key] = kind
        self._unread.pop(key, None)
        self._ended.pop(key, None)
        return True

    def hit(self, key) -> None:
        """*key* was read from this tier (only its first read after admission counts)."""
        kind = self._pending.pop(key, None)
        if kind is not None:
            self._outcome(kind, 1.0)

    def left(self, key) -> None:
        """*key* left this tier (evicted, deleted): unread if it was never read here."""
        kind = self._pending.pop(key, None)
        if kind is not None:
            self._outcome(kind, 0.0)
            self._unread[key] = None
            self._bound(self._unread)

    def ended(self, keys: Iterable, resident: Callable[[Hashable], bool]) -> None:
        """*keys* belong to a session that ended; those not resident here are remembered."""
        if self.threshold <= 0:
            return
        for k in keys:
            if not resident(k):
                self._ended[k] = None
        self._bound(self._ended)

    def _outcome(self, kind: tuple, read: float) -> None:
        st = self._stats.get(kind)
        if st is None:
            st = self._stats[kind] = [0.0, 0.0]
        st[0] += 1.0
        st[1] += read
        self._outcomes += 1
        if self._outcomes >= self._half_life:
            self._outcomes = 0
            for s in self._stats.values():
                s[0] *= 0.5
                s[1] *= 0.5
