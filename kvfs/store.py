"""The store: the one place that moves bytes between tiers.

It seals blocks into the hottest tier that takes them, evicts by policy when a tier is
full (demoting a block whose last copy is there, write-back), copies blocks down in the
background for write-through tiers, promotes blocks read from colder tiers, verifies
every copy read from a persistent tier against the block's checksum, and rebuilds the
catalog from the local persistent tiers when it starts.

The store is one class assembled from one module per concern: this one (placement,
eviction, reads, names), ``kvfs.writeback`` (write-through copies and the flush),
``kvfs.discovery`` (what shared tiers hold: other nodes' blocks, negative cache,
listings) and ``kvfs.steering`` (pin, prefetch, evict, du, fsck).

Threading: every public method is thread-safe. Catalog and policy changes happen under
one lock; reads from persistent tiers run outside it, so a slow disk read never stalls a
hit in DRAM. Background work (write-through) is not run by the store itself: its owner
calls :meth:`run_pending` from its own task (the daemon does so from its nursery), so
the store starts no threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from .blockfile import checksum as compute_checksum
from .catalog import BlockRecord, Catalog
from .config import PolicyConfig, PromoteMode, WriteMode
from .discovery import SharedTierDiscovery
from .errors import (
    BlockCorrupt,
    BlockNotFound,
    IsADirectory,
    KvfsError,
    NoSpace,
    TierFull,
    TierUnavailable,
)
from .events import EventKind, EventLog
from .names import normalize
from .policies import EvictionPolicy, make_policy
from .stats import StoreStatistics, TierCounters, TierStatistics
from .steering import LastCopy, StoreSteering, Usage
from .tier import BlockRef, Tier
from .writeback import WriteBack

__all__ = ["BlockStat", "LastCopy", "Store", "StoreBusy", "Usage"]

log = logging.getLogger("kvfs.store")

_RETRY_UNHEALTHY = 5.0  # seconds before an unhealthy tier is tried again


class StoreBusy(KvfsError):
    """Raised by :meth:`Store.nowait` when the store's lock is held right now (a placement
    or eviction is running in another thread); the caller retries from a worker thread."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockStat:
    """A snapshot of one block's record."""

    name: str
    size: int
    checksum: int
    tiers: tuple[str, ...]
    """Names of the tiers holding a copy, hottest first."""
    pinned: bool
    hits: int
    created: float
    accessed: float
    parent: str | None = None
    """The previous block of its prefix chain, when the writer said (prefix-aware eviction)."""

    @property
    def checksum_hex(self) -> str:
        return f"xxh3-64:{self.checksum:016x}"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "size": self.size,
            "checksum": self.checksum_hex,
            "tiers": list(self.tiers),
            "pinned": self.pinned,
            "hits": self.hits,
            "created": self.created,
            "accessed": self.accessed,
            "parent": self.parent,
        }


