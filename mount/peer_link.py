"""The asking side of the peer tier: descriptors over the peer channel, bytes over NIXL.

:class:`NixlPeers` is the :class:`~kvfs.peers.PeerSource` the daemon gives its store.
Per peer it keeps a few TCP connections to the peer's channel (``kvfs.mount.peer_server``;
at most ``_MAX_LINKS`` at once, each used by one read at a time) and the peer's NIXL
agent loaded from its ``hello``; a peer that restarted (a new agent) is loaded again.
Every call is bounded by the timeout it is given: a connection that does not answer in
time is closed, never reused.
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
from .peer_wire import PeerProtocolError, recv_frame, send_frame

__all__ = ["NixlPeers"]

log = logging.getLogger("kvfs.peers")

_MAX_LINKS = 4  # connections per peer


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
            while not state.idle and state.open >= _MAX_LINKS:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TierUnavailable(f"peer {state.peer.name}: every connection is busy")
                state.freed.wait(left)
            if state.idle:
                return state.idle.pop()
            state.open += 1
        try:
            link = _Link(state.peer, max(deadline - time.monotonic(), 0.001))
            reply = link.ask({"op": "hello", "node": self.config.node}, deadline - time.monotonic())
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

    def offer(self, peer: str, name: str, timeout: float) -> Offer | None:
        reply = self._ask(peer, {"op": "offer", "names": [name]}, timeout)
        offers = reply.get("offers")
        if not isinstance(offers, list) or len(offers) != 1:
            raise TierUnavailable(f"peer {peer}: a malformed offer")
        got = offers[0]
        if not isinstance(got, list):
            return None  # missing, denied or busy
        size, checksum, address, token = got
        return Offer(name=name, size=int(size), checksum=int(checksum), address=int(address), token=int(token))

    def read(self, peer: str, offer: Offer, offset: int, timeout: float) -> None:
        state = self._peers[peer]
        if state.agent is None:
            raise TierUnavailable(f"peer {peer}: no NIXL agent known")
        self.agent.read(state.agent, offset, offer.address, offer.size, timeout)

    def release(self, peer: str, offer: Offer) -> None:
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
