"""The peer tier: blocks missing here read from another node's DRAM (docs/cluster.md).

A node of a cluster (``[cluster]`` in the config) learns what its peers hold from their KV
events (vLLM's format, ``kvfs.mount.kv_events``): :class:`PeerIndex` maps a block hash to
the peers that hold it and where (DRAM or disk). A name this node does not hold is looked
up there first (memory only); when a peer holds it, :class:`PeerReads` asks that peer for
the block through a :class:`PeerSource` (NIXL over UCX in the daemon): the peer writes it
into landing buffers of this node set aside for that peer (in chunks when it is larger
than one) and says its size and checksum. The bytes are copied into an extent of this
node's arena reserved for them, checked (xxh3-64) against the peer's checksum there and
only then published: a DRAM copy, counted as a remote hit. Nothing is ever written to a
peer, and no peer ever reads or writes this node's arena: it writes only into landing
buffers, whose bytes are checked before anything is published from them.

The same two-phase discipline as every move (docs/store.md): the extent is reserved
under the store's lock, filled and checked outside it, committed under it. A block written
here meanwhile wins: the fetched copy is given back. A fetched block is not queued for
the write-through tiers (its writer's node writes it through); it learns its shared
copies on first use, as a block found on disk at start does.

A peer that does not answer within ``timeout`` is marked unhealthy (its own
:class:`~kvfs.health.HealthBreaker`) and skipped for ``retry_after`` seconds: a dead,
stopped or cut-off peer costs one deadline, then nothing; the read falls to the shared
tiers or misses. When every landing buffer for a peer stays busy until the deadline
(:class:`LandingBusy`), the read is a miss too, counted ``busy``; the peer is not at
fault and stays healthy.

:class:`Elsewhere` is the store's collaborator that asks, before every read or lookup of
a name not held here, the places it may be found: the peers, then the shared tiers.
"""

from __future__ import annotations

import abc
import enum
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import BlockCorrupt, KvfsError, LandingBusy, NoSpace, TierUnavailable
from .hashing import block_hash_of
from .health import HealthBreaker
from .stats import PeerCounters, PeerStatistics

if TYPE_CHECKING:
    from .catalog import Catalog
    from .ingest import Ingest
    from .placement import Placement
    from .revalidation import SharedRecords
    from .shared import SharedView

__all__ = [
    "PEER_DETAIL",
    "Elsewhere",
    "Incoming",
    "Medium",
    "PeerIndex",
    "PeerReads",
    "PeerSource",
]

log = logging.getLogger("kvfs.peers")

_MAX_ENTRIES = 4_000_000  # block hashes remembered per peer (about 100 bytes each)
PEER_DETAIL = "read from peer "
"""The start of the ``stored`` event's detail of a block read from a peer (then its name)."""


class Medium(enum.IntEnum):
    """Where a peer holds a copy; lower is faster to serve."""

    DRAM = 0
    DISK = 1


@dataclass(kw_only=True, slots=True)
class Incoming:
    """A block a peer is sending this node: *size* bytes with *checksum* (xxh3-64). Its
    first bytes are in a landing buffer already; the transport keeps, in a subclass of
    its own, what it needs to move the rest."""

    name: str
    size: int
    checksum: int


class PeerSource(abc.ABC):
    """Moves blocks from peers: the transport the daemon plugs in (NIXL, ``kvfs.mount.peer_link``).
    Every call returns or raises :class:`TierUnavailable` within *timeout* seconds."""

    @abc.abstractmethod
    def fetch(self, peer: str, name: str, timeout: float) -> Incoming | None:
        """Ask *peer* for block *name*; its first bytes land in a landing buffer here.
        None when the peer does not hold it (or may not serve it to us);
        :class:`LandingBusy` when no landing buffer for *peer* came free in time."""

    @abc.abstractmethod
    def read(self, peer: str, incoming: Incoming, offset: int, timeout: float) -> None:
        """Move the whole block into this node's arena at file offset *offset*: what has
        landed is copied there, the rest is asked for chunk by chunk."""

    @abc.abstractmethod
    def release(self, peer: str, incoming: Incoming) -> None:
        """Give the landing buffers back, and tell *peer* it may let go of the block
        when it was not all sent (best effort, never waits long)."""


