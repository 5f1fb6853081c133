"""Every message of the daemon's socket: requests, their replies, and stream items.

Each request names its reply class (``Request.reply``); a request that streams
(``streaming = True``) is answered by any number of items (:class:`Progress`,
:class:`Subscribed`, :class:`EventItem`) before its reply. Any request may instead be
answered by an :class:`~kvfs.protocol.errors.Error`. docs/client.md lists them with their
meaning; docs/tools.md the operator commands.

Operator commands (the ``kvfs`` tools): :class:`Ping`, :class:`Shutdown`, :class:`Stat`,
:class:`Statistics`, :class:`Ls`, :class:`Du`, :class:`Df`, :class:`Top`, :class:`Pin`,
:class:`Prefetch`, :class:`Evict`, :class:`Fsck`, :class:`Events`, :class:`QuotaShow`,
:class:`QuotaSet`. Their replies'
``to_json()`` is what ``--json`` prints.

The batch client (:mod:`kvfs.client`): :class:`Hello`, :class:`Lookup`, :class:`Lease`,
:class:`Release`, :class:`Renew`, :class:`Reserve`, :class:`Commit`, :class:`Abort`,
:class:`Suspect`, :class:`Advise`; plus the operator commands it shares (pin, prefetch, evict, stat,
events).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvfs.catalog import BlockStat
from kvfs.events import Event
from kvfs.namespaces import NamespaceStatistics
from kvfs.promotion import Promote
from kvfs.stats import StoreStatistics

from .codec import MAX_ITEMS, MAX_STRING, VERSION, Bounds, Message

__all__ = [
    "Abort",
    "Aborted",
    "Advise",
    "Advised",
    "ArenaInfo",
    "Commit",
    "Committed",
    "CopyProblem",
    "Df",
    "DfResult",
    "Du",
    "DuResult",
    "DuTotal",
    "EventItem",
    "Events",
    "Evict",
    "EvictResult",
    "Failure",
    "Fsck",
    "FsckResult",
    "Grant",
    "Hello",
    "Lease",
    "Leased",
    "Lookup",
    "LookupResult",
    "Ls",
    "LsEntry",
    "LsResult",
    "OpCount",
    "Pin",
    "PinResult",
    "Ping",
    "Pong",
    "Prefetch",
    "PrefetchResult",
    "Progress",
    "Promote",
    "QuotaResult",
    "QuotaSet",
    "QuotaShow",
    "Release",
    "Released",
    "Renew",
    "Renewed",
    "Request",
    "Reserve",
    "Reserved",
    "Shutdown",
    "ShuttingDown",
    "Slot",
    "Stat",
    "StatResult",
    "Statistics",
    "StatisticsResult",
    "Subscribed",
    "Suspect",
    "SuspectResult",
    "TierInfo",
    "TierUse",
    "Top",
    "TopResult",
    "Unsubscribed",
    "Welcome",
    "WireError",
]

_MSG = {"frozen": True, "kw_only": True, "slots": True}

# What a request's fields must keep besides their types (checked at decode: kvfs.protocol.codec.Bounds)
_BATCH = Bounds(items=MAX_ITEMS).meta()
_TTL = Bounds(min=0, why="seconds from now").meta()
_PIN_TTL = Bounds(above=0, why="seconds a soft pin lasts; leave ttl out for a pin until unpinned").meta()
_SIZES = Bounds(items=MAX_ITEMS, min=0, why="bytes").meta()
_CHECKSUMS = Bounds(items=MAX_ITEMS, min=0, max=2**64 - 1, why="an xxh3-64 checksum").meta()
_TEXT = Bounds(length=MAX_STRING).meta()


class Request(Message):
    """A message a client sends; ``reply`` is the class of the answer."""

    __slots__ = ()
    reply: ClassVar[type[Message]]
    streaming: ClassVar[bool] = False


# -- rows carried inside messages -------------------------------------------------------


@dataclass(**_MSG)
class Failure:
    """One block an operator command could not do: its name, why, and the error class."""

    name: str
    error: str
    type: str


@dataclass(**_MSG)
class WireError:
    """An error for one item of a batch: the class name (the error table) and message."""

    type: str
    message: str


@dataclass(**_MSG)
class TierInfo:
    name: str
    kind: str
    persistent: bool
    shared: bool
    capacity: int | None


@dataclass(**_MSG)
class ArenaInfo:
    """The DRAM tier's shared-memory arena: the file (its descriptor comes with the
    :class:`Welcome`), its length, and the tier's capacity. Extents are file offsets."""

    path: str
    size: int
    capacity: int


