"""A real store (DRAM + disk tiers in temporary directories) behind a real control server.

The server runs ``kvfs.mount.control.serve`` under ``trio.run`` in a background thread,
exactly as the daemon runs it in its nursery, minus FUSE: the ``kvfs`` tools (and batch
clients) are driven against its socket with ``--socket`` / ``$KVFS_CONTROL_SOCKET``.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from typing import Self

import trio

from kvfs.config import Config, DiskConfig, DramConfig, PolicyConfig
from kvfs.mount.assembly import open_store
from kvfs.mount.control import Server, serve

__all__ = ["ControlServer", "make_store"]


def make_store(root: Path, *, dram: int = 64 << 10, disk: int = 16 << 20):
    """DRAM (no mlock, no prefault: tests share small machines) over a disk tier in *root*."""
    config = Config(
        tiers=(
            DramConfig(name="dram", capacity=dram, mlock=False, prefault=False),
            DiskConfig(name="disk", capacity=disk, path=root / "disk"),
        ),
        policy=PolicyConfig(eviction="lru"),
    )
    return open_store(config)


class ControlServer:
    """``serve(ControlHandler(store, mountpoint), socket)`` in a thread; use as a context
    manager. The socket lives in a short temporary directory (Unix socket paths are
    limited to 107 bytes; pytest's tmp_path can be longer)."""

    def __init__(
        self, store, mountpoint: str = "/mnt/kvfs", opstats=None, socket: Path | None = None, client=None
    ) -> None:
        self.store = store
        kwargs = {} if client is None else {"client": client}
        self.server = Server(store, mountpoint, opstats=opstats, **kwargs)
        self.handler = self.server.control
        self._dir = tempfile.mkdtemp(prefix="kvfs-ctl-")
        self.socket = Path(socket) if socket is not None else Path(self._dir) / "control.sock"
        self._token = None
        self._cancel = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        ready = threading.Event()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                await nursery.start(serve, self.server, self.socket)
                ready.set()

        def thread() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # surfaced by __exit__
                self._error = exc
                ready.set()

        self._thread = threading.Thread(target=thread, name="control-server", daemon=True)
        self._thread.start()
        if not ready.wait(10) or self._error is not None:
            raise RuntimeError(f"control server did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        """Stop serving (the socket is removed); idempotent."""
        if self._thread is None or not self._thread.is_alive():
            return
        trio.from_thread.run_sync(self._cancel.cancel, trio_token=self._token)
        self._thread.join(10)

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
        if self._error is not None:
            raise self._error
