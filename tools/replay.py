"""Trace replay: kvfs's own eviction policies over a stack of tiers, and Belady's optimum.

The replayer plays the store and the engine. For each request it looks the blocks up in
order; a block is a **hit** only if it is in some tier *and* every earlier block of the
request was a hit (an engine stops reusing at the first miss). A hit is touched in the
hottest tier holding it; a hit in a lower tier is promoted: copied into the top tier,
the lower copy stays (as the store does). From the first miss on, the engine recomputes
the rest of the request and writes every block that is not cached anywhere to the top
tier; a block that is still cached somewhere is not written again (engines check before
they store), its tier is told ``insert`` again, which the interface defines as a touch.
``parent`` is always the previous block of the request.

A full tier's victim is dropped if a colder tier holds a copy; otherwise it is the last
copy and is demoted: written into the next colder tier whose policy :meth:`admits
<kvfs.policies.EvictionPolicy.admit>` it (trying each in turn), or dropped when none
does or the bottom tier gave it up. That is the store's write-back.

Time: the policies get a clock that reads the request's arrival time (seconds) in timed
traces and the request's index in untimed ones. Hints (:class:`HintModel`) are what an
engine or router could tell: the blocks of queued requests (``SOON``), sessions that
ended (``ENDED``); they go to every tier's policy, as the store would pass them.

Capacities are in blocks. Bytes are counted as ``blocks × block_bytes``: ``written`` is
what the engine wrote after misses, ``tier_written[i]`` what each tier had written into
it (engine writes and promotions into the top tier, demotions into the others),
``moved`` is promotions plus demotions between tiers.

Belady's MIN (evict the block whose next use is farthest away) needs the future, so it is
not a runtime policy: it lives here, fed by the replayer. Under these rules it is also the
optimum of the prefix hit ratio for one tier: a block's next use always comes after its
parent's (the parent is read just before it), so MIN never keeps a child without its
parent, and its plain hits are all prefix hits. For a stack of tiers it is the reference,
not a proven bound; it admits into a colder tier only blocks that will be read again.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from kvfs.policies import EvictionPolicy, Hint, PolicyContext, make_policy

__all__ = [
    "BELADY",
    "BLOCK_BYTES",
    "Belady",
    "HintModel",
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
class HintModel:
    """The hints a replay sends, standing in for an engine or a router.

    ``soon``: when request *i* arrives, the blocks of request *i + soon* are hinted
    ``SOON`` (a router that sees *soon* requests queued; 0 sends none). ``ended``: the
    share of sessions whose client says ``ENDED`` after their last request (a user who
    closes the conversation), ``ended_delay`` after its arrival (seconds, or requests in
    an untimed trace), naming that request's blocks. Which sessions do is drawn with
    ``seed``. Traces without sessions get no ``ENDED`` hints.
    """

    soon: int = 0
    ended: float = 0.0
    ended_delay: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.soon < 0:
            raise ValueError(f"soon={self.soon}: the lookahead is a number of requests (>= 0)")
        if not 0.0 <= self.ended <= 1.0:
            raise ValueError(f"ended={self.ended}: a share of sessions, between 0 and 1")
        if self.ended_delay < 0:
            raise ValueError(f"ended_delay={self.ended_delay}: a delay is >= 0")

    @property
    def active(self) -> bool:
        return self.soon > 0 or self.ended > 0


@dataclass(frozen=True, kw_only=True)
class ReplayStats:
    """What one replay measured. ``tier_hits[i]`` counts hits served by tier ``i``,
    ``tier_written[i]`` blocks written into tier ``i`` (engine writes and promotions into
    the top tier, demotions into the others), ``refused`` demotions a colder tier's
    policy did not admit."""

    policy: str
    tiers: tuple[TierSpec, ...]
    requests: int
    accesses: int
    hits: int
    tier_hits: tuple[int, ...]
    tier_written: tuple[int, ...]
    written_blocks: int
    promotions: int
    demotions: int
    refused: int
    dropped: int
    hints: int
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

    def written_per_hit(self, tier: int) -> float | None:
        """Bytes written into *tier* per hit (of any tier); ``None`` without hits."""
        return self.tier_written[tier] * self.block_bytes / self.hits if self.hits else None


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

    def __init__(self, next_use: dict[Hashable, float]) -> None:
        self._next_use = next_use
        self._at: dict[Hashable, float] = {}  # resident key -> the next use its heap entry carries
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = 0

    def _schedule(self, key: Hashable) -> None:
        nxt = self._next_use.get(key, math.inf)
        self._at[key] = nxt
        self._seq += 1
        heapq.heappush(self._heap, (-nxt, self._seq, key))

    def insert(self, key: Hashable, size: int = 0, parent: Hashable | None = None) -> None:
        self._schedule(key)

    def touch(self, key: Hashable) -> None:
        if key in self._at:
            self._schedule(key)

    def remove(self, key: Hashable) -> None:
        self._at.pop(key, None)

    def victim(self) -> Hashable | None:
        heap, at = self._heap, self._at
        while heap:
            neg, _, key = heap[0]
            if at.get(key) == -neg:
                return key
            heapq.heappop(heap)
        return None

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def admit(self, key: Hashable, parent: Hashable | None = None, *, hits: int = 0, idle: float | None = None) -> bool:
        """Only blocks that will be read again are worth a write."""
        return self._next_use.get(key, math.inf) != math.inf


def _next_uses(requests: Sequence[Sequence[int]]) -> list[float]:
    """For each access position, the position of the same block's next access (or inf)."""
    flat = [b for r in requests for b in r]
    out: list[float] = [math.inf] * len(flat)
    last: dict[int, int] = {}
    for i in range(len(flat) - 1, -1, -1):
        b = flat[i]
        out[i] = last.get(b, math.inf)
        last[b] = i
    return out


