"""The store: blocks by name over a stack of tiers, hottest first.

It seals blocks into the hottest tier that takes them, evicts by policy when a tier is
full (demoting a block whose last copy is there, write-back), copies blocks down in the
background for write-through tiers, promotes blocks read from colder tiers, verifies
every copy read from a persistent tier against the block's checksum, learns what the
shared tiers hold, and rebuilds the catalog from the local persistent tiers when it starts.

The store is the assembly of collaborators that each own their state, and their facade
(docs/store.md); each takes the parts it uses, never the store:

- :class:`~kvfs.sealing.Sealing`: every write of a new block version (``put``, and the
  seal steps a client's reserved extent (:class:`~kvfs.ingest.Ingest`) and a peer's block
  share); :class:`~kvfs.reading.Reading`: every read (``open``, ``read_into``, the hot
  opens of the mount), the promotion decisions and the reads served outside the store;
- :class:`~kvfs.slot.TierSlot` per tier: the tier, its policy, counters, health breaker,
  limiter, reservations and busy names;
- :class:`~kvfs.placement.Placement`: the lock, the copy bookkeeping and every move of
  bytes (two-phase: reserve, copy outside the lock, commit or abort);
- :class:`~kvfs.shared.SharedView`: questions to the shared tiers, the negative and
  listing caches; :class:`~kvfs.revalidation.SharedRecords`: what they say applied to the
  catalog (discovery, background revalidation, shared deletes);
- :class:`~kvfs.backlog.WriteThroughQueue` and :class:`~kvfs.writeback.WriteBack`: the
  background copies and deletes, and the flush before unmount;
- :class:`~kvfs.steering.OperatorCommands`: pin, prefetch, evict, du, fsck;
- :class:`~kvfs.renames.Renames`: delete and rename;
- :class:`~kvfs.leases.Leases`: copies held for readers outside the store;
- :class:`~kvfs.namespaces.Namespaces`: tenants' and models' subtrees with their quotas
  (kept by the placement), access rules and lifetimes (:class:`~kvfs.lifetimes.Lifetimes`:
  soft pins and retention, swept by :meth:`Store.sweep`); :class:`~kvfs.tenancy.Tenancy`:
  their quotas and retention set at run time, and their figures.

Threading: every public method is thread-safe. Nothing that touches a persistent tier runs
under the store's lock, so a DRAM hit never waits behind a demotion or an upload, and no
local read or lookup ever waits on a shared tier: revalidation runs in the background (a
caller may wait for it at most ``shared_wait`` seconds). Only a name this node does not
know at all is looked up in the shared tiers in the caller's thread, bounded by their
deadlines. Background work (write-through) is run by the store's owner, which calls
:meth:`Store.run_pending` from its own task (the daemon does so from its nursery).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from .access import Operation, Peer, check, may_map_arena
from .backing import BackingFiles
from .backlog import WriteThroughQueue
from .batch import BatchReads, Probe
from .catalog import BlockIdentity, BlockRecord, BlockStat, Catalog
from .config import NamespaceConfig, PolicyConfig
from .errors import BlockNotFound, KvfsError, StoreBusy
from .events import EventLog
from .ingest import Ingest, Reservation
from .leases import Lease, Leases
from .lifetimes import Lifetimes, SweepReport
from .names import check_creatable, normalize, parent_of, split
from .namespaces import Namespaces, NamespaceState, NamespaceStatistics
from .opencopies import OpenCopies
from .peers import Elsewhere
from .placement import Placement
from .policies import EvictionPolicy, Hint, make_policy
from .promises import Promise
from .promotion import Promote
from .reading import Reading
from .rebuild import rebuild_catalog
from .renames import Renames
from .revalidation import SharedRecords
from .sealing import Sealing
from .shared import SharedView
from .slot import TierSlot, index_of
from .stats import StoreStatistics
from .steering import OperatorCommands, Usage
from .tenancy import Tenancy
from .tier import BlockRef, Tier
from .writeback import FlushReport, WriteBack

__all__ = [
    "BlockIdentity",
    "BlockStat",
    "FlushReport",
    "Lease",
    "Reservation",
    "Store",
    "StoreBusy",
    "SweepReport",
    "Usage",
]

log = logging.getLogger("kvfs.store")

T = TypeVar("T")


class Store:
    """Blocks by name over a stack of tiers, hottest first.

    *tiers* are open :class:`Tier` objects; *policy* picks the eviction policy and when
    reads promote; *clock* returns seconds (wall clock by default, pass a fake in tests);
    *policy_factory* builds one eviction policy per tier (by default :func:`make_policy`
    with the ``[policy]`` tuning and *clock*). *negative_ttl* and
    *listing_ttl* are the shared-tier caches' lifetimes (docs/shared-tiers.md);
    *shared_wait* is how long a call waits for background work on the shared tiers that
    it started (a revalidation, a delete) before answering from what this node knows:
    0, the daemon's setting, never waits. *namespaces* are the ``[[namespaces]]`` of the
    config (quotas, access, retention; docs/tenants.md); *owner* is ``(uid, gid)`` for
    their rules' owner or group when the config leaves one out (the mounting user).
    *open_copies* bounds the memory of copies :meth:`open` reads from persistent tiers
    (:mod:`kvfs.opencopies`).
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        *,
        policy: PolicyConfig = PolicyConfig(),
        clock: Callable[[], float] = time.time,
        policy_factory: Callable[[str], EvictionPolicy] | None = None,
        rebuild: bool = True,
        negative_ttl: float = 2.0,
        listing_ttl: float = 5.0,
        shared_wait: float = 0.0,
        lease_clock: Callable[[], float] = time.monotonic,
        namespaces: Sequence[NamespaceConfig] = (),
        owner: tuple[int, int] | None = None,
        open_copies: int | None = None,
    ) -> None:
        if not tiers:
            raise ValueError("a store needs at least one tier")
        self.tiers: list[Tier] = list(tiers)
        self.policy = policy
        self.clock = clock
        if policy_factory is None:  # the policies see the store's clock and the [policy] tuning
            policy_factory = functools.partial(make_policy, context=policy.context(clock))
        self.slots = [
            TierSlot.build(i, t, eviction=policy.eviction, clock=clock, policy_factory=policy_factory)
            for i, t in enumerate(self.tiers)
        ]
        self.catalog = Catalog(len(self.slots))
        self.copies = OpenCopies(self.catalog, open_copies)  # what Store.open reads from persistent tiers
        self.events = EventLog()
        self.queue = WriteThroughQueue()
        uid, gid = owner if owner is not None else (os.getuid(), os.getgid())
        self.namespaces = Namespaces(
            namespaces,
            [s.name for s in self.slots],
            policy_factory=functools.partial(policy_factory, policy.eviction),
            uid=uid,
            gid=gid,
        )
        self.placement = Placement(
            self.slots, self.catalog, self.queue, events=self.events, clock=clock, namespaces=self.namespaces
        )
        with self.placement.locked():  # before the rebuild, so the quotas' orders see every block found
            for ns in self.namespaces:
                for slot in self.slots:
                    if ns.quota[slot.index] is not None:
                        self.placement.set_quota(ns, slot, ns.quota[slot.index])
        self.shared = SharedView(self.slots, clock=clock, negative_ttl=negative_ttl, listing_ttl=listing_ttl)
        self.writeback = WriteBack(self.placement, self.queue)
        self.records = SharedRecords(
            self.placement, self.shared, self.queue, self.writeback, clock=clock, shared_wait=shared_wait
        )
        self.elsewhere = Elsewhere(self.records, self.shared)  # peers (kvfs.peers) and shared tiers
        self.reading = Reading(
            self.placement,
            self.catalog,
            self.copies,
            self.elsewhere,
            self.records,
            self.shared,
            promote=policy.promote,
            clock=clock,
        )
        self.sealing = Sealing(self.placement, self.catalog, self.namespaces, self.shared, self.queue, clock=clock)
        self.promises = self.sealing.promises
        self.lifetimes = Lifetimes(
            self.placement, self.catalog, self.namespaces, self.records, self.shared, clock=clock
        )
        self.operator = OperatorCommands(self.placement, self.catalog, self.elsewhere, self.lifetimes, self.reading)
        self.renames = Renames(self.placement, self.catalog, self.namespaces, self.records, self.shared, self.queue)
        self.tenancy = Tenancy(self.placement, self.catalog, self.namespaces, self.lifetimes)
        self.leases = Leases(self.placement, clock=lease_clock)
        self.ingest = Ingest(self.placement, self.sealing, self.shared, clock=lease_clock, record_clock=clock)
        self.batch = BatchReads(self.placement, self.catalog, self.elsewhere, self.leases, self.reading, self.operator)
        self.files = BackingFiles(self.placement, self.catalog, self.records, self.reading)
        """Block files for readers that read them themselves (FUSE passthrough: kvfs.backing)."""
        self.rebuilt_corrupt = 0
        if rebuild:
            self.rebuild()
        with self.placement.locked():
            for ns in self.namespaces:  # its directory exists, with its owner, for its tenant to write in
                try:
                    self.catalog.ensure_dir(ns.path)
                except KvfsError as exc:
                    log.warning("namespace %s: %s", ns.path, exc)
        self.enforce_quotas()

    # -- helpers ---------------------------------------------------------------------

    @property
    def negative_ttl(self) -> float:
        return self.shared.negative_ttl

    @negative_ttl.setter
    def negative_ttl(self, value: float) -> None:
        self.shared.negative_ttl = value

    @property
    def listing_ttl(self) -> float:
        return self.shared.listing_ttl

    @listing_ttl.setter
    def listing_ttl(self, value: float) -> None:
        self.shared.listing_ttl = value

    def tier_index(self, name: str) -> int:
        """The index of the tier named *name* (:class:`KeyError` if none)."""
        return index_of(self.slots, name)

    def _stat(self, rec: BlockRecord) -> BlockStat:
        return rec.stat(self.placement.names)

    def nowait(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args)`` (a store method) only if it can finish at memory speed now:
        the store's lock is free and the call needs no tier I/O (no file to delete, no
        shared tier to ask); otherwise raise :class:`StoreBusy` at once, whose ``tier``
        names the tier whose limiter the caller should make the call under from a worker
        thread. For an event loop that must never wait (the FUSE loop)."""
        return self.placement.nowait(fn, *args, **kwargs)

    # -- writing -------------------------------------------------------------------------

    def put(self, name: str, data: Any, *, parent: str | None = None, promise: Promise | None = None) -> BlockStat:
        """Seal *data* as block *name*, replacing an existing block atomically (see
        :meth:`Sealing.put`): in the hottest tier that takes it, or in the room *promise*
        holds for it (:meth:`promise`)."""
        return self.sealing.put(name, data, parent=parent, promise=promise)

    def promise(self, name: str, size: int) -> Promise:
        """Room for *size* bytes to be sealed as *name* later by :meth:`put` (see :meth:`Promises.make`)."""
        return self.promises.make(name, size)

    def give_up_promise(self, promise: Promise) -> None:
        """*promise* will not be kept (see :meth:`Promises.give_up`). Never waits."""
        self.promises.give_up(promise)

    def check_writable(self, name: str) -> None:
        """Raise unless a block may be written as *name* (see :meth:`Sealing.check_writable`)."""
        self.sealing.check_writable(name)

    def reserve(self, name: str, size: int, *, parent: str | None = None, ttl: float = 30.0) -> Reservation:
        """Reserve an extent of the DRAM arena for a block a client writes itself (see
        :mod:`kvfs.ingest`); then :meth:`commit` or :meth:`abort` it."""
        return self.ingest.reserve(name, size, parent=parent, ttl=ttl)

    def commit(self, reservation: Reservation, checksum: int) -> BlockStat:
        """Seal a reserved extent as its block once its bytes match *checksum* (else it is
        aborted and :class:`BlockCorrupt` raised); see :meth:`Ingest.commit`."""
        return self.ingest.commit(reservation, checksum)

    def abort(self, reservation: Reservation) -> bool:
        """Give a reserved extent back unpublished; False if it was no longer open."""
        return self.ingest.abort(reservation)

    # -- reading -------------------------------------------------------------------------

    def open(self, name: str, *, count_hit: bool = True) -> BlockRef:
        """A view of block *name*'s bytes, valid until released (use ``with``); see
        :meth:`Reading.open`. Raises :class:`BlockNotFound` when no copy is readable,
        :class:`TierUnavailable` when the only copies are in tiers that do not answer now."""
        return self.reading.open(name, count_hit=count_hit)

    def read_into(self, name: str, out: Any) -> int:
        """Copy the block into the writable buffer *out*; returns its length (see
        :meth:`Reading.read_into`)."""
        return self.reading.read_into(name, out)

    def read(self, name: str) -> bytes:
        """The block's bytes (a copy)."""
        return self.reading.read(name)

    def open_hot(self, name: str) -> BlockRef | None:
        """A view of the block if its hottest copy is in DRAM and the lock is free now;
        ``None`` otherwise, never waiting (see :meth:`Reading.open_hot`)."""
        return self.reading.open_hot(name)

    # -- lookups ---------------------------------------------------------------------------

    def stat(self, name: str) -> BlockStat:
        """The block's record; :class:`BlockNotFound` if absent."""
        name = normalize(name)
        self.elsewhere.refresh(name)
        with self.placement.locked():
            return self._stat(self.catalog.require(name))

    def lookup(self, name: str) -> BlockStat | None:
        """Like :meth:`stat` but ``None`` for a missing block (and for a directory)."""
        name = normalize(name)
        self.elsewhere.refresh(name)
        with self.placement.locked():
            rec = self.catalog.get(name)
            return None if rec is None else self._stat(rec)

    def exists(self, name: str) -> bool:
        return self.lookup(name) is not None

    def _shared_listing(self, directory: str) -> dict[str, bool]:
        """The shared tiers' listing of *directory*: from the cache, or listed now outside
        the lock (:class:`StoreBusy` inside :meth:`nowait` when it is not cached)."""
        p = self.placement
        if p.waiting_forbidden:
            listing = self.shared.listing(directory, block=False)
            if listing is None:
                raise StoreBusy("listing the shared tiers", tier=self.records.ask_tier)
            return listing
        return self.shared.listing(directory, wait=self.records.shared_wait) or {}

    def is_dir(self, name: str) -> bool:
        """True for a directory here or in a shared tier (from the cached parent listing)."""
        name = normalize(name)
        with self.placement.locked():
            if self.catalog.is_dir(name):
                return True
            if not self.shared or name in self.catalog.blocks:
                return False
            parent, base = split(name)
            if self.placement.waiting_forbidden:
                return self._shared_listing(parent).get(base) is True
        return self._shared_listing(parent).get(base) is True

    def probe_many(self, names: Sequence[str]) -> list[tuple[bool, BlockIdentity | None]]:
        """``(is_dir, identity or None)`` of each of *names* (a directory listing's
        entries): what :meth:`is_dir`, then :meth:`lookup` for a name that is no
        directory, say of it. Under one hold of the lock where no shared tier and no peer
        is to be asked."""
        if self.elsewhere.active:
            out: list[tuple[bool, BlockIdentity | None]] = []
            for n in names:
                if self.is_dir(n):
                    out.append((True, None))
                else:
                    st = self.lookup(n)
                    out.append((False, None if st is None else BlockIdentity(st.size, st.checksum, st.created)))
            return out
        keys = [normalize(n) for n in names]
        catalog = self.catalog
        with self.placement.locked():
            out = []
            for key in keys:
                if catalog.is_dir(key):
                    out.append((True, None))
                else:
                    rec = catalog.get(key)
                    out.append((False, None if rec is None else rec.identity()))
            return out

    def listdir(self, name: str = "") -> dict[str, bool]:
        """``{basename: is_dir}`` of a directory (a copy), including what the shared tiers
        hold there (their listing is cached for ``listing_ttl`` seconds)."""
        name = normalize(name)
        p = self.placement
        with p.locked():
            try:
                local: dict[str, bool] | None = dict(self.catalog.listdir(name))
                missing: BlockNotFound | None = None
            except BlockNotFound as exc:
                local, missing = None, exc
            if not self.shared:
                if local is None:
                    assert missing is not None
                    raise missing
                return local
            remote = self._shared_listing(name) if p.waiting_forbidden else None
        if remote is None:
            remote = self._shared_listing(name)
        with p.locked():
            if local is None:
                if not remote:
                    assert missing is not None
                    raise missing
                local = {}
            prefix = f"{name}/" if name else ""
            for base, is_dir in remote.items():
                if base in local:
                    continue
                full = prefix + base
                if not is_dir and (self.shared.known_missing(full) or self.queue.deleting(full)):
                    continue
                local[base] = is_dir
            return local

    def walk(self, directory: str = "") -> list[BlockStat]:
        """Every block at or under *directory*."""
        with self.placement.locked():
            return [self._stat(r) for r in self.catalog.under(normalize(directory))]

    def mkdir(self, name: str, *, parents: bool = False) -> None:
        """Make directory *name*; its parent must exist here or in a shared tier (a
        directory another node created), unless *parents*."""
        name = normalize(name)
        check_creatable(name)
        parent = parent_of(name)
        p = self.placement
        if not parents and self.shared:
            with p.locked():
                local = self.catalog.is_dir(parent) or parent in self.catalog.blocks
            if not local and self.is_dir(parent):
                with p.locked():
                    self.catalog.ensure_dir(parent)
        with p.locked():
            if parents:
                self.catalog.ensure_dir(name)
            else:
                self.catalog.mkdir(name)

    def rmdir(self, name: str) -> None:
        with self.placement.locked():
            self.catalog.rmdir(normalize(name))

    # -- changing blocks ---------------------------------------------------------------------

    def delete(self, name: str) -> None:
        """Remove the block from every tier, shared ones too (see :meth:`Renames.delete`).
        :class:`BlockNotFound` if absent."""
        self.renames.delete(name)

    def rename(self, old: str, new: str) -> None:
        """Rename block *old* to *new*, atomically replacing a block named *new* (see
        :meth:`Renames.rename`)."""
        self.renames.rename(old, new)

    # -- advice from engines and routers ---------------------------------------------------

    def hint(self, names: Sequence[str], when: Hint) -> int:
        """Pass advice about *names* (a chain, root first) to every tier's policy:
        ``Hint.SOON``, they are about to be read (queued requests); ``Hint.ENDED``, their
        session is over. A hint never moves or removes a block by itself; names this
        store does not hold are ignored; returns how many it holds (its own catalog: no question
        to a shared tier). Raises :class:`InvalidName` for a bad name."""
        keys = [normalize(n) for n in names]
        with self.placement.locked():
            for slot in self.slots:
                slot.policy.hint(keys, when)
            return sum(k in self.catalog.blocks for k in keys)

    # -- operator commands (kvfs pin, prefetch, evict, du, fsck) ----------------------------

    def pin(self, name: str, pinned: bool = True, *, ttl: float | None = None) -> BlockStat:
        """Pin (or unpin) a block: a pinned block is never evicted from the tiers it is in.
        *ttl*: a soft pin, ended by :meth:`sweep` after *ttl* seconds of the store's clock."""
        return self.operator.pin(name, pinned, ttl=ttl)

    def prefetch(self, name: str, tier: str | None = None) -> BlockStat:
        """Copy the block into *tier* (the hottest by default) now."""
        return self.operator.prefetch(name, tier)

    def evict(self, name: str, tier: str | None = None, *, force: bool = False) -> BlockStat | None:
        """Drop the block's copies in *tier*, or in every local tier (see
        :meth:`OperatorCommands.evict`)."""
        return self.operator.evict(name, tier, force=force)

    def usage(self, directory: str = "") -> Usage:
        """Bytes and blocks per tier at or under *directory*."""
        return self.operator.usage(directory)

    def check_copy(self, name: str, tier: str) -> str | None:
        """Re-check one copy a reader found bad (see :meth:`OperatorCommands.check_copy`)."""
        return self.operator.check_copy(name, tier)

    def verify(self, name: str, *, repair: bool = False) -> dict[str, str | None]:
        """Check every copy of *name* (see :meth:`OperatorCommands.verify`)."""
        return self.operator.verify(name, repair=repair)

    # -- namespaces: quotas, lifetimes, access -------------------------------------------

    def set_quota(self, path: str, tier: str, quota: int | None) -> NamespaceStatistics:
        """Give namespace *path* a quota of *quota* bytes in *tier* now (see :meth:`Tenancy.set_quota`)."""
        return self.tenancy.set_quota(path, tier, quota)

    def set_retention(self, path: str, seconds: float | None) -> NamespaceStatistics:
        """Give namespace *path* a retention of *seconds* (see :meth:`Tenancy.set_retention`)."""
        return self.tenancy.set_retention(path, seconds)

    def enforce_quotas(self, spaces: Sequence[NamespaceState] | None = None) -> None:
        """Evict until every namespace (of *spaces*, default all) is within its quotas."""
        self.tenancy.enforce_quotas(spaces)

    def namespace_statistics(self, path: str | None = None) -> list[NamespaceStatistics]:
        """A snapshot of every namespace (or of the one at *path*: KeyError if none)."""
        return self.tenancy.namespace_statistics(path)

    def check_access(self, peer: Peer, name: str, op: Operation) -> None:
        """Raise :class:`~kvfs.errors.AccessDenied` unless *peer* may do *op* to *name*
        under the rule that decides for it (:meth:`Namespaces.rule`: its namespace's, or
        the mount's default outside every namespace with one; :func:`kvfs.access.check`).
        The one access decision: the client socket asks it (with ``Peer.of_socket``) and
        so does the mount (with the request's credentials). Memory only: safe on an
        event loop."""
        name = normalize(name)
        ns = self.namespaces.of(name)
        if ns is not None and ns.access is not None:
            check(peer, ns.access, op, namespace=ns.path)
        else:
            check(peer, self.namespaces.default, op, namespace=None, name=name)

    def may_map_arena(self, peer: Peer) -> bool:
        """Whether *peer* may map the DRAM arena itself (it may read every namespace);
        any other peer's reads go through :meth:`read_into` (docs/tenants.md, "Access")."""
        return may_map_arena(peer, self.namespaces.rules())

    @property
    def idle(self) -> bool:
        """Whether the background work (:meth:`run_pending`, :meth:`expire_leases`,
        :meth:`sweep`) has nothing to do now, so its owner need not wake a thread for it."""
        return not self.pending and not self.leases and not self.lifetimes.due()

    def sweep(self) -> SweepReport:
        """End the soft pins that expired and, when due, remove blocks past their
        namespace's retention (see :mod:`kvfs.lifetimes`); the daemon calls it from its
        background task."""
        return self.lifetimes.sweep()

    # -- leases ----------------------------------------------------------------------------

    def lease(self, name: str, *, tier: str | None = None, ttl: float = 30.0) -> Lease:
        """Hold one local copy of *name* for a reader outside the store (see
        :meth:`Leases.take`)."""
        return self.leases.take(normalize(name), tier=None if tier is None else self.tier_index(tier), ttl=ttl)

    def release(self, lease: Lease | int) -> bool:
        """End a lease (by object or id); False if it had already ended."""
        return self.leases.release(lease)

    def probe(self, names: Sequence[str]) -> Probe:
        """Which of *names* are present, under one lock (see :meth:`BatchReads.probe`)."""
        return self.batch.probe(names)

    def lease_many(
        self, names: Sequence[str], *, ttl: float = 30.0, promote: str = Promote.POLICY, count_hits: bool = True
    ) -> list[Lease | KvfsError]:
        """A lease per name, promoting first per *promote* (see :meth:`BatchReads.lease`)."""
        return self.batch.lease(names, ttl=ttl, promote=promote, count_hits=count_hits)

    def expire_leases(self) -> int:
        """End every lease past its deadline; returns how many (the daemon calls this)."""
        return self.leases.expire()

    # -- background work, rebuild, lifecycle ------------------------------------------------

    def reserve_ahead(self, window: int) -> int:
        """Have every tier prepare up to *window* bytes of memory ahead of its next puts
        (:meth:`Tier.reserve_ahead`: the DRAM arena's growth, taken off the seals' path);
        for the owner's background thread. Returns the bytes newly reserved."""
        return sum(t.reserve_ahead(window) for t in self.tiers)

    def unreserved_ahead(self, window: int) -> int:
        """The bytes :meth:`reserve_ahead` of *window* would reserve now (memory only: for
        the owner's loop to decide whether to start a thread for it)."""
        return sum(t.unreserved_ahead(window) for t in self.tiers)

    def run_pending(self, limit: int | None = None) -> int:
        """Run up to *limit* queued write-through copies and shared deletes (see
        :meth:`WriteBack.run_pending`); returns how many were done."""
        return self.writeback.run_pending(limit)

    @property
    def pending(self) -> int:
        return self.writeback.pending

    def flush(self) -> int:
        """Write every block that is only in DRAM down (see :meth:`flush_report`);
        returns how many were written."""
        return self.flush_report().written

    def flush_report(self) -> FlushReport:
        """Run the pending write-through work and write every block whose only copies are
        volatile down to a persistent tier; what could not be done is in the report.
        Called before unmount: a clean unmount loses nothing, or says what it lost."""
        return self.writeback.flush()

    def rebuild(self) -> int:
        """Add every block found in the local persistent tiers to the catalog; returns how
        many copies were found. The hotter tier's version wins when two disagree. A file
        that is corrupt (its header, or a name that is not a valid kvfs name or not its
        own path) is counted in the tier's ``corrupt`` and never becomes a block. Runs
        before the store serves (it reads the tiers under the lock)."""
        found, corrupt = rebuild_catalog(self.placement, now=self.clock(), learn_shared=bool(self.shared))
        self.rebuilt_corrupt += corrupt
        return found

    def statistics(self) -> StoreStatistics:
        with self.placement.locked():
            for s in self.slots:
                self.placement.absorb_held(s)
            # a dropped copy a reader still holds takes its room: used, for df and the metrics
            tiers = tuple(
                s.statistics(self.catalog.used[s.index] + s.held, self.catalog.counts[s.index]) for s in self.slots
            )
            return StoreStatistics(
                blocks=len(self.catalog),
                lookups=self.reading.lookups,
                misses=self.reading.misses,
                pending_writes=len(self.queue),
                tiers=tiers,
                leases=len(self.leases),
                reserved=len(self.ingest),
                peers=self.elsewhere.statistics(),
            )

    def __len__(self) -> int:
        return len(self.catalog)

    def __iter__(self) -> Iterator[str]:
        with self.placement.locked():
            return iter(list(self.catalog.names()))

    def close(self) -> None:
        """End every lease and close every tier. Call :meth:`flush` first to keep blocks
        that are only in DRAM. Threads stuck in a hung tier are left behind, never waited for."""
        self.leases.close()
        self.ingest.close()
        self.shared.close()
        for slot in self.slots:
            slot.close()
