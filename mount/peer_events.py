"""Learning what peers hold: their KV events, and a snapshot when events were missed.

:class:`PeerWatch` subscribes (ZMQ SUB) to the KV events of every peer with an
``events`` address (vLLM's ``KVEventBatch`` messages, ``kvfs.mount.kv_events``) and
applies them to the :class:`~kvfs.peers.PeerIndex`: ``BlockStored`` in a tier of the
peer's own (locality ``LOCAL``; ``CPU`` is its DRAM, ``STORAGE`` its disk) adds the hash,
``BlockRemoved`` drops it (for that medium, or every copy when no medium is given),
``AllBlocksCleared`` forgets the peer. A copy in a shared tier (``REMOTE``) is not the
peer's to serve and is ignored.

A subscriber only sees events sent after it connected, and a PUB socket drops messages
a slow subscriber cannot take. So a peer's holdings are also asked over its channel
(``holdings``) at start, after ``AllBlocksCleared`` (it restarted) and after a gap in the
sequence numbers; a peer that does not answer is asked again every ``_RETRY`` seconds.
Both run in threads of their own; an idle watch wakes twice a second.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kvfs.config import ClusterConfig
from kvfs.errors import KvfsError
from kvfs.peers import Medium, PeerIndex

__all__ = ["PeerWatch"]

log = logging.getLogger("kvfs.peers")

_POLL_MS = 500
_RETRY = 2.0


class PeerWatch:
    """Keeps *index* in line with the peers of *config*; *holdings(peer, timeout)* asks a
    peer's snapshot (``NixlPeers.holdings``)."""

    def __init__(
        self, config: ClusterConfig, index: PeerIndex, holdings: Callable[[str, float], list[tuple[bytes, int]]]
    ) -> None:
        import msgpack
        import zmq

        self.config = config
        self.index = index
        self._holdings = holdings
        self._unpack = msgpack.unpackb
        self._zmq = zmq
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._subs: dict[Any, str] = {}
        for peer in config.peers:
            if peer.events is None:
                continue
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.setsockopt(zmq.RCVHWM, 100_000)
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
            sub.connect(peer.events)
            self._subs[sub] = peer.name
        self._seq: dict[str, int] = {}
        self._stale = {p.name for p in config.peers}  # peers whose snapshot is due
        self._wake = threading.Condition()
        self._closed = False
        self.events = 0
        """Events applied."""
        self.snapshots = 0
        """Snapshots applied."""
        self._threads = [
            threading.Thread(target=self._listen, name="kvfs-peer-events", daemon=True),
            threading.Thread(target=self._snapshots, name="kvfs-peer-snapshots", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def synced(self, peer: str) -> bool:
        """Whether *peer*'s snapshot has been applied since it was last due."""
        with self._wake:
            return peer not in self._stale

    def _due(self, peer: str) -> None:
        with self._wake:
            self._stale.add(peer)
            self._wake.notify()

    # -- events ------------------------------------------------------------------------

    def _listen(self) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        for sub in self._subs:
            poller.register(sub, zmq.POLLIN)
        while not self._closed:
            try:
                ready = dict(poller.poll(_POLL_MS))
            except zmq.ZMQError:
                return
            for sub in ready:
                peer = self._subs[sub]
                while True:
                    try:
                        frames = sub.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    except zmq.ZMQError:
                        return
                    self._message(peer, frames)

    def _message(self, peer: str, frames: list[bytes]) -> None:
        if len(frames) != 3:
            return
        seq = int.from_bytes(frames[1], "big")
        last = self._seq.get(peer)
        self._seq[peer] = seq
        if last is not None and seq != last + 1 and seq != 0:
            self._due(peer)  # events were lost: ask for the whole picture
        try:
            _, events = self._unpack(frames[2], raw=False)
        except (ValueError, TypeError) as exc:
            log.warning("peer %s sent an event batch that does not decode: %s", peer, exc)
            return
        for ev in events:
            if isinstance(ev, dict):
                self._apply(peer, ev)

    def _apply(self, peer: str, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        if kind == "AllBlocksCleared":
            self.index.cleared(peer)
            self._due(peer)
            return
        medium = _medium(ev)
        for h in ev.get("block_hashes") or ():
            if not isinstance(h, bytes):
                continue
            if kind == "BlockStored" and medium is not None:
                self.index.stored(peer, h, medium)
            elif kind == "BlockRemoved" and (medium is not None or ev.get("medium") is None):
                self.index.removed(peer, h, medium)
        self.events += 1

    # -- snapshots ---------------------------------------------------------------------

    def _snapshots(self) -> None:
        while True:
            with self._wake:
                while not self._stale and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                due = sorted(self._stale)
            failed = False
            for peer in due:
                try:
                    held = self._holdings(peer, self.config.timeout * 2)
                except KvfsError as exc:
                    log.debug("holdings of peer %s: %s", peer, exc)
                    failed = True
                    continue
                with self._wake:
                    self._stale.discard(peer)
                for h, m in held:
                    self.index.stored(peer, h, Medium(m))
                self.snapshots += 1
            if failed:
                with self._wake:
                    self._wake.wait(_RETRY)

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        for t in self._threads:
            t.join(timeout=2)
        for sub in self._subs:
            sub.close(linger=0)


def _medium(ev: dict[str, Any]) -> Medium | None:
    """The peer's own medium an event names, or None (no medium, or a shared tier's copy)."""
    if ev.get("locality", "LOCAL") != "LOCAL":
        return None
    return {"CPU": Medium.DRAM, "STORAGE": Medium.DISK}.get(ev.get("medium") or "")