def _ended_events(
    requests: Sequence[Sequence[int]], times: list[float], hints: HintModel
) -> list[tuple[float, int, int]]:
    """(time, request index) of the ENDED hints, in time order, for the sessions that send one."""
    if hints.ended <= 0:
        return []
    rng = random.Random(f"kvfs-hints-{hints.seed}")
    chosen: dict[object, bool] = {}
    out: list[tuple[float, int, int]] = []
    for i, r in enumerate(requests):
        session = getattr(r, "session", None)
        if session is None or not getattr(r, "last", False):
            continue
        if chosen.setdefault(session, rng.random() < hints.ended):
            out.append((times[i] + hints.ended_delay, i, i))
    out.sort()
    return out


def replay(
    requests: Sequence[Sequence[int]],
    tiers: Sequence[TierSpec],
    policy: str,
    *,
    block_bytes: int = BLOCK_BYTES,
    factory: Callable[[PolicyContext], EvictionPolicy] | None = None,
    hints: HintModel | None = None,
    context: PolicyContext | None = None,
) -> ReplayStats:
    """Replay *requests* over *tiers* with one *policy* instance per tier.

    *requests* are sequences of block ids; :class:`~kvfs.tools.traces.Request` objects
    also give times and sessions. *policy* is a registry name (built with
    :func:`kvfs.policies.make_policy`) or ``"belady"``; *factory*, when given, builds the
    instances from the replay's clock instead (tests use it) and *policy* is only the
    label. Both get a :class:`~kvfs.policies.PolicyContext` whose clock is the replay's
    and whose ``namespace_of`` reads the requests' namespaces; its tuning comes from
    *context*. *hints* sends hints (Belady ignores them: it knows the future). Raises
    ``KeyError`` for an unknown policy name, ``ValueError`` for an empty stack and
    ``RuntimeError`` if a policy names no victim while its tier is over capacity.
    """
    if not tiers:
        raise ValueError("a replay needs at least one tier")
    times = [float(i) for i in range(len(requests))]
    if requests and getattr(requests[0], "time", None) is not None:
        times = [r.time for r in requests]  # type: ignore[attr-defined]  # traces.Request (timed), checked above
    now = [0.0]

    def clock() -> float:
        return now[0]

    namespaces: dict[Hashable, Hashable] = {}
    for r in requests:
        ns = getattr(r, "namespace", None)
        if ns is not None:
            for b in r:
                namespaces.setdefault(b, ns)
    base = context or PolicyContext()
    ctx = PolicyContext(
        clock=clock,
        namespace_of=namespaces.get,
        admit_threshold=base.admit_threshold,
        hint_ttl=base.hint_ttl,
    )
    oracle = policy == BELADY and factory is None
    next_use: dict[Hashable, float] = {}
    if oracle:
        nxt = _next_uses(requests)
        pols: list[EvictionPolicy] = [Belady(next_use) for _ in tiers]
    else:
        pols = [factory(ctx) for _ in tiers] if factory else [make_policy(policy, context=ctx) for _ in tiers]
    hints = hints if hints is not None and hints.active and not oracle else None
    ended = _ended_events(requests, times, hints) if hints else []
    soon = hints.soon if hints else 0
    caps = [t.capacity for t in tiers]
    n = len(tiers)
    used = [0] * n
    written_to = [0] * n
    copies: dict[int, int] = {}  # block -> bitmask of the tiers holding a copy
    parent_of: dict[int, int] = {}
    read_count: dict[int, int] = {}  # block -> hits so far (the store's record counts them)
    last_seen: dict[int, float] = {}  # block -> time of its last access (the record's ``accessed``)
    demotions = dropped = refused = sent = 0

    def place(t: int, key: int, parent: int | None) -> None:
        nonlocal demotions, dropped, refused
        pols[t].insert(key, block_bytes, parent)
        copies[key] = copies.get(key, 0) | (1 << t)
        used[t] += 1
        written_to[t] += 1
        pol = pols[t]
        while used[t] > caps[t]:
            v = pol.victim()
            if v is None or not copies.get(v, 0) & (1 << t):
                raise RuntimeError(f"{policy}: tier {tiers[t].name} is over capacity and the policy named {v!r}")
            pol.remove(v)
            mask = copies[v] & ~(1 << t)
            copies[v] = mask
            used[t] -= 1
            if mask >> (t + 1):
                continue  # a colder copy remains: nothing to write
            vp = parent_of.get(v)
            for j in range(t + 1, n):
                if pols[j].admit(v, vp, hits=read_count.get(v, 0), idle=now[0] - last_seen.get(v, now[0])):
                    demotions += 1
                    place(j, v, vp)
                    break
                refused += 1
            else:
                dropped += 1
            if not copies.get(v, 0):
                copies.pop(v, None)  # no copy left (the colder tier may have given it up at once)

    def tell(keys: list[int], when: Hint) -> None:
        nonlocal sent
        sent += 1
        for p in pols:
            p.hint(keys, when)

    hits = written = promotions = pos = 0
    tier_hits = [0] * n
    e = 0
    for i, request in enumerate(requests):
        now[0] = times[i]
        while e < len(ended) and ended[e][0] <= times[i] and ended[e][1] < i:
            now[0] = ended[e][0]
            tell(list(requests[ended[e][2]]), Hint.ENDED)
            e += 1
        now[0] = times[i]
        if soon and i + soon < len(requests):
            tell(list(requests[i + soon]), Hint.SOON)
        prev: int | None = None
        hitting = True
        for key in request:
            if oracle:
                next_use[key] = nxt[pos]
            pos += 1
            last_seen[key] = now[0]
            if key not in parent_of and prev is not None:
                parent_of[key] = prev
            mask = copies.get(key, 0)
            if hitting and mask:
                t = (mask & -mask).bit_length() - 1  # the hottest copy
                hits += 1
                tier_hits[t] += 1
                read_count[key] = read_count.get(key, 0) + 1
                pols[t].touch(key)
                if t:
                    promotions += 1
                    place(0, key, prev)
            else:
                hitting = False
                if mask:
                    pols[(mask & -mask).bit_length() - 1].insert(key, block_bytes, prev)  # found: a touch
                else:
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
        tier_written=tuple(written_to),
        written_blocks=written,
        promotions=promotions,
        demotions=demotions,
        refused=refused,
        dropped=dropped,
        hints=sent,
        block_bytes=block_bytes,
    )