class PeerIndex:
    """What each peer holds: block hash -> {peer: media}, from the peers' KV events (or a
    snapshot they sent). Thread-safe. At most ``max_entries`` hashes per peer are kept;
    past that new ones are not learned (``dropped`` counts them): a miss, never a wrong
    read. A stale entry costs one question to the peer, which then says no."""

    def __init__(self, peers: Iterable[str], *, max_entries: int = _MAX_ENTRIES) -> None:
        self._lock = threading.Lock()
        self._held: dict[bytes, dict[str, int]] = {}  # hash -> peer -> bitmask of Medium
        self._counts: dict[str, int] = {p: 0 for p in peers}
        self.max_entries = max_entries
        self.dropped = 0

    @property
    def peers(self) -> list[str]:
        return list(self._counts)

    def stored(self, peer: str, h: bytes, medium: Medium) -> None:
        with self._lock:
            holders = self._held.get(h)
            if holders is None or peer not in holders:
                if self._counts[peer] >= self.max_entries:
                    self.dropped += 1
                    return
                self._counts[peer] += 1
                holders = self._held.setdefault(h, {})
                holders[peer] = 0
            holders[peer] |= 1 << medium

    def removed(self, peer: str, h: bytes, medium: Medium | None = None) -> None:
        """*peer* dropped its copy in *medium* (None: every copy)."""
        with self._lock:
            holders = self._held.get(h)
            if holders is None or peer not in holders:
                return
            bits = 0 if medium is None else holders[peer] & ~(1 << medium)
            if bits:
                holders[peer] = bits
                return
            del holders[peer]
            self._counts[peer] -= 1
            if not holders:
                del self._held[h]

    def cleared(self, peer: str) -> None:
        """*peer* forgot everything (it restarted, or its events were lost)."""
        with self._lock:
            for h in [h for h, holders in self._held.items() if peer in holders]:
                holders = self._held[h]
                del holders[peer]
                if not holders:
                    del self._held[h]
            self._counts[peer] = 0

    def holders(self, h: bytes) -> list[str]:
        """The peers holding *h*, those with a DRAM copy first."""
        with self._lock:
            holders = self._held.get(h)
            if not holders:
                return []
            return sorted(holders, key=lambda p: 0 if holders[p] & 1 else 1)

    def count(self, peer: str) -> int:
        return self._counts.get(peer, 0)


class _Peer:
    def __init__(self, name: str, health: HealthBreaker) -> None:
        self.name = name
        self.health = health
        self.counters = PeerCounters()


