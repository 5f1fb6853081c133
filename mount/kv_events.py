"""KV events for routers: kvfs's block events in vLLM's format, msgpack over ZMQ PUB.

llm-d's KV-cache indexer and Dynamo's router consume the events vLLM publishes
(``vllm.distributed.kv_events``: a ``KVEventBatch`` of ``BlockStored`` /
``BlockRemoved`` / ``AllBlocksCleared``, each message ``(topic, seq: 8 bytes big-endian,
msgpack payload)`` on a PUB socket). kvfs publishes the same messages for what it holds,
so a router can send a request to the node whose kvfs has its prefix.

- **Which blocks.** Blocks named by a hash, as the naming contract lays them out:
  ``<namespace>/<ab>/<hex>`` (the last part hex, the folder its first two characters) --
  the names kvfs's vLLM connector gives vLLM's blocks (``kvfs.gpu.vllm_connector``) and
  kvfs's own hash chain. The event's block hash is that hex as bytes: for the connector's
  blocks exactly vLLM's own block hash. Other files (a safetensors folder, a temp name)
  publish nothing.
- **Medium and locality** from the tier: the DRAM tier is ``CPU``, the others ``STORAGE``;
  node-local tiers are ``LOCAL``, shared ones (posix, S3) ``REMOTE``.
- **Mapping.** ``stored`` (a block sealed into a tier), ``promoted``, ``demoted`` (a copy
  made in a tier): ``BlockStored`` for that tier, with the parent's hash where the writer
  gave its prefix chain; ``evicted``, ``corrupt`` (a copy dropped from a tier):
  ``BlockRemoved`` for that tier; ``removed`` (the block is gone): ``BlockRemoved`` with
  no medium; ``renamed``: removed under the old hash, stored under the new. The publisher
  starts with ``AllBlocksCleared`` (a subscriber forgets what it knew of this node), and
  sends it again when it stops (the daemon unmounts).
- kvfs knows no token ids: ``token_ids`` is empty and ``block_size`` is ``[events]
  block_size`` (the engine's tokens per block; 0 when not set).
- **Who sees the names** (:class:`Audience`, ``[events] audience``): a block's name says
  what a tenant cached, so the publisher sends only the names its audience may read under
  the namespaces' access rules. ``everyone`` (the default: any local user can connect to a
  ``tcp://`` port) sends names outside every namespace and in namespaces whose rule lets
  others read; ``group:NAME`` (an ``ipc://`` socket given to that group, 0660) what the
  group's bits let it read; ``owner`` (an ``ipc://`` socket of the daemon's user, 0600)
  everything; ``all`` everything, to whoever can connect (a router elsewhere, on a trusted
  network: the operator's explicit choice, logged at start).
- **A subscriber that falls behind** loses events (the hub's queue for the publisher is
  bounded, :mod:`kvfs.mount.eventhub`) and is told with ``AllBlocksCleared``: it forgets
  what it knew of this node and learns again from the events that follow. Dropped events
  are counted (``KvEventPublisher.lost``); the daemon never waits for the publisher.

Run by the daemon with ``[events] zmq = "tcp://127.0.0.1:5557"`` (:func:`publish_hub`), or
by ``kvfs events --zmq ADDR`` beside a running daemon (:func:`publish_stream`: what the
user running it may read, to whoever can connect to its address).
"""

from __future__ import annotations

import grp
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvfs.access import AccessRule, Operation, Peer, decide
from kvfs.errors import KvfsError
from kvfs.events import Event, EventKind
from kvfs.hashing import block_hash_of

from .eventhub import Gap

if TYPE_CHECKING:  # the tools import this module without a daemon's loop
    from .workers import Offload

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_STORAGE",
    "Audience",
    "EventsUnavailable",
    "KvEventPublisher",
    "TierPlace",
    "Translator",
    "block_hash_of",
    "publish_hub",
    "publish_stream",
    "tier_places",
]

log = logging.getLogger(__name__)

MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"
LOCAL, REMOTE = "LOCAL", "REMOTE"

_NOBODY = 2**32 - 2  # a uid no namespace names: a subscriber judged by a rule's group or other bits
_IN_THREAD = 256  # events of one burst translated and sent on the loop; more in a worker thread


class EventsUnavailable(KvfsError):
    """The ZMQ publisher cannot run (pyzmq or msgpack missing, an address that cannot be
    bound, an audience whose group does not exist)."""


