"""One tier as the store sees it: the tier and the state the store keeps for it.

A :class:`TierSlot` holds, for one tier of the stack: the :class:`~kvfs.tier.Tier`
itself, its eviction policy, its counters, its health breaker, its limiter (the bounded
pool that runs the store's background calls to it, shared tiers only), the room reserved
for copies in flight, and the names whose copy in this tier is *busy*: being written,
being deleted, or leased to a reader outside the store. A busy copy is never chosen as a
victim, never overwritten and never deleted until it is idle again (see
:mod:`kvfs.placement`). Per-tier state lives on the slot, not in lists indexed by position.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .deadline import DeadlineExecutor
from .health import HealthBreaker
from .policies import EvictionPolicy, make_policy
from .stats import TierCounters, TierStatistics
from .tier import Tier

if TYPE_CHECKING:
    from .namespaces import NamespaceState

__all__ = ["TierSlot", "index_of"]

_BACKGROUND_WORKERS = 2  # threads per shared tier for revalidations and listings


@dataclass(eq=False)
class TierSlot:
    """The store's view of tier number *index* (0 = hottest)."""

    index: int
    tier: Tier
    policy: EvictionPolicy
    health: HealthBreaker
    counters: TierCounters = field(default_factory=TierCounters)
    limiter: DeadlineExecutor | None = None
    """Runs the store's background calls to a shared tier (revalidations, listing
    refreshes): at most a few at once, never waited for by local work."""
    reserved: int = 0
    """Bytes reserved for copies being written into this tier right now, and promised to
    blocks that will be sealed into it (``Placement.promise``)."""
    held: int = 0
    """Bytes of copies dropped from this tier that readers still hold (their room is not
    free yet: ``Tier.held_changes``); counted against its capacity like ``used``."""
    held_by: dict[int, tuple[NamespaceState | None, int]] = field(default_factory=dict)
    """token -> (the namespace it was counted against, bytes): the held copies."""
    busy: dict[str, int] = field(default_factory=dict)
    """name -> holds: copies with I/O in flight or leased (see the module doc)."""
    doomed: set[str] = field(default_factory=set)
    """Names whose file is to be deleted as soon as they are no longer busy."""

    @classmethod
    def build(
        cls,
        index: int,
        tier: Tier,
        *,
        eviction: str,
        clock: Callable[[], float] = time.time,
        policy_factory: Callable[[str], EvictionPolicy] = make_policy,
    ) -> TierSlot:
        limiter = None
        if tier.shared:
            limiter = DeadlineExecutor(
                f"{tier.name}-background", timeout=tier.config.timeout, workers=_BACKGROUND_WORKERS
            )
        return cls(
            index=index,
            tier=tier,
            policy=policy_factory(eviction),
            health=HealthBreaker(tier.name, clock=clock),
            limiter=limiter,
        )

    @property
    def name(self) -> str:
        return self.tier.name

    @property
    def bit(self) -> int:
        return 1 << self.index

    @property
    def persistent(self) -> bool:
        return self.tier.persistent

    @property
    def shared(self) -> bool:
        return self.tier.shared

    @property
    def capacity(self) -> int | None:
        return self.tier.capacity

    def footprint(self, name: str, size: int) -> int:
        return self.tier.footprint(name, size)

    def usable(self) -> bool:
        return self.health.usable()

    def failed(self, exc: BaseException) -> None:
        self.health.failed(exc)

    def answered(self) -> None:
        self.health.answered()

    # -- busy copies ---------------------------------------------------------------

    def is_busy(self, name: str) -> bool:
        return name in self.busy

    def hold(self, name: str) -> None:
        self.busy[name] = self.busy.get(name, 0) + 1

    def unhold(self, name: str) -> None:
        n = self.busy.get(name, 0) - 1
        if n > 0:
            self.busy[name] = n
        else:
            self.busy.pop(name, None)

    def statistics(self, used: int, blocks: int) -> TierStatistics:
        c = self.counters
        return TierStatistics(
            name=self.tier.name,
            kind=self.tier.kind.value,
            capacity=self.tier.capacity,
            used=used,
            blocks=blocks,
            healthy=self.health.healthy,
            persistent=self.tier.persistent,
            shared=self.tier.shared,
            hits=c.hits,
            bytes_read=c.bytes_read,
            bytes_written=c.bytes_written,
            stored=c.stored,
            promotions=c.promotions,
            demotions=c.demotions,
            evictions=c.evictions,
            corrupt=c.corrupt,
            errors=self.health.errors,
        )

    def close(self) -> None:
        if self.limiter is not None:
            self.limiter.close()
        self.tier.close()


def index_of(slots: Sequence[TierSlot], name: str) -> int:
    """The index of the tier named *name* among *slots*; :class:`KeyError` naming the
    tiers there are when none is."""
    for s in slots:
        if s.name == name:
            return s.index
    raise KeyError(f"no tier named {name!r}; tiers: {', '.join(s.name for s in slots)}")
