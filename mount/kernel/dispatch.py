"""From a request's bytes to a handler call and back: one method per opcode.

Each method takes the request's node id, its :class:`~kvfs.mount.context.RequestContext`
and the bytes after the header, calls the filesystem's handler with pyfuse3's arguments
(so one operations class serves both transports), and returns the reply's payload:
``bytes`` or a list of buffers, ``b""`` for a bare success, or :data:`NO_REPLY` for the
requests the kernel expects no answer to (FORGET, BATCH_FORGET). Errors are raised (a
``FUSEError`` with ``errno``, or an ``OSError``); :mod:`.session` turns them into the
reply's negative errno. An opcode without a method here, or whose handler the operations
lack, is answered ``ENOSYS`` (the kernel then stops sending most of them).
"""

from __future__ import annotations

import errno
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..context import RequestContext
from . import abi
from .encode import DirBuffer, SetattrFields, SetattrValues, attr_out, entry_out, open_out, statfs_out

__all__ = ["NO_REPLY", "Dispatcher", "KernelError"]

NO_REPLY = None
Payload = bytes | list[Any] | None
Method = Callable[[int, RequestContext, memoryview], Awaitable[Payload]]


class KernelError(Exception):
    """A request to answer with ``errno`` (raised where no handler was called)."""

    def __init__(self, code: int) -> None:
        super().__init__(errno.errorcode.get(code, str(code)))
        self.errno = code


def _name(body: memoryview, start: int = 0) -> tuple[bytes, int]:
    """The NUL-terminated name at *start* of *body*, and where the next one starts."""
    raw = bytes(body[start:])
    end = raw.index(b"\0")
    return raw[:end], start + end + 1


def _now_ns() -> int:
    return time.time_ns()


