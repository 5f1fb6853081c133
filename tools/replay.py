"""Trace replay: kvfs's own eviction policies over a stack of tiers, and Belady's optimum.

The replayer plays the store and the engine. For each request it looks the blocks up in
order; a block is a **hit** only if it is in some tier *and* every earlier block of the
request was a hit (an engine stops reusing at the first miss). A hit is touched in its
tier; a hit in a lower tier is promoted (moved to the top tier). From the first miss on,
the engine recomputes the rest of the request and writes every block to the top tier:
new blocks are inserted, blocks already in the top tier are re-inserted (a touch), and a
copy left in a lower tier is replaced by the new top-tier copy. ``parent`` is always the
previous block of the request. Tiers are exclusive (a block lives in one tier); a full
tier's victim is demoted to the next tier, the bottom tier's victim is dropped.

Capacities are in blocks. Bytes are counted as ``blocks × block_bytes``: ``written`` is
what the engine wrote after misses, ``moved`` is promotions plus demotions between tiers.

Belady's MIN (evict the block whose next use is farthest away) needs the future, so it is
not a runtime policy: it lives here, fed by the replayer. Under these rules it is also the
optimum of the prefix hit ratio for one tier: a block's next use always comes after its
parent's (the parent is read just before it), so MIN never keeps a child without its
parent, and its plain hits are all prefix hits. For a stack of tiers it is the reference,
not a proven bound.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvfs.policies import EvictionPolicy, make_policy

__all__ = [
    "BELADY",
    "BLOCK_BYTES",
    "Belady",
    "ReplayStats",
    "TierSpec",
    "parse_stack",
    "replay",
]

BELADY = "belady"

# 512 tokens of Llama-3.1-8B KV in fp16: 2 (K, V) × 32 layers × 8 KV heads × 128 × 2 bytes
# = 128 KiB per token, 64 MiB per block.
BLOCK_BYTES = 512 * 2 * 32 * 8 * 128 * 2


@dataclass(frozen=True, kw_only=True)
class TierSpec:
    """One tier of the replayed stack: a name and a capacity in blocks (≥ 1)."""

    name: str
    capacity: int


@dataclass(frozen=True, kw_only=True)
class ReplayStats:
    """What one replay measured. ``tier_hits[i]`` counts hits served by tier ``i``."""

    policy: str
    tiers: tuple[TierSpec, ...]
    requests: int
    accesses: int
    hits: int
    tier_hits: tuple[int, ...]
    written_blocks: int
    promotions: int
    demotions: int
    dropped: int
    block_bytes: int

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    @property
    def bytes_written(self) -> int:
        return self.written_blocks * self.block_bytes

    @property
    def bytes_moved(self) -> int:
        return (self.promotions + self.demotions) * self.block_bytes


def parse_stack(text: str, *, distinct: int | None = None) -> tuple[TierSpec, ...]:
    """``"2000"`` → one tier; ``"dram=1000,disk=8000"`` → a stack, hottest first.

    A capacity may be a percentage (``"5%"``, ``"dram=1%,disk=10%"``) of *distinct*, the
    number of distinct blocks in the trace, so one setting fits traces of any size.
    Raises ``ValueError`` saying which part is wrong.
    """
    text = text.strip()
    if "=" not in text:
        return (TierSpec(name="tier0", capacity=_blocks(text, text, distinct)),)
    tiers = []
    for part in text.split(","):
        name, sep, cap = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{part!r} in {text!r}: write NAME=BLOCKS, e.g. dram=1000,disk=8000")
        tiers.append(TierSpec(name=name.strip(), capacity=_blocks(cap, text, distinct)))
    if len({t.name for t in tiers}) != len(tiers):
        raise ValueError(f"{text!r}: tier names repeat")
    return tuple(tiers)


def _blocks(value: str, whole: str, distinct: int | None) -> int:
    value = value.strip()
    try:
        if value.endswith("%"):
            if distinct is None:
                raise ValueError(f"{whole!r}: a percentage needs the trace's block count")
            n = round(float(value[:-1]) / 100 * distinct)
        else:
            n = int(value)
    except ValueError as exc:
        if "percentage" in str(exc):
            raise
        raise ValueError(f"{value!r} in {whole!r} is not a whole number of blocks or a percentage") from None
    if n < 1:
        raise ValueError(f"{whole!r}: a tier holds at least one block (got {n})")
    return n


class Belady(EvictionPolicy):
    """MIN: the victim is the block whose next use is farthest in the future.

    ``next_use`` is owned by the replayer, which sets ``next_use[key]`` to the position of
    the key's next access (``math.inf`` if none) before each insert or touch of *key* at
    an access. Entries are kept in a max-heap with lazy deletion: O(log n) amortized.
    Ties go to the block that was scheduled first.
    """

    name = BELADY

    def __init__(self, next_use: dict) -> None:
        self._next_use = next_use
        self._at: dict = {}  # resident key -> the next use its heap entry carries
        self._heap: list = []
        self._seq = 0

    def _schedule(self, key) -> None:
        nxt = self._next_use.get(key, math.inf)
        self._at[key] = nxt
        self._seq += 1
        heapq.heappush(self._heap, (-nxt, self._seq, key))

    def insert(self, key, size: int = 0, parent=None) -> None:
        self._schedule(key)

    def touch(self, key) -> None:
        if key in self._at:
            self._schedule(key)

    def remove(self, key) -> None:
        self._at.pop(key, None)

    def victim(self):
        heap, at = self._heap, self._at
        while heap:
            neg, _, key = heap[0]
            if at.get(key) == -neg:
                return key
            heapq.heappop(heap)
        return None

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key) -> bool:
        return key in self._at


def _next_uses(requests: Sequence[Sequence[int]]) -> list[float]:
    """For each access position, the position of the same block's next access (or inf)."""
    flat = [b for r in requests for b in r]
    out: list[float] = [math.inf] * len(flat)
    last: dict = {}
    for i in range(len(flat) - 1, -1, -1):
        b = flat[i]
        out[i] = last.get(b, math.inf)
        last[b] = i
    return out


