"""How FUSE requests reach the filesystem: pyfuse3, or kvfs's own session layer.

Both transports serve the same operations object (:class:`kvfs.mount.fs.KvfsOperations`,
pyfuse3's handler signatures) and offer the daemon the same small surface: :meth:`mount`
(before trio runs), :meth:`serve` (in trio, until unmounted), :meth:`close`, the kernel
cache invalidations :mod:`kvfs.mount.notify` sends, and — on the kernel transport only,
when the daemon may — passthrough backing files (``passthrough``, ``backing_open``,
``backing_close``). :func:`open_transport` chooses one from ``[mount] transport``.

- ``kernel`` (:mod:`kvfs.mount.kernel`): what pyfuse3 3.5 over libfuse 3.14 cannot do:
  sealed blocks read by the kernel from their backing files (passthrough, root only),
  ``FOPEN_NOFLUSH`` on read-only opens, 1 MiB requests, a request context for every
  handler; ``flush(fh, pid)`` gets the closing task's pid (pyfuse3 calls ``flush(fh)``:
  an operations object takes ``pid=None``).
- ``pyfuse3``: the binding; any kernel and any user with fusermount3.
- ``auto``: ``kernel`` where this process can mount it (as root, or with fusermount3),
  falling back to pyfuse3 when the kernel refuses its protocol.

:class:`FileReply` is the open reply the filesystem gives either transport: pyfuse3's
``FileInfo`` plus ``noflush`` and ``backing_id``, which only the kernel transport sends.
:func:`readdir_reply` adds a directory entry to either transport's readdir token.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Protocol, Self

import pyfuse3

from kvfs.config import Transport

from .context import RequestContext
from .kernel.device import MountFailed, MountSpec, can_mount_directly
from .kernel.encode import DirBuffer, SetattrFields, SetattrValues
from .kernel.session import Session, SessionOptions

__all__ = [
    "AttrFields",
    "AttrValues",
    "DirToken",
    "FileReply",
    "FuseTransport",
    "PyfuseTransport",
    "Requester",
    "open_transport",
    "readdir_reply",
]

log = logging.getLogger("kvfs.mount.transport")

# What a handler is given, from either transport (the kernel transport's types have
# pyfuse3's attribute names):
#: who made the request
Requester = pyfuse3.RequestContext | RequestContext
#: a readdir's reply being filled (:func:`readdir_reply` adds to it)
DirToken = pyfuse3.ReaddirToken | DirBuffer
#: a setattr's new values, and which of them it changes
AttrValues = pyfuse3.EntryAttributes | SetattrValues
AttrFields = pyfuse3.SetattrFields | SetattrFields


class FileReply(pyfuse3.FileInfo):
    """An open file's reply. *noflush*: the kernel sends no FLUSH when a descriptor of
    it is closed (read-only opens: nothing to report at close); *backing_id*: a
    passthrough backing file registered with ``backing_open`` (0: none), whose bytes
    the kernel reads without asking the daemon. pyfuse3 ignores both."""

    noflush: bool
    backing_id: int

    def __new__(
        cls,
        *,
        fh: int,
        direct_io: bool = False,
        keep_cache: bool = False,
        nonseekable: bool = False,
        noflush: bool = False,
        backing_id: int = 0,
    ) -> Self:
        # pyfuse3's __cinit__ takes only its own fields (its stub declares them on __init__)
        self = super().__new__(cls, fh=fh, direct_io=direct_io, keep_cache=keep_cache, nonseekable=nonseekable)  # type: ignore[call-arg]
        self.noflush = noflush
        self.backing_id = backing_id
        return self

    def __init__(self, **_: Any) -> None:
        pass


def readdir_reply(token: DirToken, name: bytes, attr: pyfuse3.EntryAttributes, next_id: int) -> bool:
    """Add one entry to a readdir reply (either transport's token); False when full."""
    if isinstance(token, DirBuffer):
        return token.add(name, attr, next_id)
    return bool(pyfuse3.readdir_reply(token, name, attr, next_id))


class FuseTransport(Protocol):
    """What the daemon and the filesystem use of a transport (see the module doc)."""

    name: str
    passthrough: bool

    def mount(self, mountpoint: str) -> None: ...

    async def serve(self) -> None: ...

    def close(self, *, unmount: bool) -> None: ...

    def invalidate_entry(self, parent: int, name: bytes) -> None: ...

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None: ...

    def notify_store(self, ino: int, offset: int, data: bytes) -> None: ...

    def backing_open(self, fd: int) -> int: ...

    def backing_close(self, backing_id: int) -> None: ...


class PyfuseTransport:
    """pyfuse3 over libfuse: no passthrough, no NOFLUSH (it ignores those replies)."""

    name = "pyfuse3"
    passthrough = False

    def __init__(self, ops: Any, spec: MountSpec) -> None:
        self.ops = ops
        self.spec = spec

    def mount(self, mountpoint: str) -> None:
        opts = {
            f"fsname={self.spec.fsname}",
            f"subtype={self.spec.subtype}",
            "default_permissions",
        }
        if self.spec.noatime:
            opts.add("noatime")
        if self.spec.allow_other:
            opts.add("allow_other")
        try:
            pyfuse3.init(self.ops, mountpoint, opts)
        except (RuntimeError, OSError) as exc:
            raise MountFailed(getattr(exc, "errno", None) or 5, f"pyfuse3 could not mount {mountpoint}: {exc}") from exc

    async def serve(self) -> None:
        await pyfuse3.main(min_tasks=4, max_tasks=64)

    def close(self, *, unmount: bool) -> None:
        pyfuse3.close(unmount=unmount)

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        pyfuse3.invalidate_entry(parent, name)

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None:
        pyfuse3.invalidate_inode(ino, attr_only=attr_only)

    def notify_store(self, ino: int, offset: int, data: bytes) -> None:
        pyfuse3.notify_store(ino, offset, data)

    def backing_open(self, fd: int) -> int:
        raise OSError(95, "pyfuse3 has no passthrough")

    def backing_close(self, backing_id: int) -> None:
        raise OSError(95, "pyfuse3 has no passthrough")


class KernelTransport(Session):
    """The kernel transport (:class:`kvfs.mount.kernel.session.Session`)."""

    name = "kernel"


def kernel_possible() -> str | None:
    """Why the kernel transport cannot mount here, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if can_mount_directly() or shutil.which("fusermount3") is not None:
        return None
    return "not root and no fusermount3"


def open_transport(
    kind: Transport, ops: Any, mountpoint: str, spec: MountSpec, options: SessionOptions | None = None
) -> FuseTransport:
    """Mount *ops* at *mountpoint* on the transport *kind* chooses; the mounted transport.
    Raises :class:`~kvfs.mount.kernel.device.MountFailed` (nothing left mounted)."""
    if kind is not Transport.PYFUSE3:
        why = kernel_possible()
        if why is None:
            kernel = KernelTransport(ops, spec, options or SessionOptions())
            try:
                kernel.mount(mountpoint)
                return kernel
            except MountFailed as exc:
                if kind is Transport.KERNEL or exc.errno != 71:  # EPROTO: an old kernel protocol
                    raise
                log.info("the kernel transport cannot serve this kernel (%s); using pyfuse3", exc)
        elif kind is Transport.KERNEL:
            raise MountFailed(1, f'[mount] transport = "kernel" cannot mount here: {why}; use "auto" or "pyfuse3"')
    transport = PyfuseTransport(ops, spec)
    transport.mount(mountpoint)
    return transport
