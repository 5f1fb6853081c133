"""The serving side of the peer tier: other nodes ask this daemon for blocks (docs/cluster.md).

:class:`PeerServer` listens on ``[cluster] listen`` (TCP, descriptors only) in threads of
its own, never on the trio loop. Only the configured peers' addresses are served; each
is judged as the user its ``[[cluster.peers]]`` entry names (``uid``/``gid``; default the
mounting user) under the namespaces' access rules, as a local reader would be: a name it
may not read is answered ``denied``, and ``holdings`` lists only what it may read.

A fetched block is leased (``Store.lease_many``, promoting a disk copy into DRAM first,
as any reader's lease would), so its extent of the arena is not reused while it moves.
When it fits the landing buffer the asker named, this thread writes it there with NIXL
(the asker's agent was loaded from its ``hello``), lets the lease go and answers its
size and checksum: one round trip. Otherwise it is offered: the lease is kept for the
asker's NIXL read and ends when the asker releases it, when its connection ends, or at
its deadline. Bounds: ``max_connections`` connections at once (one more is answered
``busy`` and closed), ``max_in_flight`` bytes leased per connection (past it a name is
answered ``busy``); a write into a landing buffer takes at most ``timeout``.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
from collections.abc import Callable
from typing import Any

from kvfs.access import AccessDenied, Operation, Peer
from kvfs.config import ClusterConfig, PeerConfig
from kvfs.errors import KvfsError, TierUnavailable
from kvfs.leases import Lease
from kvfs.peers import Medium, block_hash_of
from kvfs.stats import PeerCounters
from kvfs.store import Store

from .nixl_agent import NixlAgent
from .peer_wire import BUSY, DENIED, FAILED, MAX_HOLDINGS, MISSING, PeerProtocolError, recv_frame, send_frame

__all__ = ["PeerServer"]

log = logging.getLogger("kvfs.peers")


def _addresses(host: str) -> set[str]:
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return set()


class PeerServer:
    """Serves *store*'s DRAM arena (registered with *agent*, this process's NIXL agent)
    to the peers of *config* (see the module doc); *counters(peer)* are where what each
    peer was served is counted."""

    def __init__(
        self, store: Store, config: ClusterConfig, *, agent: NixlAgent, counters: Callable[[str], PeerCounters]
    ) -> None:
        self.store = store
        self.config = config
        self.agent = agent
        self.counters = counters
        self.arena = store.slots[0]
        self._remote: dict[str, str] = {}  # peer -> its NIXL agent, loaded from its hello
        self.lease_ttl = max(30.0, config.timeout * 4)
        self._by_address: dict[str, PeerConfig] = {}
        for peer in config.peers:
            for addr in _addresses(peer.host):
                self._by_address[addr] = peer
        uid, gid = os.getuid(), os.getgid()
        self._identity = {
            p.name: Peer(uid if p.uid is None else p.uid, gid if p.gid is None else p.gid) for p in config.peers
        }
        self._slots = threading.BoundedSemaphore(config.max_connections)
        self._sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((config.host, config.port))
        except OSError as exc:
            self._sock.close()
            raise KvfsError(f"cannot listen for peers on {config.listen}: {exc.strerror}") from exc
        self._sock.listen(64)
        self._wake_r, self._wake_w = os.pipe()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.refused = 0
        """Connections refused (not a configured peer, or too many)."""
        self._thread = threading.Thread(target=self._accept_loop, name="kvfs-peer-server", daemon=True)
        self._thread.start()

    # -- connections -------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed:
            ready, _, _ = select.select([self._sock, self._wake_r], [], [])
            if self._closed or self._wake_r in ready:
                return
            try:
                conn, addr = self._sock.accept()
            except OSError:
                continue
            peer = self._by_address.get(addr[0])
            if peer is None:
                self.refused += 1
                log.warning("peer channel: refused %s: not a configured peer", addr[0])
                conn.close()
                continue
            if not self._slots.acquire(blocking=False):
                self.refused += 1
                try:
                    conn.settimeout(1.0)
                    send_frame(conn, {"error": f"{BUSY}: {self.config.max_connections} peer connections already"})
                except (TierUnavailable, PeerProtocolError):
                    pass
                conn.close()
                continue
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn, peer), name=f"kvfs-peer-{peer.name}", daemon=True).start()

    def _serve(self, conn: socket.socket, peer: PeerConfig) -> None:
        leases: dict[int, Lease] = {}
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while not self._closed:
                try:
                    msg = recv_frame(conn)
                except (TierUnavailable, PeerProtocolError) as exc:
                    log.info("peer channel from %s ended: %s", peer.name, exc)
                    return
                if msg is None:
                    return
                reply = self._answer(peer, msg, leases)
                if reply is not None:
                    send_frame(conn, reply)
        except (TierUnavailable, PeerProtocolError) as exc:
            log.info("peer channel to %s ended: %s", peer.name, exc)
        finally:
            for lease in leases.values():
                self.store.release(lease)
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            self._slots.release()

    # -- requests ----------------------------------------------------------------------

    def _answer(self, peer: PeerConfig, msg: dict[str, Any], leases: dict[int, Lease]) -> dict[str, Any] | None:
        op = msg.get("op")
        if op == "hello":
            return self._hello(peer, msg)
        if op == "fetch":
            name, dest, room = msg.get("name"), msg.get("dest"), msg.get("room")
            if not isinstance(name, str) or not isinstance(dest, int) or not isinstance(room, int):
                return {"error": "fetch: needs a name, a dest and a room"}
            return {"got": self._fetch(peer, name, dest, room, leases)}
        if op == "release":
            for token in msg.get("tokens") or ():
                lease = leases.pop(token, None) if isinstance(token, int) else None
                if lease is not None:
                    self.store.release(lease)
            return None
        if op == "holdings":
            return {"holdings": self._holdings(peer)}
        return {"error": f"unknown request {op!r}"}

    def _hello(self, peer: PeerConfig, msg: dict[str, Any]) -> dict[str, Any]:
        agent, metadata = msg.get("agent"), msg.get("metadata")
        if isinstance(agent, str) and isinstance(metadata, bytes):
            with self._lock:
                known = self._remote.get(peer.name)
            if known != agent:  # first contact, or the peer restarted
                try:
                    loaded = self.agent.connect(metadata)
                except TierUnavailable as exc:
                    log.warning("peer %s: its NIXL metadata does not load: %s", peer.name, exc)
                else:
                    with self._lock:
                        old, self._remote[peer.name] = self._remote.get(peer.name), loaded
                    if old is not None and old != loaded:
                        self.agent.forget(old)
        return {"node": self.config.node, "agent": self.agent.name, "metadata": self.agent.metadata}

    def _fetch(self, peer: PeerConfig, name: str, dest: int, room: int, leases: dict[int, Lease]) -> Any:
        try:
            self.store.check_access(self._identity[peer.name], name, Operation.READ)
        except AccessDenied:
            return DENIED
        except KvfsError:  # a name that is not a valid path
            return MISSING
        try:
            [lease] = self.store.lease_many([name], ttl=self.lease_ttl, promote="always", count_hits=False)
        except KvfsError as exc:
            log.info("peer %s: fetch of %s failed: %s", peer.name, name, exc)
            return MISSING
        if not isinstance(lease, Lease):
            return MISSING
        if lease.slot is not self.arena or lease.location is None:
            self.store.release(lease)
            return MISSING
        with self._lock:
            remote = self._remote.get(peer.name)
        counters = self.counters(peer.name)
        if remote is not None and lease.size <= room:
            try:
                self.agent.write(remote, lease.location.offset, dest, lease.size, self.config.timeout)
            except (TierUnavailable, ValueError) as exc:
                log.info("peer %s: writing %s into its landing buffer failed: %s", peer.name, name, exc)
                return FAILED
            finally:
                self.store.release(lease)
            counters.add("served")
            counters.add("bytes_served", lease.size)
            return [lease.size, lease.checksum]
        held = sum(x.size for x in leases.values())
        if held + lease.size > self.config.max_in_flight:
            self.store.release(lease)
            return BUSY
        leases[lease.id] = lease
        counters.add("served")
        counters.add("bytes_served", lease.size)
        return [lease.size, lease.checksum, self.agent.base + lease.location.offset, lease.id]

    def _holdings(self, peer: PeerConfig) -> list[Any]:
        who = self._identity[peer.name]
        dram = self.arena.name
        local = {s.name for s in self.store.slots if not s.shared}
        out: list[Any] = []
        for stat in self.store.walk(""):
            h = block_hash_of(stat.name)
            if h is None or not local.intersection(stat.tiers):
                continue
            try:
                self.store.check_access(who, stat.name, Operation.READ)
            except AccessDenied:
                continue
            out.append([h, int(Medium.DRAM if dram in stat.tiers else Medium.DISK)])
            if len(out) >= MAX_HOLDINGS:
                break
        return out

    def close(self) -> None:
        """Stop accepting, end every connection (their leases are released)."""
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
