"""A FUSE session of kvfs's own: mount, INIT, the request loop on trio, notifications.

:class:`Session` serves an operations object (pyfuse3's handler signatures, e.g.
:class:`kvfs.mount.fs.KvfsOperations`) straight on the kernel's protocol (:mod:`.abi`),
without libfuse, so the mount gets what libfuse 3.14 and pyfuse3 do not expose:
passthrough to backing files (``FUSE_PASSTHROUGH``, ``FUSE_DEV_IOC_BACKING_OPEN``),
``FOPEN_NOFLUSH``, ``max_pages`` (1 MiB requests), and a request context (pid, uid, gid)
for every handler (:mod:`kvfs.mount.context`).

Life of a request: a worker task reads one request from the non-blocking ``/dev/fuse``
descriptor into a buffer of its own (``max_write`` plus headers), waiting on trio for
readability when none is queued; only one worker reads at a time, the others wait their
turn, and when none is left waiting another is started (up to ``max_workers``), so a
handler that waits on a tier never holds up the next request. The worker decodes the
request (:mod:`.dispatch`), runs the handler in its own task, and writes the reply. A
steady stream of requests that never blocks yields to other tasks every few requests.
The loop ends when the kernel ends the connection (unmounted: ``ENODEV``).

Notifications (``invalidate_entry``, ``invalidate_inode``) are written from any thread:
the kernel may make them wait for a request in flight, so never call them in a handler.
"""

from __future__ import annotations

import errno
import logging
import os
import select
from dataclasses import dataclass
from typing import Any

import trio

from ..context import RequestContext, reset_current, set_current
from . import abi, device
from .dispatch import NO_REPLY, Dispatcher

__all__ = ["Session", "SessionOptions"]

log = logging.getLogger("kvfs.mount.kernel")

_INIT_WAIT = 30.0  # seconds to wait for the kernel's INIT after mount(2)
_STREAK = 16  # requests read without waiting before the worker lets other tasks run


@dataclass(frozen=True, kw_only=True)
class SessionOptions:
    """What the session asks of the kernel. ``max_pages``: pages per request (1 MiB with
    256, the kernel's default ``max_pages_limit``); ``passthrough``: ask for
    ``FUSE_PASSTHROUGH`` (granted only with ``CAP_SYS_ADMIN`` and a kernel >= 6.9);
    ``writeback_cache``: let the kernel cache writes (kvfs does not, see
    docs/mount-internals.md); ``max_background``: async requests (read-ahead, release) the
    kernel keeps in flight; ``min_workers``/``max_workers``: request tasks."""

    max_pages: int = 256
    passthrough: bool = True
    writeback_cache: bool = False
    max_background: int = 64
    min_workers: int = 4
    max_workers: int = 64


def _max_pages_limit() -> int:
    try:
        with open("/proc/sys/fs/fuse/max_pages_limit") as f:
            return max(1, int(f.read()))
    except (OSError, ValueError):
        return 256  # the kernel's default (and its limit before the sysctl existed)