class Store(WriteBack, SharedTierDiscovery, StoreSteering):
    """Blocks by name over a stack of tiers, hottest first.

    *tiers* are open :class:`Tier` objects; *policy* picks the eviction policy and when
    reads promote; *clock* returns seconds (wall clock by default, pass a fake in tests);
    *make_policy* builds one eviction policy per tier.
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        *,
        policy: PolicyConfig = PolicyConfig(),
        clock: Callable[[], float] = time.time,
        policy_factory: Callable[[str], EvictionPolicy] = make_policy,
        rebuild: bool = True,
        negative_ttl: float = 2.0,
        listing_ttl: float = 5.0,
    ) -> None:
        if not tiers:
            raise ValueError("a store needs at least one tier")
        self.tiers: list[Tier] = list(tiers)
        self.policy = policy
        self._clock = clock
        self._lock = threading.RLock()
        n = len(self.tiers)
        self.catalog = Catalog(n)
        self._policies = [policy_factory(policy.eviction) for _ in range(n)]
        self._counters = [TierCounters() for _ in range(n)]
        self._unhealthy_until = [0.0] * n
        self._healthy = [True] * n
        self._persistent_mask = sum(1 << i for i, t in enumerate(self.tiers) if t.persistent)
        self._through = [i for i, t in enumerate(self.tiers) if i > 0 and t.config.write is WriteMode.THROUGH]
        self._pending: deque[tuple[BlockRecord, int]] = deque()
        self._lookups = 0
        self._misses = 0
        # Shared tiers (issue 4): what other nodes may have written or deleted.
        self._shared = [i for i, t in enumerate(self.tiers) if t.shared]
        self._shared_mask = sum(1 << i for i in self._shared)
        self.negative_ttl = negative_ttl
        self.listing_ttl = listing_ttl
        self._negative: dict[str, float] = {}  # name -> until when "no shared tier has it" holds
        self._listings: dict[str, tuple[float, dict[str, bool]]] = {}  # dir -> (until, shared listing)
        self.events = EventLog()
        if rebuild:
            self.rebuild()

    # -- helpers -------------------------------------------------------------------

    def tier_index(self, name: str) -> int:
        for i, t in enumerate(self.tiers):
            if t.name == name:
                return i
        raise KeyError(f"no tier named {name!r}; tiers: {', '.join(t.name for t in self.tiers)}")

    def _emit(self, kind: EventKind, rec: BlockRecord | str, tier: int | None = None, detail: str = "") -> None:
        name = rec if isinstance(rec, str) else rec.name
        size = 0 if isinstance(rec, str) else rec.size
        self.events.emit(self._clock(), kind, name, None if tier is None else self.tiers[tier].name, size, detail)

    def _footprint(self, i: int, rec: BlockRecord) -> int:
        return self.tiers[i].footprint(rec.name, rec.size)

    def _usable(self, i: int) -> bool:
        if self._healthy[i]:
            return True
        return self._clock() >= self._unhealthy_until[i]  # half-open: try again

    def _mark_unhealthy(self, i: int, exc: BaseException) -> None:
        self._counters[i].errors += 1
        if self._healthy[i]:
            log.warning("tier %s is unhealthy: %s", self.tiers[i].name, exc)
        self._healthy[i] = False
        self._unhealthy_until[i] = self._clock() + _RETRY_UNHEALTHY

    def _mark_healthy(self, i: int) -> None:
        if not self._healthy[i]:
            log.warning("tier %s answers again", self.tiers[i].name)
            self._healthy[i] = True

    # Policies are keyed by block *name*, not by record: a name keeps its history (ARC's
    # and S3-FIFO's ghost lists) across a rewrite, and a parent is named before it exists.

    def _policy_insert(self, i: int, rec: BlockRecord) -> None:
        self._policies[i].insert(rec.name, self._footprint(i, rec), rec.parent)

    def _add_copy(self, i: int, rec: BlockRecord) -> None:
        rec.tiers |= 1 << i
        self.catalog.count_in(i, self._footprint(i, rec), rec.name)
        if not rec.pinned:
            self._policy_insert(i, rec)

    def _forget_copy(self, i: int, rec: BlockRecord, *, policy: bool = True) -> None:
        """Drop tier *i* from the record (the copy is already gone or overwritten).
        ``policy=False`` leaves the policy entry, which belongs to a replacing record."""
        if rec.tiers & (1 << i):
            rec.tiers &= ~(1 << i)
            self.catalog.count_out(i, self._footprint(i, rec), rec.name)
            if policy:
                self._policies[i].remove(rec.name)

    def _drop_copy(self, i: int, rec: BlockRecord) -> None:
        """Delete the copy in tier *i* and drop it from the record."""
        try:
            self.tiers[i].delete(rec.name)
        except TierUnavailable as exc:
            self._mark_unhealthy(i, exc)  # an orphan copy is harmless: it fails the checksum or is replaced
        self._forget_copy(i, rec)

    def _lose_if_empty(self, rec: BlockRecord, why: str) -> None:
        if rec.tiers == 0 and self.catalog.get(rec.name) is rec:
            self.catalog.discard(rec)
            self._emit(EventKind.REMOVED, rec, detail=why)

    # -- placement and eviction ----------------------------------------------------

    def _make_room(self, i: int, need: int) -> bool:
        """Evict from tier *i* until *need* more bytes fit; False if they cannot."""
        cap = self.tiers[i].capacity
        if cap is None:
            return True
        if need > cap:
            return False
        while self.catalog.used[i] + need > cap:
            victim = self._victim(i)
            if victim is None:
                return False
            self._evict_copy(i, victim)
        return True

    def _victim(self, i: int) -> BlockRecord | None:
        """The record the policy of tier *i* would evict next (None when it holds nothing)."""
        while True:
            name = self._policies[i].victim()
            if name is None:
                return None
            rec = self.catalog.get(name)
            if rec is not None and rec.tiers & (1 << i) and not rec.pinned:
                return rec
            self._policies[i].remove(name)  # defensive: an entry without a copy is dropped

    def _evict_copy(self, i: int, rec: BlockRecord) -> None:
        """Remove the copy in tier *i* to make room; demote it first if it is the last."""
        if not rec.tiers >> (i + 1):
            self._demote(i, rec)
        self._drop_copy(i, rec)
        self._counters[i].evictions += 1
        self._emit(EventKind.EVICTED, rec, i)
        self._lose_if_empty(rec, "evicted from the last tier")

    def _demote(self, i: int, rec: BlockRecord) -> bool:
        """Copy the block from tier *i* into the first colder tier that takes it."""
        if i + 1 >= len(self.tiers):
            return False
        self._policies[i].remove(rec.name)  # not a victim candidate while it moves
        try:
            ref = self.tiers[i].open(rec.name)
        except (BlockNotFound, BlockCorrupt, TierUnavailable) as exc:
            log.warning("cannot demote %s from %s: %s", rec.name, self.tiers[i].name, exc)
            return False
        with ref:
            for j in range(i + 1, len(self.tiers)):
                if self._place(j, rec, ref.data, EventKind.DEMOTED):
                    return True
        return False

    def _place(self, i: int, rec: BlockRecord, data, kind: EventKind) -> bool:
        """Put *data* into tier *i*, evicting by policy to make room; False if it cannot."""
        if not self._usable(i):
            return False
        tier = self.tiers[i]
        if not self._make_room(i, self._footprint(i, rec)):
            return False
        while True:
            try:
                tier.put(rec.name, data, rec.checksum)
                break
            except TierFull:
                victim = self._victim(i)
                if victim is None:
                    return False
                self._evict_copy(i, victim)
            except TierUnavailable as exc:
                self._mark_unhealthy(i, exc)
                return False
        self._mark_healthy(i)
        self._add_copy(i, rec)
        c = self._counters[i]
        c.bytes_written += rec.size
        if kind is EventKind.STORED:
            c.stored += 1
        elif kind is EventKind.PROMOTED:
            c.promotions += 1
        elif kind is EventKind.DEMOTED:
            c.demotions += 1
        self._emit(kind, rec, i)
        return True

    # -- writing -------------------------------------------------------------------

    def put(self, name: str, data, *, parent: str | None = None) -> BlockStat:
        """Seal *data* as block *name*, replacing an existing block atomically.

        The block lands in the hottest tier that can take it (evicting by policy);
        write-through tiers below get a copy when :meth:`run_pending` runs. Readers that
        opened the old block keep its bytes. Raises :class:`NoSpace` when no tier can
        take it, :class:`IsADirectory` when *name* is a directory.
        """
        name = normalize(name)
        mv = memoryview(data).cast("B")
        csum = compute_checksum(mv)
        now = self._clock()
        with self._lock:
            if self.catalog.is_dir(name):
                raise IsADirectory(f"{name!r} is a directory")
            old = self.catalog.get(name)
            if old is None:
                self.catalog.ensure_dir(self._parent_dir(name))
            rec = BlockRecord(name, len(mv), csum, created=now, accessed=now, parent=parent)
            if old is not None:
                for j in old.tier_indexes():
                    self._policies[j].remove(name)
            placed = next((i for i in range(len(self.tiers)) if self._place(i, rec, mv, EventKind.STORED)), None)
            if placed is None:
                if old is not None and not old.pinned:
                    for j in old.tier_indexes():
                        self._policy_insert(j, old)
                raise NoSpace(
                    f"no tier can take {name!r} ({len(mv)} bytes): every tier is full of pinned blocks "
                    "or too small; unpin blocks or add capacity"
                )
            if old is not None:
                for j in list(old.tier_indexes()):
                    if j == placed:
                        self._forget_copy(j, old, policy=False)  # overwritten in place by the new copy
                    else:
                        self._drop_copy(j, old)
                self.catalog.discard(old)
            self.catalog.add(rec)
            self._negative.pop(name, None)
            for j in self._through:
                if j > placed:
                    self._pending.append((rec, j))
            return self._stat(rec)

    @staticmethod
    def _parent_dir(name: str) -> str:
        i = name.rfind("/")
        return name[:i] if i >= 0 else ""

    # -- reading -------------------------------------------------------------------

    def open(self, name: str, *, count_hit: bool = True) -> BlockRef:
        """A view of block *name*'s bytes, valid until released (use ``with``).

        Tries the copies hottest first; a copy from a persistent tier is checked against the
        block's checksum, and a bad one is dropped, counted and skipped. A copy read from a
        colder tier is promoted per the promote policy. Raises :class:`BlockNotFound` when no
        copy is readable: never partial or wrong bytes.
        """
        return self._read(name, count_hit, lambda tier, n: tier.open(n), lambda ref: (ref.data, ref.checksum))

    def read_into(self, name: str, out) -> int:
        """Copy the block into the writable buffer *out*; returns its length. Copies from
        persistent tiers are read straight into *out* and verified there."""
        out = memoryview(out).cast("B")

        def fetch(tier: Tier, n: str):
            # volatile tiers hand out a ref (taken under the lock); the copy happens below,
            # outside it. Persistent tiers read straight into *out* and verify it there.
            return tier.open(n) if not tier.persistent else tier.read_into(n, out)

        def unpack(r):
            return (r.data, r.checksum) if isinstance(r, BlockRef) else (out[: r[0]], r[1])

        result = self._read(name, True, fetch, unpack)
        if not isinstance(result, BlockRef):
            return result[0]
        with result:
            size = len(result.data)
            if len(out) < size:
                raise ValueError(f"buffer of {len(out)} bytes is too small for {name!r} ({size} bytes)")
            out[:size] = result.data
            return size

    def read(self, name: str) -> bytes:
        """The block's bytes (a copy)."""
        with self.open(name) as ref:
            return bytes(ref.data)

    def _read(self, name: str, count_hit: bool, fetch, unpack):
        """Read through the copies hottest first. *fetch(tier, name)* returns a result that
        *unpack* turns into ``(payload view, checksum)``; the first good result is returned."""
        name = normalize(name)
        self._refresh(name)
        with self._lock:
            rec = self.catalog.require(name)
            self._lookups += 1
            if count_hit:
                rec.hits += 1
                rec.accessed = self._clock()
            order = list(rec.tier_indexes())
        for i in order:
            result = self._fetch_copy(i, rec, fetch, unpack)
            if result is None:
                continue
            with self._lock:
                self._policies[i].touch(rec.name)
                c = self._counters[i]
                c.hits += 1
                c.bytes_read += rec.size
                if i > 0 and count_hit and self._should_promote(rec):
                    self._promote(rec, unpack(result)[0], i)
            return result
        with self._lock:
            self._misses += 1
            self._lose_if_empty(rec, "no readable copy")
            # Copies still recorded are in tiers that failed or are unhealthy: the block
            # exists but cannot be read now, which is not the same as missing.
            down = [self.tiers[i].name for i in rec.tier_indexes() if not self._healthy[i]]
            if down and self.catalog.get(name) is rec:
                raise TierUnavailable(
                    f"{name!r}: no readable copy now; the tiers holding it are unavailable: {', '.join(down)}"
                )
        raise BlockNotFound(name)

    def _should_promote(self, rec: BlockRecord) -> bool:
        mode = self.policy.promote
        return mode is PromoteMode.ALWAYS or (mode is PromoteMode.SECOND_HIT and rec.hits >= 2)

    def _promote(self, rec: BlockRecord, data, below: int) -> None:
        if self.catalog.get(rec.name) is not rec:
            return
        for k in range(below):
            if rec.tiers & (1 << k):
                return
            if self._place(k, rec, data, EventKind.PROMOTED):
                return

    def _fetch_copy(self, i: int, rec: BlockRecord, fetch, unpack):
        """*fetch* the copy in tier *i*, verified against the record; None if there is no
        good copy there (a bad or vanished copy is dropped from the record)."""
        tier = self.tiers[i]
        if not self._usable(i):
            return None
        if not tier.persistent:
            with self._lock:  # volatile tiers answer at memory speed: no need to leave the lock
                if not rec.tiers & (1 << i) or self.catalog.get(rec.name) is not rec:
                    return None
                try:
                    return fetch(tier, rec.name)
                except BlockNotFound:
                    self._forget_copy(i, rec)
                    return None
        try:
            result = fetch(tier, rec.name)
        except BlockNotFound:
            with self._lock:
                if self.catalog.get(rec.name) is rec:
                    self._forget_copy(i, rec)  # vanished (another node deleted it)
            return None
        except BlockCorrupt as exc:
            self._corrupt(i, rec, str(exc))
            return None
        except TierUnavailable as exc:
            with self._lock:
                self._mark_unhealthy(i, exc)
            return None
        data, csum = unpack(result)
        if csum != rec.checksum or len(data) != rec.size:
            if isinstance(result, BlockRef):
                result.release()
            with self._lock:
                replaced = self.catalog.get(rec.name) is not rec
                if not replaced and tier.shared:
                    # The copy verified against its own header, so another node replaced
                    # the block: not corruption, and never delete it; re-check on next lookup.
                    self._forget_copy(i, rec)
                    rec.checked = 0.0
                    replaced = True
            if not replaced:  # a replace racing this read is not corruption
                self._corrupt(i, rec, "copy does not match the block's checksum")
            return None
        with self._lock:
            self._mark_healthy(i)
        return result

    def _corrupt(self, i: int, rec: BlockRecord, why: str) -> None:
        with self._lock:
            self._counters[i].corrupt += 1
            log.error("corrupt copy of %s in tier %s dropped: %s", rec.name, self.tiers[i].name, why)
            self._emit(EventKind.CORRUPT, rec, i, why)
            if self.catalog.get(rec.name) is rec and rec.tiers & (1 << i):
                self._drop_copy(i, rec)

    # -- calls that never wait ------------------------------------------------------

    def nowait(self, fn, *args, **kwargs):
        """Run ``fn(*args)`` (a store method) only if the store's lock is free now, holding
        it throughout; otherwise raise :class:`StoreBusy` at once. For an event loop that
        must not wait behind an eviction that is writing to disk: on StoreBusy it makes the
        same call from a worker thread. Only for calls that touch nothing but the catalog
        and volatile tiers (no shared tiers configured), since the lock is held throughout.
        """
        if not self._lock.acquire(blocking=False):
            raise StoreBusy("the store is busy")
        try:
            return fn(*args, **kwargs)
        finally:
            self._lock.release()

    def open_hot(self, name: str) -> BlockRef | None:
        """A view of the block if its hottest copy is in a volatile tier (DRAM) and the
        store's lock is free now; ``None`` otherwise, never waiting: the caller then uses
        :meth:`open` from a worker thread. Counts a hit like :meth:`open`. *name* must be
        normalized."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            rec = self.catalog.get(name)
            if rec is None or not rec.tiers:
                return None
            i = next(rec.tier_indexes())
            tier = self.tiers[i]
            if tier.persistent or not self._usable(i):
                return None
            try:
                ref = tier.open(name)
            except BlockNotFound:
                return None
            self._lookups += 1
            rec.hits += 1
            rec.accessed = self._clock()
            self._policies[i].touch(name)
            c = self._counters[i]
            c.hits += 1
            c.bytes_read += rec.size
            return ref
        finally:
            self._lock.release()

    # -- lookups -------------------------------------------------------------------

    def _stat(self, rec: BlockRecord) -> BlockStat:
        return BlockStat(
            name=rec.name,
            size=rec.size,
            checksum=rec.checksum,
            tiers=tuple(self.tiers[i].name for i in rec.tier_indexes()),
            pinned=rec.pinned,
            hits=rec.hits,
            created=rec.created,
            accessed=rec.accessed,
            parent=rec.parent,
        )

    def stat(self, name: str) -> BlockStat:
        """The block's record; :class:`BlockNotFound` if absent."""
        name = normalize(name)
        self._refresh(name)
        with self._lock:
            return self._stat(self.catalog.require(name))

    def lookup(self, name: str) -> BlockStat | None:
        """Like :meth:`stat` but ``None`` for a missing block (and for a directory)."""
        name = normalize(name)
        self._refresh(name)
        with self._lock:
            rec = self.catalog.get(name)
            return None if rec is None else self._stat(rec)

    def exists(self, name: str) -> bool:
        return self.lookup(name) is not None

    def is_dir(self, name: str) -> bool:
        """True for a directory here or in a shared tier (from the cached parent listing)."""
        name = normalize(name)
        with self._lock:
            if self.catalog.is_dir(name):
                return True
            if not self._shared or name in self.catalog.blocks:
                return False
        parent, _, base = name.rpartition("/")
        return self._shared_listing(parent).get(base) is True

    def listdir(self, name: str = "") -> dict[str, bool]:
        """``{basename: is_dir}`` of a directory (a copy), including what the shared tiers
        hold there (their listing is cached for ``listing_ttl`` seconds)."""
        name = normalize(name)
        with self._lock:
            try:
                local: dict[str, bool] | None = dict(self.catalog.listdir(name))
                missing = None
            except BlockNotFound as exc:
                local, missing = None, exc
        if not self._shared:
            if missing is not None:
                raise missing
            return local
        remote = self._shared_listing(name)
        if local is None:
            if not remote:
                raise missing
            return dict(remote)
        now = self._clock()
        prefix = f"{name}/" if name else ""
        for base, is_dir in remote.items():
            if base not in local and not (not is_dir and self._negative.get(prefix + base, 0.0) > now):
                local[base] = is_dir
        return local

    def walk(self, directory: str = "") -> list[BlockStat]:
        """Every block at or under *directory*."""
        with self._lock:
            return [self._stat(r) for r in self.catalog.under(normalize(directory))]

    def mkdir(self, name: str, *, parents: bool = False) -> None:
        name = normalize(name)
        with self._lock:
            if parents:
                self.catalog.ensure_dir(name)
            else:
                self.catalog.mkdir(name)

    def rmdir(self, name: str) -> None:
        with self._lock:
            self.catalog.rmdir(normalize(name))

    # -- changing blocks -----------------------------------------------------------

    def delete(self, name: str) -> None:
        """Remove the block from every tier (shared ones too). :class:`BlockNotFound` if absent.

        Shared tiers get the delete even where this node has no record of a copy (another
        node may have written one since); those deletes run outside the store's lock so
        a hung shared tier does not stall local reads.
        """
        name = normalize(name)
        self._refresh(name)
        with self._lock:
            rec = self.catalog.require(name)
            self._discard_stale(rec, "deleted")  # local copies now; shared ones below
            self._negative[name] = self._clock() + self.negative_ttl
            self._listings.pop(self._parent_dir(name), None)
            shared = [i for i in self._shared if self._usable(i)]
        for i in shared:
            try:
                self.tiers[i].delete(name)
            except TierUnavailable as exc:
                with self._lock:
                    self._mark_unhealthy(i, exc)

    def rename(self, old: str, new: str) -> None:
        """Rename block *old* to *new*, atomically replacing a block named *new*."""
        old, new = normalize(old), normalize(new)
        self._refresh(old)
        with self._lock:
            rec = self.catalog.require(old)
            if old == new:
                return
            if self.catalog.is_dir(new):
                raise IsADirectory(f"{new!r} is a directory")
            target = self.catalog.get(new)
            if target is None:
                self.catalog.ensure_dir(self._parent_dir(new))
            moved = 0
            for i in list(rec.tier_indexes()):
                try:
                    self.tiers[i].rename(old, new)
                    moved |= 1 << i
                except (BlockNotFound, BlockCorrupt, TierUnavailable) as exc:
                    log.warning("rename %s -> %s failed in tier %s: %s", old, new, self.tiers[i].name, exc)
                    if isinstance(exc, TierUnavailable):
                        self._mark_unhealthy(i, exc)
                    self._forget_copy(i, rec)
            if target is not None:
                for j in list(target.tier_indexes()):
                    if moved & (1 << j):
                        self._forget_copy(j, target)
                    else:
                        self._drop_copy(j, target)
                self.catalog.discard(target)
            # footprints depend on the name (header length): recount under the new name
            for i in rec.tier_indexes():
                self.catalog.count_out(i, self._footprint(i, rec), rec.name)
                self._policies[i].remove(old)
            self.catalog.rename(rec, new)
            for i in rec.tier_indexes():
                self.catalog.count_in(i, self._footprint(i, rec), rec.name)
                if not rec.pinned:
                    self._policy_insert(i, rec)
            self._emit(EventKind.RENAMED, rec, detail=old)
            if not rec.tiers:
                self._lose_if_empty(rec, "no copy survived the rename")
                raise BlockNotFound(old)

    # -- rebuild and lifecycle -----------------------------------------------------

    def rebuild(self) -> int:
        """Add every block found in the local persistent tiers to the catalog; returns how
        many copies were found. The hotter tier's version wins when two disagree."""
        found = 0
        now = self._clock()
        with self._lock:
            for i, tier in enumerate(self.tiers):
                if not tier.persistent or tier.shared:
                    continue
                for info in tier.scan():
                    rec = self.catalog.get(info.name)
                    if rec is None:
                        rec = BlockRecord(info.name, info.size, info.checksum, created=now, accessed=now)
                        try:
                            self.catalog.add(rec)
                        except KvfsError as exc:
                            log.warning("rebuild: %s in tier %s skipped: %s", info.name, tier.name, exc)
                            continue
                    elif rec.checksum != info.checksum or rec.size != info.size or rec.tiers & (1 << i):
                        log.warning("rebuild: %s in tier %s differs from a hotter copy; ignored", info.name, tier.name)
                        continue
                    self._add_copy(i, rec)
                    found += 1
        return found

    def statistics(self) -> StoreStatistics:
        with self._lock:
            tiers = tuple(
                TierStatistics(
                    name=t.name,
                    kind=t.kind.value,
                    capacity=t.capacity,
                    used=self.catalog.used[i],
                    blocks=self.catalog.counts[i],
                    healthy=self._healthy[i],
                    persistent=t.persistent,
                    shared=t.shared,
                    **{f: getattr(self._counters[i], f) for f in TierCounters.__slots__},
                )
                for i, t in enumerate(self.tiers)
            )
            return StoreStatistics(
                blocks=len(self.catalog),
                lookups=self._lookups,
                misses=self._misses,
                pending_writes=len(self._pending),
                tiers=tiers,
            )

    def __len__(self) -> int:
        return len(self.catalog)

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self.catalog.names()))

    def close(self) -> None:
        """Close every tier. Call :meth:`flush` first to keep blocks that are only in DRAM."""
        for t in self.tiers:
            t.close()