@dataclass(**_MSG)
class Grant:
    """One leased copy: *length* payload bytes at *offset* of the arena (``kind`` =
    ``"arena"``), of the session's copy buffer (``"copy"``: a verified copy made for it),
    or of the block file *path* (``"file"``, 4 KiB-aligned offset), with the
    block's xxh3-64 *checksum*; valid for *ttl* seconds from the reply unless released."""

    id: int
    tier: str
    kind: str
    path: str
    offset: int
    length: int
    checksum: int
    ttl: float


@dataclass(**_MSG)
class Slot:
    """One reserved extent of the arena to write a block into: *length* bytes at file
    *offset*; commit it within *ttl* seconds."""

    id: int
    offset: int
    length: int
    ttl: float


@dataclass(**_MSG)
class LsEntry:
    name: str
    type: str  # "dir" or "block"
    block: BlockStat | None = None

    def to_json(self) -> dict[str, Any]:
        if self.block is None:
            return {"name": self.name, "type": self.type}
        return {**self.block.to_json(), "name": self.name, "type": "block"}


@dataclass(**_MSG)
class TierUse:
    used: int
    blocks: int


@dataclass(**_MSG)
class DuTotal:
    used: int
    blocks: int
    size: int


@dataclass(**_MSG)
class OpCount:
    op: str
    count: int
    errors: int
    seconds: float


@dataclass(**_MSG)
class CopyProblem:
    name: str
    tier: str
    error: str


# -- stream items -----------------------------------------------------------------------


@dataclass(**_MSG)
class Progress(Message):
    kind: ClassVar[str] = "progress"
    done: int
    total: int


@dataclass(**_MSG)
class Subscribed(Message):
    kind: ClassVar[str] = "subscribed"


@dataclass(**_MSG)
class EventItem(Message):
    kind: ClassVar[str] = "event"
    event: Event


# -- operator commands ------------------------------------------------------------------


@dataclass(**_MSG)
class Pong(Message):
    kind: ClassVar[str] = "pong"
    mountpoint: str
    pid: int
    protocol: int = VERSION
    version: str = ""
    """The daemon's kvfs version (``kvfs.__version__``); empty from a daemon too old to say."""


@dataclass(**_MSG)
class Ping(Request):
    kind: ClassVar[str] = "ping"
    reply: ClassVar[type[Message]] = Pong


@dataclass(**_MSG)
class ShuttingDown(Message):
    kind: ClassVar[str] = "shutting_down"
    pid: int


@dataclass(**_MSG)
class Shutdown(Request):
    """Flush every block only in DRAM down and unmount; answered at once, the daemon
    exits when done (``kvfs umount`` waits for it)."""

    kind: ClassVar[str] = "shutdown"
    reply: ClassVar[type[Message]] = ShuttingDown


@dataclass(**_MSG)
class StatResult(Message):
    kind: ClassVar[str] = "stat_result"
    block: BlockStat

    def to_json(self) -> dict[str, Any]:
        return self.block.to_json()


@dataclass(**_MSG)
class Stat(Request):
    kind: ClassVar[str] = "stat"
    reply: ClassVar[type[Message]] = StatResult
    name: str


@dataclass(**_MSG)
class StatisticsResult(Message):
    kind: ClassVar[str] = "statistics_result"
    statistics: StoreStatistics

    def to_json(self) -> dict[str, Any]:
        return self.statistics.to_json()


@dataclass(**_MSG)
class Statistics(Request):
    kind: ClassVar[str] = "statistics"
    reply: ClassVar[type[Message]] = StatisticsResult


@dataclass(**_MSG)
class LsResult(Message):
    """A directory's children (``type`` ``"dir"``), or the block itself (``"block"``)."""

    kind: ClassVar[str] = "ls_result"
    path: str
    type: str
    entries: list[LsEntry]

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "type": self.type, "entries": [e.to_json() for e in self.entries]}


@dataclass(**_MSG)
class Ls(Request):
    kind: ClassVar[str] = "ls"
    reply: ClassVar[type[Message]] = LsResult
    name: str = ""


