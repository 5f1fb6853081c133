"""The serving side of the peer tier: other nodes ask this daemon for blocks (docs/cluster.md).

:class:`PeerServer` listens on ``[cluster] listen`` (TCP, descriptors only) in threads of
its own, never on the trio loop. Only the configured peers' addresses are served; each
is judged as the user its ``[[cluster.peers]]`` entry names (``uid``/``gid``; default the
mounting user) under the namespaces' access rules, as a local reader would be: a name it
may not read is answered ``denied``, and ``holdings`` lists only what it may read.

A peer's ``hello`` carries its NIXL agent's metadata: its connection and the landing
buffers it set aside for this node. It is loaded only when the agent's name is one of
that peer's (``<node>-<pid>-<hex>``, the name inside the metadata too), so one peer
cannot pass itself off as another and have blocks written into the other's buffers.
Nothing of this node's own agent is sent: a peer never moves bytes to or from it.

A fetched block is leased (``Store.lease_many``, promoting a disk copy into DRAM first,
as any reader's lease would), so its extent of the arena is not reused while it moves,
and this thread writes it with NIXL into the landing buffers the request named (the
asker's agent), then answers its size and checksum. A block larger than those buffers
is held for the connection (one at a time) and sent on in chunks, one ``more`` each;
the lease ends when the last chunk is written, at ``release``, at the next ``fetch``,
when the connection ends, or at its deadline. Bounds: ``max_connections`` connections
at once (one more is answered ``busy`` and closed), one block held per connection, at
most ``MAX_DESTS`` buffers per request; a request is at most ``MAX_REQUEST`` bytes, and
once it has begun it must arrive within ``timeout``; a write takes at most ``timeout``.
A connection may stay idle between requests (the asker keeps a few for its next reads);
TCP keepalives end one whose peer vanished within about a minute.
"""

from __future__ import annotations

import logging
import os
import re
import select
import socket
import threading
from collections.abc import Callable
from typing import Any

from kvfs.access import Operation, Peer
from kvfs.config import ClusterConfig, PeerConfig
from kvfs.errors import AccessDenied, KvfsError, TierUnavailable
from kvfs.hashing import block_hash_of
from kvfs.leases import Lease
from kvfs.nixl import agent_of
from kvfs.peers import Medium
from kvfs.stats import PeerCounters
from kvfs.store import Store

from .nixl_agent import NixlAgent
from .peer_wire import (
    BUSY,
    DENIED,
    FAILED,
    MAX_DESTS,
    MAX_HOLDINGS,
    MAX_REQUEST,
    MISSING,
    PeerProtocolError,
    recv_frame,
    send_frame,
)

__all__ = ["PeerServer"]

log = logging.getLogger("kvfs.peers")


_AGENT_TAIL = re.compile(r"-[0-9]+-[0-9a-f]+")
_MAX_ROOM = 1 << 30
_KEEPALIVE = ((socket.TCP_KEEPIDLE, 30), (socket.TCP_KEEPINTVL, 10), (socket.TCP_KEEPCNT, 3))


def agent_belongs(agent: str, node: str) -> bool:
    """Whether *agent* is a NIXL agent name node *node* gives its agents
    (``<node>-<pid>-<hex>``, ``kvfs.mount.cluster``)."""
    return agent.startswith(f"{node}-") and _AGENT_TAIL.fullmatch(agent[len(node) :]) is not None


class _Held:
    """One connection's state: the NIXL agent its peer named in its ``hello`` (the only
    one written to through it), and the block it is sending in chunks (its lease and the
    bytes sent)."""

    __slots__ = ("agent", "candidates", "done", "lease", "peer")

    def __init__(self, candidates: list[PeerConfig]) -> None:
        self.candidates = candidates  # the configured peers at the connection's address
        # the peer it is: known from the address alone, or from the first good hello
        self.peer: PeerConfig | None = candidates[0] if len(candidates) == 1 else None
        self.agent: str | None = None
        self.lease: Lease | None = None
        self.done = 0

    @property
    def named(self) -> str:
        return self.peer.name if self.peer is not None else " or ".join(p.name for p in self.candidates)


def _named_by(candidates: list[PeerConfig], agent: object) -> PeerConfig:
    """The peer among *candidates* (several at one address) whose agents *agent* names
    as one of theirs; the first when none does, so that its hello is refused saying why."""
    for peer in candidates:
        if isinstance(agent, str) and agent_belongs(agent, peer.name):
            return peer
    return candidates[0]