class PeerReads:
    """Fills local misses from peers (see the module doc): a collaborator of the store.

    The bytes land in the arena of *ingest* (``Ingest.reserve`` / ``Ingest.adopt``);
    *catalog* says what is held here, *placement* whether this thread may do I/O;
    *index* says who holds what; *source* moves the bytes; *timeout* bounds each peer's
    part of a read; *retry_after*: how long a peer that failed is skipped."""

    def __init__(
        self,
        catalog: Catalog,
        placement: Placement,
        ingest: Ingest,
        index: PeerIndex,
        source: PeerSource,
        *,
        timeout: float = 2.0,
        retry_after: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.catalog = catalog
        self.placement = placement
        self.ingest = ingest
        self.index = index
        self.source = source
        self.timeout = timeout
        self._peers = {
            p: _Peer(p, HealthBreaker(f"peer {p}", clock=clock, retry_after=retry_after)) for p in index.peers
        }
        self._lock = threading.Lock()
        self._fetching: dict[str, threading.Event] = {}

    def counters(self, peer: str) -> PeerCounters:
        """*peer*'s counters (the serving side counts what it served in them)."""
        return self._peers[peer].counters

    def candidates(self, name: str) -> list[str]:
        """Peers that hold *name* by their events (memory only)."""
        h = block_hash_of(name)
        return [] if h is None else self.index.holders(h)

    def fill(self, name: str) -> bool:
        """If *name* (normalized) is not held here and a peer holds it, read it from that
        peer into this node's DRAM now; True when it was. Inside ``Store.nowait`` this
        raises :class:`~kvfs.errors.StoreBusy` instead of waiting on the network. Never
        raises for a peer's failure: the read falls to the shared tiers or misses."""
        if name in self.catalog.blocks:
            return False
        peers = self.candidates(name)
        if not peers:
            return False
        self.placement.require_io(0, "reading a block from a peer")
        with self._lock:
            running = self._fetching.get(name)
            if running is None:
                self._fetching[name] = threading.Event()
        if running is not None:  # another thread is fetching it: its answer is ours
            running.wait(self.timeout * len(peers) + 1.0)
            return name in self.catalog.blocks
        try:
            for peer in peers:
                state = self._peers.get(peer)
                if state is None or not state.health.usable():
                    continue
                if self._fetch_from(state, name):
                    return True
            return False
        finally:
            with self._lock:
                done = self._fetching.pop(name)
            done.set()

    def _fetch_from(self, peer: _Peer, name: str) -> bool:
        t0 = time.monotonic()
        try:
            incoming = self.source.fetch(peer.name, name, self.timeout)
        except LandingBusy as exc:
            peer.counters.add("busy")
            log.info("block %s from peer %s: %s", name, peer.name, exc)
            return False
        except TierUnavailable as exc:
            peer.health.failed(exc)
            return False
        peer.health.answered()
        if incoming is None:
            peer.counters.add("misses")
            h = block_hash_of(name)
            if h is not None:
                self.index.removed(peer.name, h)
            return False
        try:
            got = self._receive(peer, name, incoming)
        finally:
            self.source.release(peer.name, incoming)
        if got:
            peer.counters.fetched(time.monotonic() - t0, incoming.size)
        return got

    def _receive(self, peer: _Peer, name: str, incoming: Incoming) -> bool:
        ingest = self.ingest
        try:
            res = ingest.reserve(name, incoming.size, parent=None, ttl=self.timeout * 2 + 5.0)
        except (NoSpace, KvfsError) as exc:
            log.info("block %s from peer %s: no room here (%s)", name, peer.name, exc)
            return False
        try:
            self.source.read(peer.name, incoming, res.location.offset, self.timeout)
        except TierUnavailable as exc:
            peer.health.failed(exc)
            ingest.abort(res)
            return False
        try:
            adopted = ingest.adopt(res, incoming.checksum, source=f"{PEER_DETAIL}{peer.name}")
        except BlockCorrupt as exc:
            peer.counters.add("corrupt")
            log.warning("block %s from peer %s failed its check; not published: %s", name, peer.name, exc)
            return False
        except KvfsError as exc:
            log.info("block %s from peer %s not published: %s", name, peer.name, exc)
            return False
        if adopted is None:
            return name in self.catalog.blocks  # written here meanwhile: that version wins
        return True

    def statistics(self) -> tuple[PeerStatistics, ...]:
        out = []
        for p in self._peers.values():
            c = p.counters
            with c.lock:
                buckets = list(itertools.accumulate(c.fetch_buckets))
                out.append(
                    PeerStatistics(
                        name=p.name,
                        healthy=p.health.healthy,
                        errors=p.health.errors,
                        blocks=self.index.count(p.name),
                        hits=c.hits,
                        bytes_read=c.bytes_read,
                        misses=c.misses,
                        corrupt=c.corrupt,
                        busy=c.busy,
                        fetch_seconds=c.fetch_seconds,
                        fetch_buckets=tuple(buckets),
                        served=c.served,
                        bytes_served=c.bytes_served,
                    )
                )
        return tuple(out)

    def names(self) -> Sequence[str]:
        return list(self._peers)


class Elsewhere:
    """Where a name this node does not hold may be found, asked before every read or
    lookup (``Store.elsewhere``): the peers (:attr:`peers`, set by a cluster node's
    daemon), then the shared tiers (*records*, over *shared*)."""

    def __init__(self, records: SharedRecords, shared: SharedView) -> None:
        self.records = records
        self.shared = shared
        self.peers: PeerReads | None = None

    @property
    def active(self) -> bool:
        """Whether a name unknown here may be found elsewhere."""
        return bool(self.shared) or self.peers is not None

    def refresh(self, name: str) -> None:
        """Read *name* from a peer if only a peer holds it (:meth:`PeerReads.fill`), then
        check it with the shared tiers (:meth:`SharedRecords.refresh`); ``StoreBusy`` in nowait."""
        if self.peers is not None:
            self.peers.fill(name)
        self.records.refresh(name)

    def statistics(self) -> tuple[PeerStatistics, ...]:
        return () if self.peers is None else self.peers.statistics()