class Audience:
    """Who may subscribe to a publisher (``[events] audience``), and so which block names
    it may send them (see the module doc). *rule_of(name)*: the access rule of the
    namespace holding a name (None: none, or no rule)."""

    KINDS = ("everyone", "owner", "all")

    def __init__(self, spec: str, rule_of: Callable[[str], AccessRule | None]) -> None:
        self.spec = spec
        self.rule_of = rule_of
        self.gid: int | None = None
        if spec.startswith("group:"):
            group = spec.removeprefix("group:")
            try:
                self.gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
            except KeyError:
                raise EventsUnavailable(f"events.audience: no group named {group!r} on this machine") from None
        elif spec not in self.KINDS:
            raise EventsUnavailable(f"events.audience: {spec!r} is not one of everyone, owner, all, group:NAME")
        self._peer = Peer(_NOBODY, _NOBODY if self.gid is None else self.gid)
        self._decided: dict[AccessRule, bool] = {}

    @property
    def everything(self) -> bool:
        """Every name may be sent (the audience is the daemon's user, or the operator chose all)."""
        return self.spec in ("owner", "all")

    def may_see(self, name: str) -> bool:
        """Whether every member of the audience may read block *name*."""
        if self.everything:
            return True
        rule = self.rule_of(name)
        if rule is None:
            return True  # outside every namespace, or in one without a rule: the mount's defaults
        ok = self._decided.get(rule)
        if ok is None:
            ok = self._decided[rule] = decide(self._peer, rule, Operation.READ)
        return ok

    def socket_mode(self) -> tuple[int, int | None]:
        """The mode (and group) of an ``ipc://`` socket file for this audience."""
        if self.spec == "owner":
            return 0o600, None
        if self.gid is not None:
            return 0o660, self.gid
        return 0o666, None


@dataclass(frozen=True, kw_only=True)
class TierPlace:
    """How a tier appears in events: ``medium`` and ``locality``."""

    medium: str
    locality: str

    @classmethod
    def of(cls, kind: str, shared: bool) -> TierPlace:
        return cls(medium=MEDIUM_CPU if kind == "dram" else MEDIUM_STORAGE, locality=REMOTE if shared else LOCAL)


class Translator:
    """kvfs :class:`Event` -> vLLM event records (plain dicts, as msgspec encodes vLLM's
    tagged structs: ``{"type": "BlockStored", field: value, ...}``).

    *tiers*: tier name -> :class:`TierPlace`. A stored block's parent is the one its
    event carries (the prefix chain its writer gave)."""

    def __init__(self, tiers: dict[str, TierPlace], *, block_size: int = 0) -> None:
        self.tiers = tiers
        self.block_size = block_size

    def _stored(self, h: bytes, tier: str | None, parent: str | None) -> dict[str, Any]:
        place = self.tiers.get(tier or "")
        rec: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": [h],
            "parent_block_hash": block_hash_of(parent) if parent else None,
            "token_ids": [],
            "block_size": self.block_size,
            "lora_id": None,
            "medium": place.medium if place else None,
            "lora_name": None,
        }
        if place is not None:
            rec["locality"] = place.locality
        return rec

    def _removed(self, h: bytes, tier: str | None) -> dict[str, Any]:
        place = self.tiers.get(tier or "")
        rec: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": [h], "medium": place.medium if place else None}
        if place is not None:
            rec["locality"] = place.locality
        return rec

    def translate(self, ev: Event) -> list[dict[str, Any]]:
        h = block_hash_of(ev.name)
        if ev.kind is EventKind.RENAMED:
            out = []
            old = block_hash_of(ev.detail)
            if old is not None:
                out.append(self._removed(old, None))
            if h is not None:
                out.append(self._stored(h, ev.tier, ev.parent))
            return out
        if h is None:
            return []
        if ev.kind in (EventKind.STORED, EventKind.PROMOTED, EventKind.DEMOTED):
            return [self._stored(h, ev.tier, ev.parent)]
        if ev.kind in (EventKind.EVICTED, EventKind.CORRUPT):
            return [self._removed(h, ev.tier)]
        # every kind is handled above or here; a kind added later translates to nothing
        return [self._removed(h, None)] if ev.kind is EventKind.REMOVED else []


ALL_CLEARED: dict[str, Any] = {"type": "AllBlocksCleared"}