@dataclass(**_MSG)
class DuResult(Message):
    """``used`` is bytes against each tier's capacity, ``size`` payload bytes; ``quota``
    (tier -> bytes or None) when the path is a namespace."""

    kind: ClassVar[str] = "du_result"
    path: str
    tiers: dict[str, TierUse]
    total: DuTotal
    quota: dict[str, int | None] | None = None


@dataclass(**_MSG)
class Du(Request):
    kind: ClassVar[str] = "du"
    reply: ClassVar[type[Message]] = DuResult
    name: str = ""


@dataclass(**_MSG)
class DfResult(Message):
    """The mount's tiers, and each namespace's use against its quotas."""

    kind: ClassVar[str] = "df_result"
    mountpoint: str
    statistics: StoreStatistics
    namespaces: list[NamespaceStatistics] = field(default_factory=list)
    config: str = ""
    """Where the mount's config came from: its file, or the embedded default and how its
    sizes were chosen (:attr:`kvfs.config.Config.origin`)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "mountpoint": self.mountpoint,
            "config": self.config,
            **self.statistics.to_json(),
            "namespaces": [n.to_json() for n in self.namespaces],
        }


@dataclass(**_MSG)
class Df(Request):
    kind: ClassVar[str] = "df"
    reply: ClassVar[type[Message]] = DfResult


@dataclass(**_MSG)
class TopResult(Message):
    """A snapshot for ``kvfs top``: wall time, statistics, events the store's queue lost,
    subscribers, FUSE op counts."""

    kind: ClassVar[str] = "top_result"
    time: float
    mountpoint: str
    statistics: StoreStatistics
    events_dropped: int
    subscribers: int
    ops: list[OpCount]

    def to_json(self) -> dict[str, Any]:
        out = Message.to_json(self)
        out["statistics"] = self.statistics.to_json()
        return out


@dataclass(**_MSG)
class Top(Request):
    kind: ClassVar[str] = "top"
    reply: ClassVar[type[Message]] = TopResult


@dataclass(**_MSG)
class PinResult(Message):
    kind: ClassVar[str] = "pin_result"
    blocks: int
    changed: int
    failed: list[Failure] = field(default_factory=list)
    """Paths refused (a namespace's access rule), with why."""


@dataclass(**_MSG)
class Pin(Request):
    """Pin (or unpin) blocks; a directory means every block under it."""

    kind: ClassVar[str] = "pin"
    reply: ClassVar[type[Message]] = PinResult
    paths: list[str] = field(metadata=_BATCH)
    pinned: bool = True
    ttl: float | None = field(default=None, metadata=_PIN_TTL)
    """A soft pin: it ends by itself after *ttl* seconds (None: until unpinned)."""


@dataclass(**_MSG)
class QuotaResult(Message):
    """Namespaces with their use, quota, copies and quota evictions per tier."""

    kind: ClassVar[str] = "quota_result"
    namespaces: list[NamespaceStatistics]

    def to_json(self) -> dict[str, Any]:
        return {"namespaces": [n.to_json() for n in self.namespaces]}


@dataclass(**_MSG)
class QuotaShow(Request):
    """Every namespace, or the one at *name*."""

    kind: ClassVar[str] = "quota_show"
    reply: ClassVar[type[Message]] = QuotaResult
    name: str | None = None


@dataclass(**_MSG)
class QuotaSet(Request):
    """Set namespace *name*'s *quotas* (tier -> bytes, None to drop one) and, when given,
    its *retention* (seconds; 0 drops it). Lowering a quota evicts down to it now. The
    reply holds that one namespace."""

    kind: ClassVar[str] = "quota_set"
    reply: ClassVar[type[Message]] = QuotaResult
    name: str
    quotas: dict[str, int | None] = field(default_factory=dict, metadata=Bounds(min=0, items=256, why="bytes").meta())
    retention: float | None = field(default=None, metadata=Bounds(min=0, why="seconds").meta())


@dataclass(**_MSG)
class PrefetchResult(Message):
    kind: ClassVar[str] = "prefetch_result"
    blocks: int
    tier: str
    fetched: int
    already: int
    failed: list[Failure]


@dataclass(**_MSG)
class Prefetch(Request):
    """Copy blocks into *tier* (the hottest by default); streams :class:`Progress`."""

    kind: ClassVar[str] = "prefetch"
    reply: ClassVar[type[Message]] = PrefetchResult
    streaming: ClassVar[bool] = True
    paths: list[str] = field(metadata=_BATCH)
    tier: str | None = None


@dataclass(**_MSG)
class EvictResult(Message):
    kind: ClassVar[str] = "evict_result"
    blocks: int
    evicted: int
    removed: int
    failed: list[Failure]


@dataclass(**_MSG)
class Evict(Request):
    """Drop copies from *tier* (default: every local tier), never a pinned block's nor a
    last copy unless *force* (each refused block is a :class:`Failure` of type ``Pinned``
    or ``LastCopy``); streams :class:`Progress`."""

    kind: ClassVar[str] = "evict"
    reply: ClassVar[type[Message]] = EvictResult
    streaming: ClassVar[bool] = True
    paths: list[str] = field(metadata=_BATCH)
    tier: str | None = None
    force: bool = False


@dataclass(**_MSG)
class FsckResult(Message):
    kind: ClassVar[str] = "fsck_result"
    blocks: int
    copies: int
    bad: list[CopyProblem]
    unavailable: list[CopyProblem]
    removed: list[str]
    repaired: bool


@dataclass(**_MSG)
class Fsck(Request):
    kind: ClassVar[str] = "fsck"
    reply: ClassVar[type[Message]] = FsckResult
    streaming: ClassVar[bool] = True
    name: str = ""
    repair: bool = False


@dataclass(**_MSG)
class Unsubscribed(Message):
    """The end of an event stream the daemon closed (it is shutting down)."""

    kind: ClassVar[str] = "unsubscribed"


@dataclass(**_MSG)
class Events(Request):
    """Every block event from now on: a :class:`Subscribed` item, then one
    :class:`EventItem` per event until the client hangs up."""

    kind: ClassVar[str] = "events"
    reply: ClassVar[type[Message]] = Unsubscribed
    streaming: ClassVar[bool] = True


# -- the batch client -------------------------------------------------------------------


@dataclass(**_MSG)
class Welcome(Message):
    """The session's terms. The arena's descriptor comes with this frame (SCM_RIGHTS):
    read-only unless ``write`` was granted. ``owner``: the peer runs as the daemon's
    user (it may open block files by path). ``max_put``: the largest block a put takes;
    ``max_reserved``: bytes one session may hold reserved at once; ``lease_ttl`` and
    ``max_ttl`` in seconds."""

    kind: ClassVar[str] = "welcome"
    pid: int
    mountpoint: str
    owner: bool
    write: bool
    tiers: list[TierInfo]
    arena: ArenaInfo | None
    max_put: int
    max_reserved: int
    lease_ttl: float
    max_ttl: float
    copy_buffer: int = 0
    """Bytes of this session's private copy buffer, whose descriptor comes instead of
    the arena's when a namespace's access rule keeps the peer from mapping the arena
    (grants of kind ``"copy"`` and reserved slots index it); 0: none."""
    version: str = ""
    """The daemon's kvfs version (``kvfs.__version__``)."""


@dataclass(**_MSG)
class Hello(Request):
    """Open a session: *write* asks for a read-write arena descriptor (puts); *copy*
    asks for a private copy buffer instead of the arena (what a peer a namespace's rule
    keeps off the arena always gets)."""

    kind: ClassVar[str] = "hello"
    reply: ClassVar[type[Message]] = Welcome
    client: str = field(default="", metadata=_TEXT)
    write: bool = False
    copy: bool = False


@dataclass(**_MSG)
class LookupResult(Message):
    """Per name, in order: ``sizes`` (-1: no such block), ``tiers`` (a bitmask over the
    Welcome's tier list, hottest = bit 0) and ``pinned``; ``prefix``: how many leading
    names are all present (the cached length of a chain)."""

    kind: ClassVar[str] = "lookup_result"
    sizes: list[int]
    tiers: list[int]
    pinned: list[bool]
    prefix: int
    errors: list[WireError | None] = field(default_factory=list)
    """Per name, when some were refused (a namespace's access rule): None or why; empty
    when none was. A refused name reads as absent in the columns and ends the prefix."""


@dataclass(**_MSG)
class Lookup(Request):
    kind: ClassVar[str] = "lookup"
    reply: ClassVar[type[Message]] = LookupResult
    names: list[str] = field(metadata=_BATCH)


@dataclass(**_MSG)
class Leased(Message):
    """Per name, in order: a grant, or (``None``) the error in ``errors``."""

    kind: ClassVar[str] = "leased"
    grants: list[Grant | None]
    errors: list[WireError | None]


@dataclass(**_MSG)
class Lease(Request):
    """Lease one local copy of each name for *ttl* seconds (see :class:`Promote`);
    *count_hits*: the read counts as a hit (policies, ``kvfs top``)."""

    kind: ClassVar[str] = "lease"
    reply: ClassVar[type[Message]] = Leased
    names: list[str] = field(metadata=_BATCH)
    ttl: float = field(default=0.0, metadata=_TTL)  # 0: the session's default
    promote: str = Promote.POLICY
    count_hits: bool = True


@dataclass(**_MSG)
class Released(Message):
    kind: ClassVar[str] = "released"
    count: int


@dataclass(**_MSG)
class Release(Request):
    kind: ClassVar[str] = "release"
    reply: ClassVar[type[Message]] = Released
    ids: list[int] = field(metadata=_BATCH)


@dataclass(**_MSG)
class Renewed(Message):
    """Per lease id: its new ttl, or None when it had already ended."""

    kind: ClassVar[str] = "renewed"
    ttls: list[float | None]


@dataclass(**_MSG)
class Renew(Request):
    kind: ClassVar[str] = "renew"
    reply: ClassVar[type[Message]] = Renewed
    ids: list[int] = field(metadata=_BATCH)
    ttl: float = field(default=0.0, metadata=_TTL)


@dataclass(**_MSG)
class Reserved(Message):
    kind: ClassVar[str] = "reserved"
    slots: list[Slot]
    errors: list[WireError | None] = field(default_factory=list)
    """Per name, when some were refused (a namespace's access rule): None (its slot is
    the next in ``slots``) or why; empty when none was."""


@dataclass(**_MSG)
class Reserve(Request):
    """Reserve an arena extent per block to write (all or none): *sizes* bytes, with the
    block's *parents* in its chain (prefix-aware eviction). Needs a write session."""

    kind: ClassVar[str] = "reserve"
    reply: ClassVar[type[Message]] = Reserved
    names: list[str] = field(metadata=_BATCH)
    sizes: list[int] = field(metadata=_SIZES)
    parents: list[str | None] = field(default_factory=list, metadata=_BATCH)


@dataclass(**_MSG)
class Committed(Message):
    """Per reservation, in order: None (sealed) or why it was not."""

    kind: ClassVar[str] = "committed"
    errors: list[WireError | None]


@dataclass(**_MSG)
class Commit(Request):
    """Seal reserved extents as blocks; the daemon checks each against *checksums*
    (xxh3-64 of the bytes written) first and aborts a mismatch."""

    kind: ClassVar[str] = "commit"
    reply: ClassVar[type[Message]] = Committed
    ids: list[int] = field(metadata=_BATCH)
    checksums: list[int] = field(metadata=_CHECKSUMS)


@dataclass(**_MSG)
class Aborted(Message):
    kind: ClassVar[str] = "aborted"
    count: int


@dataclass(**_MSG)
class Abort(Request):
    kind: ClassVar[str] = "abort"
    reply: ClassVar[type[Message]] = Aborted
    ids: list[int] = field(metadata=_BATCH)


@dataclass(**_MSG)
class SuspectResult(Message):
    """``dropped``: the daemon found the copy bad and dropped it (a later lease takes
    another copy); False: the copy checked good (the client's read was at fault)."""

    kind: ClassVar[str] = "suspect_result"
    dropped: bool


@dataclass(**_MSG)
class Suspect(Request):
    """A leased copy failed the client's check: the lease ends and the daemon re-checks
    the copy itself, dropping it if bad."""

    kind: ClassVar[str] = "suspect"
    reply: ClassVar[type[Message]] = SuspectResult
    lease: int
    why: str = field(metadata=_TEXT)


@dataclass(**_MSG)
class Advised(Message):
    """``known``: how many of the names the store holds (the others were ignored)."""

    kind: ClassVar[str] = "advised"
    known: int


@dataclass(**_MSG)
class Advise(Request):
    """Advice from an engine or router about *names* (a chain, root first) for the
    eviction policies: ``when = "soon"`` (queued requests will read them) or ``"ended"``
    (their session is over). Advice never moves or removes a block by itself."""

    kind: ClassVar[str] = "hint"
    reply: ClassVar[type[Message]] = Advised
    names: list[str] = field(metadata=_BATCH)
    when: str