class Session:
    """One mount served on the kernel's protocol (see the module doc)."""

    def __init__(self, ops: Any, spec: device.MountSpec, options: SessionOptions = SessionOptions()) -> None:
        self.ops = ops
        self.spec = spec
        self.options = options
        self.dispatch = Dispatcher(ops)
        self.device: device.Device | None = None
        self.minor = 0
        self.max_write = 0
        self.passthrough = False
        """True once the kernel granted passthrough and a backing file could be registered."""
        self.writeback_cache = False
        self._bufsize = 0
        self._ended: trio.Event | None = None  # made in serve(): trio objects need a run
        self._nursery: trio.Nursery | None = None
        self._reading = False
        self._waiting = 0
        self._workers = 0
        self._streak = 0
        self._lot: trio.lowlevel.ParkingLot | None = None

    @property
    def fd(self) -> int:
        assert self.device is not None, "not mounted"
        return self.device.fd

    # -- mounting and INIT ----------------------------------------------------------

    def mount(self, mountpoint: str, *, helper: bool = False) -> None:
        """Mount at *mountpoint* and answer the kernel's INIT (before trio runs: nothing
        may touch the mount until INIT is answered). *helper*: mount through fusermount3
        even when this process may mount itself. Raises :class:`device.MountFailed`."""
        self.device = device.mount(mountpoint, self.spec, helper=helper)
        try:
            self._init()
        except BaseException:
            self.close(unmount=True)
            raise

    def _init(self) -> None:
        pages = max(1, min(self.options.max_pages, _max_pages_limit()))
        self._bufsize = pages * 4096 + 4096  # a WRITE's data plus its headers (80 bytes)
        buf = bytearray(self._bufsize)
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        if not poller.poll(_INIT_WAIT * 1000):
            raise device.MountFailed(errno.ETIMEDOUT, f"the kernel sent no FUSE INIT within {_INIT_WAIT:.0f}s")
        n = os.readv(self.fd, [buf])
        _, opcode, unique, _, _, _, _, _, _ = abi.IN_HEADER.unpack_from(buf)
        if opcode != abi.Op.INIT:
            raise device.MountFailed(errno.EPROTO, f"the kernel's first FUSE request was {opcode}, not INIT")
        major, minor, max_readahead, flags, flags2 = abi.INIT_IN.unpack_from(buf, abi.IN_HEADER.size)
        if n < abi.IN_HEADER.size + abi.INIT_IN.size:  # pragma: no cover - kernels older than 7.36
            flags2 = 0
        offered = abi.Init(flags | ((flags2 << 32) if flags & abi.Init.INIT_EXT else 0))
        if major != abi.KERNEL_MAJOR or minor < abi.MIN_MINOR:
            self._reply(unique, [], -errno.EPROTO)
            raise device.MountFailed(
                errno.EPROTO,
                f"the kernel speaks FUSE {major}.{minor}; kvfs's transport needs "
                f'{abi.KERNEL_MAJOR}.{abi.MIN_MINOR} or later (use [mount] transport = "pyfuse3")',
            )
        self.minor = min(minor, abi.KERNEL_MINOR)
        want = (
            abi.Init.ASYNC_READ
            | abi.Init.ATOMIC_O_TRUNC
            | abi.Init.BIG_WRITES
            | abi.Init.AUTO_INVAL_DATA
            | abi.Init.DO_READDIRPLUS
            | abi.Init.ASYNC_DIO
            | abi.Init.PARALLEL_DIROPS
            | abi.Init.ABORT_ERROR
            | abi.Init.MAX_PAGES
            | abi.Init.HANDLE_KILLPRIV_V2  # no suid bits here: spares a getxattr per write
            | abi.Init.INIT_EXT
        )
        if self.options.passthrough and self.minor >= 40 and device.can_mount_directly():
            want |= abi.Init.PASSTHROUGH
        if self.options.writeback_cache:
            want |= abi.Init.WRITEBACK_CACHE
        granted = want & offered
        self.max_write = pages * 4096
        self.writeback_cache = bool(granted & abi.Init.WRITEBACK_CACHE)
        bits = int(granted)
        out = abi.INIT_OUT.pack(
            abi.KERNEL_MAJOR,
            self.minor,
            max_readahead,
            bits & 0xFFFFFFFF,
            self.options.max_background,
            self.options.max_background * 3 // 4,
            self.max_write,
            1,  # time_gran: nanoseconds
            pages,
            0,
            bits >> 32,
            2 if granted & abi.Init.PASSTHROUGH else 0,  # max_stack_depth: backing files on overlayfs too
            0,
        )
        self._reply(unique, [out], 0)
        if granted & abi.Init.PASSTHROUGH:
            self.passthrough = self._probe_passthrough()
        log.info(
            "FUSE %d.%d on the kernel transport: %d KiB requests, passthrough %s, writeback cache %s",
            abi.KERNEL_MAJOR,
            self.minor,
            self.max_write >> 10,
            "on" if self.passthrough else "off",
            "on" if self.writeback_cache else "off",
        )

    def _probe_passthrough(self) -> bool:
        """Whether backing files can be registered (the kernel may refuse them: no
        CAP_SYS_ADMIN, or passthrough off for this connection)."""
        fd = os.memfd_create("kvfs-passthrough-probe", os.MFD_CLOEXEC)
        try:
            self.backing_close(self.backing_open(fd))
            return True
        except OSError as exc:
            log.info("passthrough is not available (%s); sealed blocks are served by the daemon", exc.strerror)
            return False
        finally:
            os.close(fd)

    # -- passthrough ----------------------------------------------------------------

    def backing_open(self, fd: int) -> int:
        """Register the open file *fd* as a passthrough backing file; its id."""
        assert self.device is not None
        return self.device.backing_open(fd)

    def backing_close(self, backing_id: int) -> None:
        if self.device is not None and self.device.fd >= 0:
            self.device.backing_close(backing_id)

    # -- the request loop -----------------------------------------------------------

    async def serve(self) -> None:
        """Serve requests until the kernel ends the connection (unmounted)."""
        self._ended = trio.Event()
        self._lot = trio.lowlevel.ParkingLot()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for _ in range(self.options.min_workers):
                nursery.start_soon(self._worker)
            await self._ended.wait()
            nursery.cancel_scope.cancel()

    async def _worker(self) -> None:
        buf = bytearray(self._bufsize)
        view = memoryview(buf)
        self._workers += 1
        try:
            while True:
                n = await self._next_request(view)
                if not n:
                    return
                if not self._waiting and self._workers < self.options.max_workers:
                    assert self._nursery is not None
                    self._nursery.start_soon(self._worker)  # someone must read while this one handles
                await self._handle(view[:n])
        finally:
            self._workers -= 1

    async def _next_request(self, view: memoryview) -> int:
        """Take the reader's turn, read one request into *view*; its length (0: ended)."""
        assert self._lot is not None
        while self._reading:
            self._waiting += 1
            try:
                await self._lot.park()
            finally:
                self._waiting -= 1
        self._reading = True
        try:
            return await self._receive(view)
        finally:
            self._reading = False
            self._lot.unpark()

    async def _receive(self, view: memoryview) -> int:
        assert self._ended is not None
        while not self._ended.is_set():
            try:
                n = os.readv(self.fd, [view])
            except BlockingIOError:
                self._streak = 0
                await trio.lowlevel.wait_readable(self.fd)
                continue
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # interrupted before we read it
                    continue
                if exc.errno in (errno.ENODEV, errno.ECONNABORTED, errno.EBADF):
                    self._ended.set()
                    return 0
                raise
            self._streak += 1
            if self._streak >= _STREAK:
                self._streak = 0
                await trio.lowlevel.checkpoint()
            return n
        return 0

    async def _handle(self, req: memoryview) -> None:
        length, opcode, unique, node, uid, gid, pid, _, _ = abi.IN_HEADER.unpack_from(req)
        method = self.dispatch.table.get(opcode)
        if method is None:
            if opcode == abi.Op.DESTROY:
                self._reply(unique, [], 0)
                assert self._ended is not None
                self._ended.set()
                return
            self._reply(unique, [], -errno.ENOSYS)  # INTERRUPT too: the kernel stops sending them
            return
        ctx = RequestContext(uid, gid, pid)
        token = set_current(ctx)
        try:
            payload = await method(node, ctx, req[abi.IN_HEADER.size : length])
        except Exception as exc:  # every failure answers the request; a bug fails it, not the mount
            code = getattr(exc, "errno", None)
            if not isinstance(code, int) or code <= 0:
                log.exception("FUSE %s failed unexpectedly; answering EIO", _opname(opcode))
                code = errno.EIO
            self._reply(unique, [], -code)
            return
        finally:
            reset_current(token)
        if payload is NO_REPLY:
            return
        self._reply(unique, payload if isinstance(payload, list) else [payload], 0)

    def _reply(self, unique: int, parts: list[Any], error: int) -> None:
        total = abi.OUT_HEADER.size + sum(len(p) for p in parts)
        try:
            os.writev(self.fd, [abi.OUT_HEADER.pack(total, error, unique), *parts])
        except OSError as exc:
            if exc.errno == errno.ENOENT:  # the request was interrupted: nobody waits for it
                return
            if exc.errno in (errno.ENODEV, errno.ECONNABORTED, errno.EBADF):
                if self._ended is not None:
                    self._ended.set()
                return
            raise

    # -- notifications (from any thread) --------------------------------------------

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Make the kernel drop its dentry *name* in directory *parent* (OSError ENOENT
        when it has none)."""
        payload = abi.NOTIFY_INVAL_ENTRY.pack(parent, len(name), 0) + bytes(name) + b"\0"
        self._notify(abi.Notify.INVAL_ENTRY, payload)

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None:
        """Make the kernel drop *ino*'s attributes (and, unless *attr_only*, its pages)."""
        self._notify(abi.Notify.INVAL_INODE, abi.NOTIFY_INVAL_INODE.pack(ino, -1 if attr_only else 0, 0))

    def notify_store(self, ino: int, offset: int, data: bytes) -> None:
        """Put *data* in the kernel's page cache of *ino* at *offset* (pages it covers
        from their start, to their end or the file's, become readable without a READ)."""
        self._notify(abi.Notify.STORE, abi.NOTIFY_STORE.pack(ino, offset, len(data), 0) + bytes(data))

    def _notify(self, code: int, payload: bytes) -> None:
        os.writev(self.fd, [abi.OUT_HEADER.pack(abi.OUT_HEADER.size + len(payload), code, 0), payload])

    # -- ending ---------------------------------------------------------------------

    def close(self, *, unmount: bool) -> None:
        """Unmount (when asked: lazily, as libfuse does) and close the descriptor."""
        dev, self.device = self.device, None
        if dev is None:
            return
        try:
            if unmount:
                device.unmount(dev.mountpoint, direct=dev.direct)
        finally:
            dev.close()


def _opname(opcode: int) -> str:
    try:
        return abi.Op(opcode).name
    except ValueError:
        return str(opcode)