class Dispatcher:
    """The opcode table over *ops* (an object with pyfuse3's handler methods)."""

    def __init__(self, ops: Any) -> None:
        self.ops = ops
        self.table: dict[int, Method] = {}
        for op in abi.Op:
            method = getattr(self, f"_{op.name.lower()}", None)
            if method is not None:
                self.table[op] = method

    def _handler(self, name: str) -> Callable[..., Awaitable[Any]]:
        fn = getattr(self.ops, name, None)
        if fn is None:
            raise KernelError(errno.ENOSYS)
        return fn  # type: ignore[no-any-return]

    # -- names and attributes -------------------------------------------------------

    async def _lookup(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        name, _ = _name(body)
        return entry_out(await self._handler("lookup")(node, name, ctx))

    async def _forget(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        (n,) = abi.FORGET_IN.unpack_from(body)
        await self._handler("forget")([(node, n)])
        return NO_REPLY

    async def _batch_forget(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        count, _ = abi.BATCH_FORGET_IN.unpack_from(body)
        off = abi.BATCH_FORGET_IN.size
        items = [abi.FORGET_ONE.unpack_from(body, off + i * abi.FORGET_ONE.size) for i in range(count)]
        await self._handler("forget")(items)
        return NO_REPLY

    async def _getattr(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        return attr_out(await self._handler("getattr")(node, ctx))

    async def _setattr(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        (valid, _, fh, size, _, atime, mtime, ctime, atimens, mtimens, ctimens, mode, _, uid, gid, _) = (
            abi.SETATTR_IN.unpack_from(body)
        )
        v = abi.Setattr(valid)
        fields = SetattrFields(
            update_atime=bool(v & (abi.Setattr.ATIME | abi.Setattr.ATIME_NOW)),
            update_mtime=bool(v & (abi.Setattr.MTIME | abi.Setattr.MTIME_NOW)),
            update_ctime=bool(v & abi.Setattr.CTIME),
            update_mode=bool(v & abi.Setattr.MODE),
            update_uid=bool(v & abi.Setattr.UID),
            update_gid=bool(v & abi.Setattr.GID),
            update_size=bool(v & abi.Setattr.SIZE),
        )
        now = _now_ns()
        attr = SetattrValues(
            st_mode=mode,
            st_uid=uid,
            st_gid=gid,
            st_size=size,
            st_atime_ns=now if v & abi.Setattr.ATIME_NOW else atime * 1_000_000_000 + atimens,
            st_mtime_ns=now if v & abi.Setattr.MTIME_NOW else mtime * 1_000_000_000 + mtimens,
            st_ctime_ns=ctime * 1_000_000_000 + ctimens,
        )
        handle = fh if v & abi.Setattr.FH else None
        return attr_out(await self._handler("setattr")(node, attr, fields, handle, ctx))

    async def _readlink(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        return bytes(await self._handler("readlink")(node, ctx))

    async def _symlink(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        name, nxt = _name(body)
        target, _ = _name(body, nxt)
        return entry_out(await self._handler("symlink")(node, name, target, ctx))

    async def _mknod(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        mode, rdev, umask, _ = abi.MKNOD_IN.unpack_from(body)
        name, _ = _name(body, abi.MKNOD_IN.size)
        ctx.umask = umask
        return entry_out(await self._handler("mknod")(node, name, mode, rdev, ctx))

    async def _mkdir(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        mode, umask = abi.MKDIR_IN.unpack_from(body)
        name, _ = _name(body, abi.MKDIR_IN.size)
        ctx.umask = umask
        return entry_out(await self._handler("mkdir")(node, name, mode, ctx))

    async def _unlink(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        name, _ = _name(body)
        await self._handler("unlink")(node, name, ctx)
        return b""

    async def _rmdir(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        name, _ = _name(body)
        await self._handler("rmdir")(node, name, ctx)
        return b""

    async def _rename(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        (newdir,) = abi.RENAME_IN.unpack_from(body)
        return await self._rename_names(node, newdir, 0, ctx, body, abi.RENAME_IN.size)

    async def _rename2(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        newdir, flags, _ = abi.RENAME2_IN.unpack_from(body)
        return await self._rename_names(node, newdir, flags, ctx, body, abi.RENAME2_IN.size)

    async def _rename_names(
        self, node: int, newdir: int, flags: int, ctx: RequestContext, body: memoryview, start: int
    ) -> Payload:
        old, nxt = _name(body, start)
        new, _ = _name(body, nxt)
        await self._handler("rename")(node, old, newdir, new, flags, ctx)
        return b""

    async def _link(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        (old,) = abi.RENAME_IN.unpack_from(body)  # fuse_link_in: oldnodeid
        name, _ = _name(body, abi.RENAME_IN.size)
        return entry_out(await self._handler("link")(old, node, name, ctx))

    # -- files ----------------------------------------------------------------------

    async def _open(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        flags, _ = abi.OPEN_IN.unpack_from(body)
        return open_out(await self._handler("open")(node, flags, ctx))

    async def _create(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        flags, mode, umask, _ = abi.CREATE_IN.unpack_from(body)
        name, _ = _name(body, abi.CREATE_IN.size)
        ctx.umask = umask
        info, attr = await self._handler("create")(node, name, mode, flags, ctx)
        return [entry_out(attr), open_out(info)]

    async def _read(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        fh, off, size, _, _, _, _ = abi.READ_IN.unpack_from(body)
        data = await self._handler("read")(fh, off, size)
        return [data] if len(data) <= size else [memoryview(data)[:size]]

    async def _write(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        fh, off, size, _, _, _, _ = abi.WRITE_IN.unpack_from(body)
        start = abi.WRITE_IN.size
        data = bytes(body[start : start + size])  # the worker's buffer is reused: the handler keeps a copy
        n = await self._handler("write")(fh, off, data)
        return abi.WRITE_OUT.pack(n, 0)

    async def _flush(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        (fh, _, _, _) = abi.FLUSH_IN.unpack_from(body)
        # the closing task: a writer killed by a signal publishes nothing (mount/dying.py)
        await self._handler("flush")(fh, ctx.pid or None)
        return b""

    async def _release(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        (fh, _, _, _) = abi.RELEASE_IN.unpack_from(body)
        await self._handler("release")(fh)
        return b""

    async def _fsync(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        fh, flags, _ = abi.FSYNC_IN.unpack_from(body)
        await self._handler("fsync")(fh, bool(flags & 1))
        return b""

    async def _statfs(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        return statfs_out(await self._handler("statfs")(ctx))

    async def _access(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        mask, _ = abi.ACCESS_IN.unpack_from(body)
        if not await self._handler("access")(node, mask, ctx):
            raise KernelError(errno.EACCES)
        return b""

    # -- extended attributes --------------------------------------------------------

    async def _setxattr(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        size, _ = abi.SETXATTR_IN.unpack_from(body)
        name, nxt = _name(body, abi.SETXATTR_IN.size)
        value = bytes(body[nxt : nxt + size])
        await self._handler("setxattr")(node, name, value, ctx)
        return b""

    async def _getxattr(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        size, _ = abi.GETXATTR_IN.unpack_from(body)
        name, _ = _name(body, abi.GETXATTR_IN.size)
        return _sized(bytes(await self._handler("getxattr")(node, name, ctx)), size)

    async def _listxattr(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        size, _ = abi.GETXATTR_IN.unpack_from(body)
        names = await self._handler("listxattr")(node, ctx)
        return _sized(b"".join(bytes(n) + b"\0" for n in names), size)

    async def _removexattr(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        name, _ = _name(body)
        await self._handler("removexattr")(node, name, ctx)
        return b""

    # -- directories ----------------------------------------------------------------

    async def _opendir(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        fh = await self._handler("opendir")(node, ctx)
        return abi.OPEN_OUT.pack(fh, 0, 0)

    async def _readdirplus(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        fh, off, size, _, _, _, _ = abi.READ_IN.unpack_from(body)
        token = DirBuffer(size)
        await self._handler("readdir")(fh, off, token)
        return [token.payload()]

    async def _releasedir(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        (fh, _, _, _) = abi.RELEASE_IN.unpack_from(body)
        await self._handler("releasedir")(fh)
        return b""

    async def _fsyncdir(self, node: int, ctx: RequestContext, body: memoryview) -> Payload:
        fh, flags, _ = abi.FSYNC_IN.unpack_from(body)
        await self._handler("fsyncdir")(fh, bool(flags & 1))
        return b""


def _sized(value: bytes, size: int) -> bytes:
    """A GETXATTR/LISTXATTR reply: the length when the caller asks for it (size 0), the
    value when it fits, ERANGE when it does not."""
    if size == 0:
        return abi.GETXATTR_OUT.pack(len(value), 0)
    if len(value) > size:
        raise KernelError(errno.ERANGE)
    return value
