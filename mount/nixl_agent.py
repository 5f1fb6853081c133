"""This node's NIXL agent: the DRAM arena registered for UCX, and reads from peers' arenas.

One agent per daemon (``kvfs.mount.cluster``), over NIXL's own bindings
(``nixl_cu12._bindings``) rather than its Python wrapper, whose progress thread polls
without pause (a busy core per idle daemon). Here the UCX progress thread waits on UCX's
event descriptors for up to ``_PROGRESS_WAIT_US`` between rounds: an idle daemon uses no
CPU, and a transfer wakes it at once. Over TCP the serving side's progress thread is
what answers reads, so it must run.

The arena is mapped a second time here (``DramTier.share``), so the tier's own mapping
is never exported; addresses handed to peers are this mapping's.

A process that created a UCX backend must leave with ``os._exit`` (:func:`leave`): the
library's static destructors crash the interpreter's normal exit.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys
import time
from typing import Any

from kvfs.errors import KvfsError, TierUnavailable
from kvfs.peers import PeerReadAbandoned

__all__ = ["NixlAgent", "NixlUnavailable", "leave", "loaded"]

log = logging.getLogger("kvfs.peers")

_PROGRESS_WAIT_US = 100_000
_POLL_SLEEP = 0.0002  # between status checks of a transfer in flight (the progress thread moves it)
_loaded = False


class NixlUnavailable(KvfsError):
    """NIXL (the ``nixl-cu12`` package) cannot be loaded or its UCX backend cannot start."""


def loaded() -> bool:
    """Whether this process started a UCX backend (and must leave with :func:`leave`)."""
    return _loaded


def leave(status: int) -> None:
    """End the process with *status*: ``os._exit`` once NIXL was loaded (after flushing
    the logs and standard streams), else an ordinary exit."""
    if not _loaded:
        sys.exit(status)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


class NixlAgent:
    """A NIXL agent named *name* with a UCX backend over *arena_fd*'s memory (*size*
    bytes, mapped here read-write). *ucx_tls* sets ``UCX_TLS`` first (``"tcp"``...)."""

    def __init__(self, name: str, arena_fd: int, size: int, *, ucx_tls: str | None = None) -> None:
        global _loaded
        if ucx_tls:
            os.environ["UCX_TLS"] = ucx_tls
        try:
            from nixl_cu12 import _bindings as nixl
        except ImportError as exc:
            raise NixlUnavailable(
                f"reading peers' DRAM needs NIXL ({exc.name} is missing): pip install 'kvfs[cluster]'"
            ) from None
        self._nixl: Any = nixl
        self.name = name
        self._map = mmap.mmap(arena_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._anchor = ctypes.c_char.from_buffer(self._map)
        self.base = ctypes.addressof(self._anchor)
        self.size = size
        cfg = nixl.nixlAgentConfig()
        cfg.useProgThread = True
        cfg.useListenThread = False
        cfg.pthrDelay = _PROGRESS_WAIT_US
        cfg.syncMode = nixl.NIXL_THREAD_SYNC_STRICT
        cfg.captureTelemetry = False
        try:
            self._agent = nixl.nixlAgent(name, cfg)
            self._ucx = self._agent.createBackend("UCX", {})
            _loaded = True
            self._reg = nixl.nixlRegDList(nixl.DRAM_SEG, [(self.base, size, 0, "")])
            self._agent.registerMem(self._reg, [self._ucx])
        except Exception as exc:
            raise NixlUnavailable(f"NIXL's UCX backend did not start: {exc}") from exc
        self.metadata: bytes = self._agent.getLocalMD()

    def connect(self, metadata: bytes) -> str:
        """Load a peer's metadata; returns its agent name. :class:`TierUnavailable` on failure."""
        try:
            remote = self._agent.loadRemoteMD(metadata)
        except Exception as exc:
            raise TierUnavailable(f"cannot load a peer's NIXL metadata: {exc}") from exc
        return remote.decode() if isinstance(remote, bytes) else str(remote)

    def forget(self, remote: str) -> None:
        try:
            self._agent.invalidateRemoteMD(remote)
        except Exception as exc:  # noqa: BLE001 - already gone: nothing to undo
            log.debug("forgetting NIXL agent %s: %s", remote, exc)

    def read(self, remote: str, offset: int, address: int, length: int, timeout: float) -> None:
        """Read *length* bytes at *address* of agent *remote* into this arena at *offset*,
        within *timeout* seconds: :class:`TierUnavailable` when it failed or timed out and
        was cancelled, :class:`PeerReadAbandoned` when it could not be cancelled."""
        if not 0 <= offset <= self.size - length:
            raise ValueError(f"extent {offset}+{length} is outside the arena of {self.size} bytes")
        if length == 0:
            return
        nixl = self._nixl
        local = nixl.nixlXferDList(nixl.DRAM_SEG, [(self.base + offset, length, 0)])
        far = nixl.nixlXferDList(nixl.DRAM_SEG, [(address, length, 0)])
        deadline = time.monotonic() + timeout
        try:
            req = self._agent.createXferReq(nixl.NIXL_READ, local, far, remote, "", [self._ucx])
        except Exception as exc:
            raise TierUnavailable(f"NIXL read from {remote} could not start: {exc}") from exc
        try:
            status = self._agent.postXferReq(req)
            while status == nixl.NIXL_IN_PROG and time.monotonic() < deadline:
                time.sleep(_POLL_SLEEP)
                status = self._agent.getXferStatus(req)
        except Exception as exc:  # noqa: BLE001 - NIXL's bindings raise a dozen unrelated Exception classes
            status = exc
        if status == nixl.NIXL_SUCCESS:
            self._release(req)
            return
        if not self._release(req):
            raise PeerReadAbandoned(
                f"NIXL read of {length} bytes from {remote} did not finish and could not be cancelled"
            )
        why = f"timed out after {timeout:g}s" if status == nixl.NIXL_IN_PROG else f"failed: {status}"
        raise TierUnavailable(f"NIXL read of {length} bytes from {remote} {why}")

    def _release(self, req: int) -> bool:
        try:
            self._agent.releaseXferReq(req)
        except Exception as exc:  # noqa: BLE001 - NIXL's bindings raise a dozen unrelated Exception classes
            log.warning("NIXL transfer could not be released: %s", exc)
            return False
        return True

    def close(self) -> None:
        """Deregister the arena; the agent itself lives until the process leaves."""
        try:
            self._agent.deregisterMem(self._reg, [self._ucx])
        except Exception as exc:  # noqa: BLE001 - NIXL's bindings raise a dozen unrelated Exception classes
            log.warning("NIXL deregistration: %s", exc)
