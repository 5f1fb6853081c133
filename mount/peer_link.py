"""The asking side of the peer tier: descriptors over the peer channel, bytes over NIXL.

:class:`NixlPeers` is the :class:`~kvfs.peers.PeerSource` the daemon gives its store.
Per peer it keeps a few TCP connections to the peer's channel (``kvfs.mount.peer_server``;
at most ``MAX_LINKS`` at once, each used by one read at a time). Each connection starts
with a ``hello`` carrying this node's NIXL metadata for that peer: the connection and the
landing buffers set aside for it (:class:`~kvfs.mount.nixl_agent.Landing`), nothing else.
This node never loads a peer's agent: it never moves bytes from or to a peer's memory;
peers write into its landing buffers.

A ``fetch`` names free landing buffers of that peer's set (one, or as many as the last
block from it needed when they are free): the peer writes the block's first bytes there
and answers its size and checksum, one round trip for a block that fits.
:meth:`NixlPeers.read` copies them into the arena extent reserved for the block and asks
for the rest, if any, with ``more``: into every buffer it holds again, and into as many
more as are free and needed (a reply per round). The block is checked in the arena
(``kvfs.peers``). When every buffer of the peer's set is busy, a fetch waits for one
until its deadline, then gives up (:class:`~kvfs.errors.LandingBusy`). Every call is
bounded by the timeout it is given: a connection that does not answer in time is closed,
never reused, and the buffers it named rest a while before they are used again.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kvfs.config import ClusterConfig, PeerConfig
from kvfs.errors import LandingBusy, TierUnavailable
from kvfs.peers import Incoming, PeerSource
from kvfs.units import format_size

from .nixl_agent import Landing, NixlAgent
from .peer_wire import FAILED, MAX_DESTS, PeerProtocolError, recv_frame, send_frame

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
            reply = recv_frame(self.sock, within=max(timeout, 0.001))
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
    def __init__(self, peer: PeerConfig, landing: Landing) -> None:
        self.peer = peer
        self.landing = landing
        self.idle: list[_Link] = []
        self.open = 0
        self.hint = 1  # landing buffers the last block from this peer needed
        self.lock = threading.Lock()
        self.freed = threading.Condition(self.lock)


@dataclass(kw_only=True, slots=True)
class _Fetch(Incoming):
    """A block on its way from a peer: the link it holds while the peer holds the block
    for it, the landing buffers it holds, the bytes written (``done``) and those of them
    in the buffers now (from ``start``), ``spoiled`` when a write into them may still land."""

    link: _Link | None = None
    buffers: list[int] = field(default_factory=list)
    start: int = 0
    done: int = 0
    spoiled: bool = False


class NixlPeers(PeerSource):
    """Reads from the peers of *config* through *agent* (this node's NIXL agent)."""

    def __init__(self, config: ClusterConfig, agent: NixlAgent) -> None:
        self.config = config
        self.agent = agent
        self._peers = {p.name: _PeerState(p, agent.landings[p.name]) for p in config.peers}

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
            hello = {
                "op": "hello",
                "node": self.config.node,
                "agent": self.agent.name,
                "metadata": self.agent.metadata_for(state.peer.name),
            }
            link.ask(hello, deadline - time.monotonic())
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

    # -- moving a block ------------------------------------------------------------------

    def _round(self, state: _PeerState, inc: _Fetch, msg: dict[str, Any], deadline: float) -> Any:
        """Send *msg* naming the buffers *inc* holds; the peer's ``got`` (a reason string,
        or ``[size, checksum, done]`` checked against what came before)."""
        assert inc.link is not None
        room = state.landing.size
        dests = inc.buffers[: max(1, -(-(inc.size - inc.done) // room))] if inc.size else inc.buffers
        try:
            reply = inc.link.ask({**msg, "dests": dests, "room": room}, deadline - time.monotonic())
        except BaseException:
            self._drop(state, inc.link)
            inc.link, inc.spoiled = None, True  # the peer may still be writing into them
            raise
        got = reply.get("got")
        if isinstance(got, str):
            inc.spoiled = got == FAILED  # a write that did not finish may still land
            self._give(state, inc.link)  # the peer holds nothing for us any more
            inc.link = None
            return got
        if (
            not isinstance(got, list)
            or len(got) != 3
            or not all(isinstance(x, int) for x in got)
            or not inc.done <= got[2] <= got[0]
            or got[2] - inc.done > len(dests) * room
            or (msg["op"] == "more" and got[2] == inc.done)
            or (msg["op"] == "more" and (got[0], got[1]) != (inc.size, inc.checksum))
        ):
            self._drop(state, inc.link)
            inc.link, inc.spoiled = None, True
            raise TierUnavailable(f"peer {state.peer.name}: a malformed answer to {msg['op']}")
        inc.size, inc.checksum, inc.start, inc.done = got[0], got[1], inc.done, got[2]
        if inc.done == inc.size:
            self._give(state, inc.link)
            inc.link = None
        return got

    def _place(self, state: _PeerState, inc: _Fetch, offset: int) -> None:
        """Copy the bytes in the buffers (``start`` to ``done``) into the arena at *offset*."""
        room = state.landing.size
        for i, address in enumerate(inc.buffers):
            at = inc.start + i * room
            if at >= inc.done:
                break
            self.agent.place(state.landing, address, min(room, inc.done - at), offset + at)
        inc.start = inc.done

    # -- PeerSource ----------------------------------------------------------------------

    def fetch(self, peer: str, name: str, timeout: float) -> Incoming | None:
        state = self._peers[peer]
        landing = state.landing
        first = landing.take(time.monotonic() + timeout)
        if first is None:
            raise LandingBusy(
                f"every landing buffer for peer {peer} ({landing.count} of {format_size(landing.size)}) "
                f"stayed in use for {timeout:g}s"
            )
        inc = _Fetch(name=name, size=0, checksum=0, buffers=[first, *landing.take_free(state.hint - 1)])
        deadline = time.monotonic() + timeout  # the peer's part has its whole deadline
        try:
            inc.link = self._take(state, deadline)
            got = self._round(state, inc, {"op": "fetch", "name": name}, deadline)
        except BaseException:
            self.release(peer, inc)
            raise
        if isinstance(got, str):  # missing, denied, failed
            self.release(peer, inc)
            return None
        state.hint = min(max(1, -(-inc.size // landing.size)), landing.count, MAX_DESTS)
        return inc

    def read(self, peer: str, incoming: Incoming, offset: int, timeout: float) -> None:
        assert isinstance(incoming, _Fetch)
        inc, state = incoming, self._peers[peer]
        deadline = time.monotonic() + timeout
        self._place(state, inc, offset)
        while inc.done < inc.size:
            if time.monotonic() >= deadline:
                raise TierUnavailable(f"peer {peer}: {inc.done} of {inc.size} bytes of {inc.name} in {timeout:g}s")
            need = min(-(-(inc.size - inc.done) // state.landing.size), MAX_DESTS)
            if len(inc.buffers) < need:
                inc.buffers += state.landing.take_free(need - len(inc.buffers))
            got = self._round(state, inc, {"op": "more"}, deadline)
            if isinstance(got, str):
                raise TierUnavailable(f"peer {peer}: {got} after {inc.done} of {inc.size} bytes of {inc.name}")
            self._place(state, inc, offset)

    def release(self, peer: str, incoming: Incoming) -> None:
        assert isinstance(incoming, _Fetch)
        inc, state = incoming, self._peers[peer]
        if inc.link is not None:  # the peer still holds the block for us
            try:
                inc.link.tell({"op": "release"}, 1.0)
            except TierUnavailable:
                self._drop(state, inc.link)
            else:
                self._give(state, inc.link)
            inc.link = None
        for address in inc.buffers:
            state.landing.give(address, abandoned=inc.spoiled)
        inc.buffers = []

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
