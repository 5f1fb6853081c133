"""The asking side of the peer tier: descriptors over the peer channel, bytes over NIXL.

:class:`NixlPeers` is the :class:`~kvfs.peers.PeerSource` the daemon gives its store.
Per peer it keeps a few TCP connections to the peer's channel (``kvfs.mount.peer_server``;
at most ``MAX_LINKS`` at once, each used by one read at a time) and the peer's NIXL
agent loaded from its ``hello`` (which carries this node's agent, so the peer can write
into its landing buffers); a peer that restarted (a new agent) is loaded again.

A ``fetch`` names a free landing buffer of this node (:class:`~kvfs.mount.nixl_agent.Landing`):
the peer writes the block into it and answers its size and checksum, one round trip;
:meth:`NixlPeers.read` then copies it into the arena extent reserved for it, where it is
checked. A block larger than a landing buffer (or with every buffer busy) is offered
instead and read with NIXL from the peer's arena, then released. Every call is bounded by
the timeout it is given: a connection that does not answer in time is closed, never
reused, and its landing buffer rests a while before it is used again.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from kvfs.config import ClusterConfig, PeerConfig
from kvfs.errors import TierUnavailable
from kvfs.peers import Offer, PeerSource

from .nixl_agent import NixlAgent
from .peer_wire import FAILED, PeerProtocolError, recv_frame, send_frame

__all__ = ["MAX_LINKS", "NixlPeers"]

log = logging.getLogger("kvfs.peers")

MAX_LINKS = 4  # connections per peer


class _Link:
    """One connection to a peer's channel."""

    def __init__(self, peer: PeerConfig, timeout: float) -> None:
        self.peer = peer
        try:
            self.sock = socket.create_connection((peer.host, peer.port), timeout=timeout)
        except OSError as exc:
            raise TierUnavailable(f"peer {peer.name} ({peer.address}): cannot connect: {exc}") from exc
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def ask(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.sock.settimeout(max(timeout, 0.001))
        send_frame(self.sock, msg)
        try:
            reply = recv_frame(self.sock)
        except PeerProtocolError as exc:
            raise TierUnavailable(f"peer {self.peer.name}: {exc}") from exc
        if reply is None:
            raise TierUnavailable(f"peer {self.peer.name} closed the connection")
        if "error" in reply:
            raise TierUnavailable(f"peer {self.peer.name}: {reply['error']}")
        return reply

    def tell(self, msg: dict[str, Any], timeout: float) -> None:
        self.sock.settimeout(max(timeout, 0.001))
        send_frame(self.sock, msg)

    def close(self) -> None:
        self.sock.close()


class _PeerState:
    def __init__(self, peer: PeerConfig) -> None:
        self.peer = peer
        self.idle: list[_Link] = []
        self.open = 0
        self.agent: str | None = None
        self.lock = threading.Lock()
        self.freed = threading.Condition(self.lock)


class NixlPeers(PeerSource):
    """Reads from the peers of *config* through *agent* (this node's NIXL agent)."""

    def __init__(self, config: ClusterConfig, agent: NixlAgent) -> None:
        self.config = config
        self.agent = agent
        self._peers = {p.name: _PeerState(p) for p in config.peers}

    # -- connections -------------------------------------------------------------------

    def _take(self, state: _PeerState, deadline: float) -> _Link:
        with state.lock:
            while not state.idle and state.open >= MAX_LINKS:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TierUnavailable(f"peer {state.peer.name}: every connection is busy")
                state.freed.wait(left)
            if state.idle:
                return state.idle.pop()
            state.open += 1
        try:
            link = _Link(state.peer, max(deadline - time.monotonic(), 0.001))
            hello = {"op": "hello", "node": self.config.node, "agent": self.agent.name, "metadata": self.agent.metadata}
            reply = link.ask(hello, deadline - time.monotonic())
            agent = str(reply["agent"])
            if agent != state.agent:  # first contact, or the peer restarted
                if state.agent is not None:
                    self.agent.forget(state.agent)
                self.agent.connect(bytes(reply["metadata"]))
                state.agent = agent
            return link
        except BaseException:
            self._drop(state, None)
            raise

    def _give(self, state: _PeerState, link: _Link) -> None:
        with state.lock:
            state.idle.append(link)
            state.freed.notify()

    def _drop(self, state: _PeerState, link: _Link | None) -> None:
        if link is not None:
            link.close()
        with state.lock:
            state.open -= 1
            state.freed.notify()

    def _ask(self, peer: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        state = self._peers[peer]
        deadline = time.monotonic() + timeout
        link = self._take(state, deadline)
        try:
            reply = link.ask(msg, deadline - time.monotonic())
        except BaseException:
            self._drop(state, link)
            raise
        self._give(state, link)
        return reply

    # -- PeerSource ----------------------------------------------------------------------

    def fetch(self, peer: str, name: str, timeout: float) -> Offer | None:
        state = self._peers[peer]
        landing = self.agent.landing
        dest = landing.take()
        deadline = time.monotonic() + timeout
        try:
            link = self._take(state, deadline)
        except BaseException:
            if dest is not None:
                landing.give(dest)
            raise
        msg = {"op": "fetch", "name": name, "dest": dest or 0, "room": landing.size if dest is not None else 0}
        try:
            reply = link.ask(msg, deadline - time.monotonic())
        except BaseException:
            self._drop(state, link)
            if dest is not None:
                landing.give(dest, abandoned=True)  # the peer may still be writing into it
            raise
        self._give(state, link)
        got = reply.get("got")
        if isinstance(got, list) and len(got) == 2 and dest is not None:
            size, checksum = got
            return Offer(name=name, size=int(size), checksum=int(checksum), address=dest, landed=True)
        if dest is not None:
            landing.give(dest, abandoned=got == FAILED)  # a write that did not finish may still land
        if isinstance(got, str):
            return None  # missing, denied, busy, failed
        if not isinstance(got, list) or len(got) != 4:
            raise TierUnavailable(f"peer {peer}: a malformed answer to fetch")
        size, checksum, address, token = got
        return Offer(name=name, size=int(size), checksum=int(checksum), address=int(address), token=int(token))

    def read(self, peer: str, offer: Offer, offset: int, timeout: float) -> None:
        if offer.landed:
            self.agent.place(offer.address, offer.size, offset)
            return
        state = self._peers[peer]
        if state.agent is None:
            raise TierUnavailable(f"peer {peer}: no NIXL agent known")
        self.agent.read(state.agent, offset, offer.address, offer.size, timeout)

    def release(self, peer: str, offer: Offer) -> None:
        if offer.landed:
            self.agent.landing.give(offer.address)
            return
        state = self._peers[peer]
        with state.lock:
            link = state.idle.pop() if state.idle else None
        if link is None:
            return  # the lease ends with its deadline on the peer
        try:
            link.tell({"op": "release", "tokens": [offer.token]}, 1.0)
        except TierUnavailable:
            self._drop(state, link)
            return
        self._give(state, link)

    def holdings(self, peer: str, timeout: float) -> list[tuple[bytes, int]]:
        """What *peer* holds that this node may read: ``(hash, medium)`` pairs."""
        reply = self._ask(peer, {"op": "holdings"}, timeout)
        return [(bytes(h), int(m)) for h, m in reply.get("holdings") or ()]

    def close(self) -> None:
        for state in self._peers.values():
            with state.lock:
                links, state.idle = state.idle, []
            for link in links:
                link.close()