def replay(
    requests: Sequence[Sequence[int]],
    tiers: Sequence[TierSpec],
    policy: str,
    *,
    block_bytes: int = BLOCK_BYTES,
    factory: Callable[[], EvictionPolicy] | None = None,
) -> ReplayStats:
    """Replay *requests* over *tiers* with one *policy* instance per tier.

    *policy* is a registry name (built with :func:`kvfs.policies.make_policy`) or
    ``"belady"``; *factory*, when given, builds the instances instead (tests use it) and
    *policy* is only the label. Raises ``KeyError`` for an unknown policy name and
    ``ValueError`` for an empty stack.
    """
    if not tiers:
        raise ValueError("a replay needs at least one tier")
    oracle = policy == BELADY and factory is None
    next_use: dict = {}
    if oracle:
        nxt = _next_uses(requests)
        pols = [Belady(next_use) for _ in tiers]
    else:
        build = factory or (lambda: make_policy(policy))
        pols = [build() for _ in tiers]
    caps = [t.capacity for t in tiers]
    used = [0] * len(tiers)
    where: dict = {}  # block -> tier index
    parent_of: dict = {}
    bottom = len(tiers) - 1
    demotions = dropped = 0

    def place(t: int, key, parent) -> None:
        nonlocal demotions, dropped
        pols[t].insert(key, block_bytes, parent)
        where[key] = t
        used[t] += 1
        while used[t] > caps[t]:
            v = pols[t].victim()
            pols[t].remove(v)
            del where[v]
            used[t] -= 1
            if t < bottom:
                demotions += 1
                place(t + 1, v, parent_of.get(v))
            else:
                dropped += 1

    hits = written = promotions = pos = 0
    tier_hits = [0] * len(tiers)
    top = pols[0]
    for request in requests:
        prev = None
        hitting = True
        for key in request:
            if oracle:
                next_use[key] = nxt[pos]
            pos += 1
            if key not in parent_of and prev is not None:
                parent_of[key] = prev
            t = where.get(key)
            if hitting and t is not None:
                hits += 1
                tier_hits[t] += 1
                if t == 0:
                    top.touch(key)
                else:
                    pols[t].remove(key)
                    del where[key]
                    used[t] -= 1
                    promotions += 1
                    place(0, key, prev)
            else:
                hitting = False
                if t == 0:
                    top.insert(key, block_bytes, prev)  # rewritten in place: a touch
                else:
                    if t is not None:
                        pols[t].remove(key)
                        del where[key]
                        used[t] -= 1
                    written += 1
                    place(0, key, prev)
            prev = key
    return ReplayStats(
        policy=policy,
        tiers=tuple(tiers),
        requests=len(requests),
        accesses=pos,
        hits=hits,
        tier_hits=tuple(tier_hits),
        written_blocks=written,
        promotions=promotions,
        demotions=demotions,
        dropped=dropped,
        block_bytes=block_bytes,
    )