class KvEventPublisher:
    """A ZMQ PUB socket bound at *address* sending vLLM ``KVEventBatch`` messages:
    ``(topic, seq, msgpack([ts, [event, ...]]))``, seq counting from 0. A PUB socket never
    blocks: a subscriber that cannot keep up loses messages (it sees the gap in seq)."""

    def __init__(self, address: str, *, topic: str = "", mode: tuple[int, int | None] | None = None) -> None:
        """*mode*: for an ``ipc://`` address, the socket file's mode and group (it is
        created closed to everyone and opened only once they are set)."""
        try:
            import msgpack
            import zmq
        except ImportError as exc:
            raise EventsUnavailable(
                f"KV events need pyzmq and msgpack ({exc.name} is missing): pip install 'kvfs[events]'"
            ) from None
        self._pack = msgpack.Packer(use_bin_type=True)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 500)
        self._sock.setsockopt(zmq.SNDHWM, 100_000)
        ipc = address.startswith("ipc://")
        old_umask = os.umask(0o077) if ipc and mode is not None else None
        try:
            self._sock.bind(address)
            if ipc and mode is not None:
                path = address.removeprefix("ipc://")
                if mode[1] is not None:
                    os.chown(path, -1, mode[1])
                os.chmod(path, mode[0])
        except (zmq.ZMQError, OSError) as exc:
            self._sock.close(linger=0)
            raise EventsUnavailable(f"cannot publish KV events on {address!r}: {exc}") from None
        finally:
            if old_umask is not None:
                os.umask(old_umask)
        self.address = self._sock.get_string(zmq.LAST_ENDPOINT)
        self._topic = topic.encode()
        self.seq = 0
        self.sent = 0  # events sent
        self.lost = 0  # events the hub dropped before they reached this publisher (each gap: AllBlocksCleared)

    def send(self, events: Sequence[dict[str, Any]]) -> None:
        if not events:
            return
        payload = self._pack.pack([time.time(), list(events)])
        self._sock.send_multipart((self._topic, self.seq.to_bytes(8, "big"), payload), copy=False)
        self.seq += 1
        self.sent += len(events)

    def close(self) -> None:
        try:
            self.send([ALL_CLEARED])
        finally:
            self._sock.close()


def tier_places(tiers: Iterable[tuple[str, str, bool]]) -> dict[str, TierPlace]:
    """(name, kind, shared) of each tier -> its :class:`TierPlace`."""
    return {name: TierPlace.of(kind, shared) for name, kind, shared in tiers}


async def publish_hub(
    hub: Any,
    tiers: Any,
    config: Any,
    pub: KvEventPublisher,
    audience: Audience,
    *,
    offload: Offload,
    task_status: Any = None,
) -> None:
    """The daemon's publisher (``[events] zmq``): every event of *hub* (the daemon's
    :class:`~kvfs.mount.eventhub.EventHub`) whose name *audience* may see, translated,
    one batch per burst, on *pub* until cancelled (then it is closed). *tiers*: the
    store's tiers. A gap (events the hub dropped while this publisher was behind) is sent
    as ``AllBlocksCleared``. A burst of more than 256 events is translated and sent in a
    thread *offload* gives (``Workers.events``)."""

    places = tier_places((t.name, t.kind.value, t.shared) for t in tiers)
    tr = Translator(places, block_size=config.block_size)
    log.info("publishing KV events on %s (audience: %s)", pub.address, audience.spec)
    if audience.spec == "all":
        log.warning("KV events on %s carry every namespace's block names to whoever can connect", pub.address)

    def send(items: list[Event | Gap]) -> None:
        batch: list[dict[str, Any]] = []
        for it in items:
            if isinstance(it, Gap):
                pub.lost += it.count
                log.warning("the KV event publisher fell behind: %d events lost; sending AllBlocksCleared", it.count)
                pub.send(batch)
                batch = [ALL_CLEARED]
            elif audience.may_see(it.name) and (it.kind is not EventKind.RENAMED or audience.may_see(it.detail)):
                batch.extend(tr.translate(it))
        pub.send(batch)

    try:
        with hub.subscribe(cut_off=False) as events:
            pub.send([ALL_CLEARED])
            if task_status is not None:
                task_status.started(pub.address)
            while True:
                items = await events.receive()
                if len(items) > _IN_THREAD:  # a burst's translation leaves the loop
                    await offload(send, items)
                else:
                    send(items)
    finally:
        pub.close()


def publish_stream(events: Iterable[Event], pub: KvEventPublisher, tr: Translator) -> int:
    """``kvfs events --zmq``: publish each event of *events* (a control-socket stream) as
    it arrives; returns the number of events sent."""
    pub.send([ALL_CLEARED])
    for ev in events:
        pub.send(tr.translate(ev))
    return pub.sent
