"""The peer channel's messages: typed, versioned, msgpack frames over TCP (docs/cluster.md).

Only descriptors cross it (names, sizes, checksums, landing buffer addresses, the
asker's NIXL metadata); the bytes move over NIXL, always written by the serving node
into landing buffers of the asker. A frame is a 4-byte big-endian length and a msgpack
map ``{"v": VERSION, "op": ..., fields...}``; a reply carries ``"error"`` instead when
the request failed as a whole. Every frame is at most ``MAX_FRAME`` bytes (a holdings
answer is the large one), a request at most ``MAX_REQUEST``.

Requests and their replies:

- ``hello`` (``node``, and the asker's NIXL ``agent`` and ``metadata``: its connection
  and the landing buffers it set aside for this node, nothing else): the serving node's
  ``node`` name. The serving node sends nothing of its own NIXL agent: the asker never
  moves bytes to or from it;
- ``fetch`` (``name``, ``dests``: addresses of at most ``MAX_DESTS`` landing buffers of
  ``room`` bytes each): the serving node writes the block's first bytes into them, in
  order, and answers ``got``: ``[size, checksum, done]`` (``done`` bytes are there);
  when ``done < size`` it holds the block for this connection (one at a time) until
  ``more`` has sent the rest, ``release``, another ``fetch`` or the connection's end. Or
  a reason string: ``missing`` (not here), ``denied`` (the asker may not read it),
  ``failed`` (the write did not finish: those buffers may still be written);
- ``more`` (``dests``, ``room``): the next bytes of the held block into those buffers:
  ``got`` as for ``fetch``, ``done`` counting every byte sent so far; ``missing`` when no
  block is held;
- ``release``: the asker is done with the held block; no reply;
- ``holdings``: the hashes of the blocks this node holds that the asker may read, with
  their medium (0 DRAM, 1 disk), at most ``MAX_HOLDINGS``.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from kvfs.errors import KvfsError, TierUnavailable

__all__ = [
    "BUSY",
    "DENIED",
    "FAILED",
    "MAX_DESTS",
    "MAX_FRAME",
    "MAX_HOLDINGS",
    "MAX_REQUEST",
    "MISSING",
    "VERSION",
    "PeerProtocolError",
    "recv_frame",
    "send_frame",
]

VERSION = 3
MAX_FRAME = 64 << 20
MAX_REQUEST = 1 << 20
MAX_HOLDINGS = 1_000_000
MAX_DESTS = 64
MISSING, DENIED, BUSY, FAILED = "missing", "denied", "busy", "failed"
_LEN = struct.Struct(">I")


class PeerProtocolError(KvfsError):
    """A peer sent a frame that is not a message of this version (or too large)."""


def _packer() -> Any:
    import msgpack

    return msgpack


def send_frame(sock: socket.socket, msg: dict[str, Any]) -> None:
    """Send *msg* (a map) as one frame; :class:`TierUnavailable` when the socket fails."""
    body = _packer().packb({"v": VERSION, **msg}, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise PeerProtocolError(f"a peer message of {len(body)} bytes is over the limit of {MAX_FRAME}")
    try:
        sock.sendall(_LEN.pack(len(body)) + body)
    except OSError as exc:
        raise TierUnavailable(f"peer channel: send failed: {exc}") from exc


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(buf)} of {n} bytes of a frame came in time")
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket, *, limit: int = MAX_FRAME, within: float | None = None) -> dict[str, Any] | None:
    """The next message, or None when the other end closed. The wait for it is the
    socket's timeout; once its first byte has come, the rest must come within *within*
    seconds (None: the socket's timeout per receive), and a frame over *limit* bytes is
    refused. :class:`TierUnavailable` on a socket error or timeout,
    :class:`PeerProtocolError` on a bad frame."""
    idle = sock.gettimeout()
    try:
        first = _recv_exact(sock, 1)
        if first is None:
            return None
        deadline = None if within is None else time.monotonic() + within
        rest = _recv_exact(sock, _LEN.size - 1, deadline)
        if rest is None:
            return None
        (n,) = _LEN.unpack(first + rest)
        if n > limit:
            raise PeerProtocolError(f"a peer frame of {n} bytes is over the limit of {limit}")
        body = _recv_exact(sock, n, deadline)
    except OSError as exc:  # socket.timeout included
        raise TierUnavailable(f"peer channel: {exc or 'timed out'}") from exc
    finally:
        sock.settimeout(idle)
    if body is None:
        return None
    try:
        msg = _packer().unpackb(body, raw=False)
    except Exception as exc:  # msgpack raises several unrelated classes
        raise PeerProtocolError(f"a peer frame is not msgpack: {exc}") from exc
    if not isinstance(msg, dict) or msg.get("v") != VERSION:
        raise PeerProtocolError(f"a peer message of another version ({msg.get('v') if isinstance(msg, dict) else '?'})")
    return msg