def _addresses(host: str) -> set[str]:
    try:
        return {str(ai[4][0]) for ai in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
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
        # the peers at each address: one, in a cluster of one node per host; several where
        # nodes share a host (a test bed), told apart by the agent their hello names
        self._by_address: dict[str, list[PeerConfig]] = {}
        for peer in config.peers:
            for addr in _addresses(peer.host):
                self._by_address.setdefault(addr, []).append(peer)
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
            waits: list[socket.socket | int] = [self._sock, self._wake_r]
            ready, _, _ = select.select(waits, [], [])
            if self._closed or self._wake_r in ready:
                return
            try:
                conn, addr = self._sock.accept()
            except OSError:
                continue
            peers = self._by_address.get(addr[0])
            if peers is None:
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
            name = "|".join(p.name for p in peers)
            threading.Thread(target=self._serve, args=(conn, peers), name=f"kvfs-peer-{name}", daemon=True).start()

    def _serve(self, conn: socket.socket, peers: list[PeerConfig]) -> None:
        held = _Held(peers)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in _KEEPALIVE:
                conn.setsockopt(socket.IPPROTO_TCP, option, value)
            while not self._closed:
                try:
                    msg = recv_frame(conn, limit=MAX_REQUEST, within=self.config.timeout)
                except (TierUnavailable, PeerProtocolError) as exc:
                    log.info("peer channel from %s ended: %s", held.named, exc)
                    return
                if msg is None:
                    return
                reply = self._answer(msg, held)
                if reply is not None:
                    send_frame(conn, reply)
        except (TierUnavailable, PeerProtocolError) as exc:
            log.info("peer channel to %s ended: %s", held.named, exc)
        finally:
            self._let_go(held)
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            self._slots.release()

    # -- requests ----------------------------------------------------------------------

    def _answer(self, msg: dict[str, Any], held: _Held) -> dict[str, Any] | None:
        op = msg.get("op")
        if op == "hello":
            asker = held.peer or _named_by(held.candidates, msg.get("agent"))
            reply = self._hello(asker, msg)
            if "error" not in reply:
                held.agent, held.peer = msg["agent"], asker
            return reply
        peer = held.peer
        if peer is None:
            return {
                "error": f"{op}: say hello first: peers {held.named} share this address, and the hello tells them apart"
            }
        if op in ("fetch", "more"):
            name, dests, room = msg.get("name"), msg.get("dests"), msg.get("room")
            if (
                not isinstance(dests, list)
                or not 0 < len(dests) <= MAX_DESTS
                or not all(isinstance(d, int) and d > 0 for d in dests)
                or not isinstance(room, int)
                or not 0 < room <= _MAX_ROOM
            ):
                return {"error": f"{op}: needs 1 to {MAX_DESTS} buffer addresses and their room (1 byte to 1GiB)"}
            remote = held.agent
            if remote is None:
                return {"error": f"{op}: say hello first (with your NIXL agent's metadata)"}
            if op == "more":
                return {"got": self._send(peer, remote, held, dests, room)}
            if not isinstance(name, str):
                return {"error": "fetch: needs a name"}
            return {"got": self._fetch(peer, remote, name, dests, room, held)}
        if op == "release":
            self._let_go(held)
            return None
        if op == "holdings":
            return {"holdings": self._holdings(peer)}
        return {"error": f"unknown request {op!r}"}

    def _hello(self, peer: PeerConfig, msg: dict[str, Any]) -> dict[str, Any]:
        agent, metadata = msg.get("agent"), msg.get("metadata")
        if not isinstance(agent, str) or not isinstance(metadata, bytes):
            return {"error": "hello: needs the asker's NIXL agent and metadata"}
        if not agent_belongs(agent, peer.name):
            log.warning("peer %s: refused NIXL agent %r: not one of that node's", peer.name, agent)
            return {"error": f"hello: NIXL agent {agent!r} is not one of node {peer.name}'s"}
        if agent_of(metadata) != agent:
            log.warning("peer %s: refused NIXL metadata of agent %r as %r", peer.name, agent_of(metadata), agent)
            return {"error": f"hello: the metadata is of NIXL agent {agent_of(metadata)!r}, not {agent!r}"}
        with self._lock:
            known = self._remote.get(peer.name)
        if known != agent:  # first contact, or the peer restarted
            try:
                self.agent.connect(metadata)
            except TierUnavailable as exc:
                log.warning("peer %s: its NIXL metadata does not load: %s", peer.name, exc)
                return {"error": f"hello: your NIXL metadata does not load here: {exc}"}
            with self._lock:
                old, self._remote[peer.name] = self._remote.get(peer.name), agent
            if old is not None and old != agent:
                self.agent.forget(old)
        return {"node": self.config.node}

    def _let_go(self, held: _Held) -> None:
        if held.lease is not None:
            self.store.release(held.lease)
        held.lease, held.done = None, 0

    def _fetch(self, peer: PeerConfig, remote: str, name: str, dests: list[int], room: int, held: _Held) -> Any:
        self._let_go(held)
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
        held.lease = lease
        return self._send(peer, remote, held, dests, room)

    def _send(self, peer: PeerConfig, remote: str, held: _Held, dests: list[int], room: int) -> Any:
        """Write the held block's next bytes into *dests*; ``[size, checksum, done]``."""
        lease = held.lease
        if lease is None or lease.location is None or self.store.leases.get(lease.id) is not lease:
            self._let_go(held)  # none held, or its lease ended (its extent may hold another block now)
            return MISSING
        n = min(lease.size - held.done, len(dests) * room)
        try:
            self.agent.write(remote, lease.location.offset + held.done, n, dests, room, self.config.timeout)
        except (TierUnavailable, ValueError) as exc:
            log.info("peer %s: writing %s into its landing buffers failed: %s", peer.name, lease.name, exc)
            self._let_go(held)
            return FAILED
        held.done += n
        got = [lease.size, lease.checksum, held.done]
        if held.done >= lease.size:
            self._let_go(held)
            counters = self.counters(peer.name)
            counters.add("served")
            counters.add("bytes_served", lease.size)
        return got

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
