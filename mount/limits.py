"""What the peers of the daemon's sockets may hold at once: connections and bytes in
flight, per user and in all, and the descriptors kept in reserve for the tiers.

- **Connections**: at most ``[client] max_connections`` in all and
  ``max_connections_per_user`` per uid (the daemon's own user and root included). A
  connection past either is answered with a :class:`~kvfs.errors.LimitReached` error frame
  and closed.
- **Bytes in flight**: the bytes of frames a connection has sent but the daemon has not yet
  answered (an unfinished frame included), plus the replies being sent, at most
  ``max_inflight`` in all and ``max_inflight_per_user`` per uid. A connection whose frame
  would take either past its limit gets a ``LimitReached`` error frame and is closed (its
  session's leases and reservations are given back); a reply is never refused, but counts
  until it is sent, so a peer that does not read its replies stops being read from.
- **Descriptors**: the daemon raises its soft ``RLIMIT_NOFILE`` to the hard limit at start
  (:func:`raise_nofile`) and caps connections so that they (two descriptors each: the
  socket, and a copy buffer's memfd) leave :data:`FD_RESERVE` descriptors to the tiers, FUSE
  and everything else; a tier that still meets ``EMFILE`` fails the one call
  (:class:`~kvfs.errors.DescriptorsExhausted`), never its health.
"""

from __future__ import annotations

import logging
import resource
import threading
from collections import Counter

from kvfs.config import ClientConfig
from kvfs.errors import LimitReached
from kvfs.units import format_size

__all__ = ["FD_RESERVE", "PeerLimits", "raise_nofile"]

log = logging.getLogger("kvfs.mount.limits")

FD_RESERVE = 256
"""Descriptors never given to connections: the tiers' files and sockets, FUSE, the arena,
logs, metrics, the event publisher."""

_FDS_PER_CONNECTION = 2  # its socket, and a copy buffer's memfd when it has one


def raise_nofile(want: int | None = None) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (or *want*, if lower); returns the
    soft limit in force after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if want is None else min(want, hard)
    if hard == resource.RLIM_INFINITY and want is None:
        target = 1 << 20
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target, exc)
    return soft


class PeerLimits:
    """Connections and bytes in flight per uid and in all (see the module doc). *nofile*:
    the daemon's descriptor limit, which caps connections below *config*'s when it is
    low. Thread-safe (charges come from the loop; the counts are read by tools)."""

    def __init__(self, config: ClientConfig = ClientConfig(), *, nofile: int | None = None) -> None:
        if nofile is None:
            nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        room = max(1, (nofile - FD_RESERVE) // _FDS_PER_CONNECTION)
        self.connections = min(config.max_connections, room)
        if self.connections < config.max_connections:
            log.warning(
                "at most %d connections (not [client] max_connections = %d): the descriptor limit is %d, "
                "and %d are kept for the tiers; raise the daemon's ulimit -n",
                self.connections,
                config.max_connections,
                nofile,
                FD_RESERVE,
            )
        self.per_user = min(config.max_connections_per_user, self.connections)
        self.inflight = config.max_inflight
        self.inflight_per_user = config.max_inflight_per_user
        self._lock = threading.Lock()
        self._conns: Counter[int] = Counter()
        self._bytes: Counter[int] = Counter()
        self.bytes = 0
        self.refused = 0
        """Connections and frames refused for a limit."""

    @property
    def open(self) -> int:
        return sum(self._conns.values())

    def admit(self, uid: int) -> None:
        """Count a new connection of *uid*, or raise :class:`LimitReached` (it is not counted)."""
        with self._lock:
            total = sum(self._conns.values())
            if total >= self.connections:
                why = (
                    f"the daemon has {total} connections open, its limit ([client] max_connections, "
                    f"{self.connections}, capped by the descriptor limit)"
                )
            elif self._conns[uid] >= self.per_user:
                why = (
                    f"uid {uid} has {self._conns[uid]} connections open, the limit per user "
                    f"([client] max_connections_per_user, {self.per_user})"
                )
            else:
                self._conns[uid] += 1
                return
            self.refused += 1
        raise LimitReached(f"{why}; close connections you do not use and connect again")

    def leave(self, uid: int) -> None:
        with self._lock:
            self._conns[uid] -= 1
            if self._conns[uid] <= 0:
                del self._conns[uid]

    def charge(self, uid: int, delta: int, *, refuse: bool) -> None:
        """Add *delta* bytes in flight for *uid* (negative: given back). With *refuse*, a
        charge that would pass a limit raises :class:`LimitReached` and is not made."""
        with self._lock:
            if refuse and delta > 0:
                mine = self._bytes[uid] + delta
                if self.bytes + delta > self.inflight:
                    why = (
                        f"the daemon would hold {format_size(self.bytes + delta)} of frames in flight, more than "
                        f"its limit ([client] max_inflight, {format_size(self.inflight)})"
                    )
                elif mine > self.inflight_per_user:
                    why = (
                        f"uid {uid} would have {format_size(mine)} of frames in flight, more than the limit per "
                        f"user ([client] max_inflight_per_user, {format_size(self.inflight_per_user)})"
                    )
                else:
                    why = ""
                if why:
                    self.refused += 1
                    raise LimitReached(f"{why}; send smaller batches, or fewer at once")
            self._bytes[uid] += delta
            self.bytes += delta
            if self._bytes[uid] <= 0:
                del self._bytes[uid]

    def held(self, uid: int) -> int:
        with self._lock:
            return self._bytes.get(uid, 0)
