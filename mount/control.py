"""The daemon's control socket: JSON lines over a Unix socket, owner-only.

A request is one JSON object per line, ``{"op": NAME, "args": {...}}``; the reply is one
line, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": MESSAGE, "type":
ERROR CLASS}``. Streaming ops (``events``) reply with one line per item until the client
hangs up. Store calls run in worker threads, never on the FUSE loop.

Ops are methods ``op_<name>`` of :class:`ControlHandler`; adding an op is adding a method.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import trio

from kvfs.errors import KvfsError
from kvfs.store import Store

__all__ = ["ControlHandler", "serve"]

log = logging.getLogger("kvfs.mount.control")


class ControlHandler:
    """Maps control ops onto the store. *mountpoint* is reported by ``ping``."""

    def __init__(self, store: Store, mountpoint: str) -> None:
        self.store = store
        self.mountpoint = mountpoint

    async def op_ping(self) -> dict:
        return {"mountpoint": self.mountpoint, "pid": os.getpid()}

    async def op_shutdown(self) -> dict:
        """Flush every block that is only in DRAM down and unmount. Replies at once; the
        daemon exits when both are done (``kvfs umount`` waits for that)."""
        request = getattr(self, "request_shutdown", None)  # set by the daemon that serves
        if request is None:
            raise KvfsError("this control server cannot shut its daemon down")
        request()
        return {"pid": os.getpid()}

    async def op_stat(self, name: str) -> dict:
        st = await trio.to_thread.run_sync(self.store.stat, name)
        return st.to_json()

    async def op_statistics(self) -> dict:
        return (await trio.to_thread.run_sync(self.store.statistics)).to_json()

    async def handle(self, request: dict, stream: trio.SocketStream) -> dict | None:
        op = request.get("op")
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if fn is None:
            return {"ok": False, "error": f"unknown op {op!r}", "type": "UnknownOp"}
        args = request.get("args") or {}
        try:
            if getattr(fn, "streaming", False):
                await fn(stream, **args)
                return None
            return {"ok": True, "result": await fn(**args)}
        except KvfsError as exc:
            return {"ok": False, "error": str(exc), "type": type(exc).__name__}
        except TypeError as exc:
            return {"ok": False, "error": f"bad arguments for {op}: {exc}", "type": "BadRequest"}


async def _serve_client(handler: ControlHandler, stream: trio.SocketStream) -> None:
    buf = b""
    async with stream:
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    request = json.loads(line)
                except ValueError:
                    reply = {"ok": False, "error": "request is not JSON", "type": "BadRequest"}
                else:
                    reply = await handler.handle(request, stream)
                if reply is not None:
                    try:
                        await stream.send_all(json.dumps(reply).encode() + b"\n")
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return


async def serve(handler: ControlHandler, path: Path, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen on *path* (replacing a stale socket) until cancelled; removes it on exit."""
    path = Path(path)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    old_umask = os.umask(0o077)
    try:
        await sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(64)
    listener = trio.SocketListener(sock)
    try:
        async with trio.open_nursery() as nursery:
            task_status.started()
            await trio.serve_listeners(lambda s: _serve_client(handler, s), [listener], handler_nursery=nursery)
    finally:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
