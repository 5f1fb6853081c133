"""The FUSE device: getting a session's descriptor, mounting it, and its ioctls.

- :func:`mount` opens ``/dev/fuse`` and mounts it at a directory: with ``mount(2)`` when
  the process may (``CAP_SYS_ADMIN``), else through ``fusermount3``, the setuid helper,
  which mounts and hands the descriptor back over a socket (``_FUSE_COMMFD``, one byte
  with ``SCM_RIGHTS``). Either way the caller gets a :class:`Device`.
- :func:`unmount`: ``umount2(MNT_DETACH)`` as root, ``fusermount3 -u -z`` otherwise.
- :class:`Device`: the descriptor, its clones (``FUSE_DEV_IOC_CLONE``) and the backing
  files of passthrough (``FUSE_DEV_IOC_BACKING_OPEN``/``CLOSE``: root only).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass

from . import abi

__all__ = ["Device", "MountFailed", "MountSpec", "can_mount_directly", "mount", "unmount"]

_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOATIME = 1024
_MNT_DETACH = 2


class MountFailed(OSError):
    """The mount itself failed (the message says how and what to do); nothing is mounted."""


@dataclass(frozen=True, kw_only=True)
class MountSpec:
    """What to mount: the filesystem's name and type as ``/proc/mounts`` shows them
    (``fsname`` on ``fuse.<subtype>``), and the mount options kvfs uses."""

    fsname: str = "kvfs"
    subtype: str = "kvfs"
    allow_other: bool = False
    default_permissions: bool = True
    noatime: bool = True

    def kernel_options(self, fd: int) -> str:
        """The option string ``mount(2)`` passes to the FUSE filesystem."""
        uid, gid = os.getuid(), os.getgid()
        opts = [f"fd={fd}", "rootmode=40000", f"user_id={uid}", f"group_id={gid}"]
        if self.default_permissions:
            opts.append("default_permissions")
        if self.allow_other:
            opts.append("allow_other")
        return ",".join(opts)

    def helper_options(self) -> str:
        """The ``-o`` of ``fusermount3``."""
        opts = [f"fsname={self.fsname}", f"subtype={self.subtype}", "nosuid", "nodev"]
        if self.noatime:
            opts.append("noatime")
        if self.default_permissions:
            opts.append("default_permissions")
        if self.allow_other:
            opts.append("allow_other")
        return ",".join(opts)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def can_mount_directly() -> bool:
    """True when this process may mount with ``mount(2)`` itself (root, or
    ``CAP_SYS_ADMIN`` in the effective set) and open ``/dev/fuse``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    eff = int(line.split()[1], 16)
                    break
            else:  # pragma: no cover - every Linux reports it
                eff = 0
    except OSError:  # pragma: no cover
        eff = 0
    return bool(eff & (1 << 21)) and os.access("/dev/fuse", os.R_OK | os.W_OK)


class Device:
    """One FUSE session's descriptor (non-blocking) and what is done to it."""

    def __init__(self, fd: int, *, mountpoint: str, direct: bool) -> None:
        self.fd = fd
        self.mountpoint = mountpoint
        self.direct = direct
        """Mounted with ``mount(2)`` (so ``umount2`` unmounts it)."""
        os.set_blocking(fd, False)
        self._clones: list[int] = []

    def clone(self) -> int:
        """A new descriptor reading this session's requests (its replies go back through
        it). Closed with the device."""
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, abi.IOC_CLONE, bytearray(self.fd.to_bytes(4, "little")), True)
        except OSError:
            os.close(fd)
            raise
        os.set_blocking(fd, False)
        self._clones.append(fd)
        return fd

    def backing_open(self, fd: int) -> int:
        """Register the open file *fd* as a passthrough backing file; its id (> 0).
        Raises OSError (EPERM without CAP_SYS_ADMIN or when the session has no
        passthrough, ELOOP when *fd*'s filesystem stacks too deep)."""
        arg = bytearray(abi.BACKING_MAP.pack(fd, 0, 0))
        return int(fcntl.ioctl(self.fd, abi.IOC_BACKING_OPEN, arg, True))

    def backing_close(self, backing_id: int) -> None:
        """Drop *backing_id*: files opened with it keep their backing file."""
        arg = bytearray(backing_id.to_bytes(4, "little", signed=False))
        try:
            fcntl.ioctl(self.fd, abi.IOC_BACKING_CLOSE, arg, True)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENODEV, errno.ECONNABORTED):
                raise

    def close(self) -> None:
        for fd in self._clones:
            os.close(fd)
        self._clones.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def mount(mountpoint: str, spec: MountSpec, *, helper: bool = False) -> Device:
    """Open a FUSE session and mount it at *mountpoint* (``mount(2)`` if this process
    may and *helper* is false, else ``fusermount3``). Raises :class:`MountFailed`."""
    if not helper and can_mount_directly():
        return _mount_directly(mountpoint, spec)
    return _mount_with_helper(mountpoint, spec)


def _mount_directly(mountpoint: str, spec: MountSpec) -> Device:
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    flags = _MS_NOSUID | _MS_NODEV | (_MS_NOATIME if spec.noatime else 0)
    libc = _libc()
    rc = libc.mount(
        spec.fsname.encode(),
        mountpoint.encode(),
        f"fuse.{spec.subtype}".encode(),
        ctypes.c_ulong(flags),
        spec.kernel_options(fd).encode(),
    )
    if rc != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise MountFailed(err, f"mount(2) of {mountpoint} failed: {os.strerror(err)}")
    return Device(fd, mountpoint=mountpoint, direct=True)


def _mount_with_helper(mountpoint: str, spec: MountSpec) -> Device:
    helper = shutil.which("fusermount3")
    if helper is None:
        raise MountFailed(
            errno.ENOENT, "cannot mount as an unprivileged user without fusermount3 (apt install fuse3), or run as root"
        )
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = subprocess.run(
            [helper, "-o", spec.helper_options(), "--", mountpoint],
            env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())},
            pass_fds=(theirs.fileno(),),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        theirs.close()
        if proc.returncode != 0:
            raise MountFailed(errno.EPERM, f"fusermount3 could not mount {mountpoint}: {proc.stderr.strip()}")
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    finally:
        theirs.close()
        ours.close()
    if not fds:
        raise MountFailed(errno.EIO, f"fusermount3 mounted {mountpoint} but passed no descriptor")
    for extra in fds[1:]:
        os.close(extra)
    os.set_inheritable(fds[0], False)
    return Device(fds[0], mountpoint=mountpoint, direct=False)


def unmount(mountpoint: str, *, direct: bool) -> None:
    """Detach the mount at *mountpoint* (lazily: open files keep working until closed)."""
    if direct:
        libc = _libc()
        if libc.umount2(mountpoint.encode(), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOENT):  # not mounted (any more)
                raise OSError(err, f"umount2 of {mountpoint} failed: {os.strerror(err)}")
        return
    subprocess.run(["fusermount3", "-u", "-q", "-z", "--", mountpoint], capture_output=True, check=False)
