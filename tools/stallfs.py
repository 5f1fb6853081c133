"""A passthrough FUSE filesystem that stops answering on demand: a stalled NFS server.

``python -m kvfs.tools.stallfs SOURCE MOUNTPOINT FLAG`` mirrors the directory SOURCE at MOUNTPOINT.
While the file FLAG exists every request waits (the kernel keeps the caller blocked, as a
hard NFS mount does when its server is gone); when FLAG is removed they all go on. Used
as the ``posix`` tier of a real kvfs mount in tests/tiers/test_faults.py and by ``kvfs bench
faults``. :class:`StallingMount` runs it in a subprocess and always unmounts it.

Inodes are the source's inode numbers; a name is looked up again by path, so renames and
deletes in SOURCE behind its back are fine for what the tests do.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

__all__ = ["StallingMount"]


def _serve(source: str, mountpoint: str, flag: str) -> None:
    import pyfuse3
    import trio

    def fail(exc: OSError) -> pyfuse3.FUSEError:
        return pyfuse3.FUSEError(exc.errno or errno.EIO)

    class StallFS(pyfuse3.Operations):
        supports_dot_lookup = False

        def __init__(self) -> None:
            super().__init__()
            self.paths: dict[int, str] = {pyfuse3.ROOT_INODE: source}

        async def _gate(self) -> None:
            while os.path.exists(flag):  # stalled: hold the request, as a dead server does
                await trio.sleep(0.02)

        def _path(self, inode: int, name: bytes | None = None) -> str:
            try:
                base = self.paths[inode]
            except KeyError:
                raise pyfuse3.FUSEError(errno.ENOENT) from None
            return base if name is None else os.path.join(base, os.fsdecode(name))

        def _attr(self, path: str | None = None, fd: int | None = None) -> pyfuse3.EntryAttributes:
            try:
                st = os.fstat(fd) if fd is not None else os.lstat(path)  # type: ignore[arg-type]
            except OSError as exc:
                raise fail(exc) from None
            a = pyfuse3.EntryAttributes()
            for f in ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size"):
                setattr(a, f, getattr(st, f))
            a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
            a.st_blksize, a.st_blocks = 4096, (st.st_size + 511) // 512
            a.entry_timeout = a.attr_timeout = 0
            if path is not None:
                self.paths[st.st_ino] = path
            return a

        async def lookup(
            self, parent_inode: pyfuse3.InodeT, name: bytes, ctx: pyfuse3.RequestContext | None = None
        ) -> pyfuse3.EntryAttributes:
            await self._gate()
            return self._attr(self._path(parent_inode, name))

        async def forget(self, inode_list: Sequence[tuple[pyfuse3.InodeT, int]]) -> None:
            pass  # paths are kept: cheap for a test's few files

        async def getattr(
            self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext | None = None
        ) -> pyfuse3.EntryAttributes:
            await self._gate()
            return self._attr(self._path(inode))

        async def setattr(
            self,
            inode: pyfuse3.InodeT,
            attr: pyfuse3.EntryAttributes,
            fields: pyfuse3.SetattrFields,
            fh: pyfuse3.FileHandleT | None,
            ctx: pyfuse3.RequestContext,
        ) -> pyfuse3.EntryAttributes:
            await self._gate()
            try:
                if fields.update_size:
                    os.truncate(self._path(inode), attr.st_size)
                if fields.update_mode:
                    os.chmod(self._path(inode), attr.st_mode & 0o7777)
            except OSError as exc:
                raise fail(exc) from None
            return self._attr(self._path(inode))

        async def mkdir(
            self, parent_inode: pyfuse3.InodeT, name: bytes, mode: int, ctx: pyfuse3.RequestContext
        ) -> pyfuse3.EntryAttributes:
            await self._gate()
            path = self._path(parent_inode, name)
            try:
                os.mkdir(path, mode)
            except OSError as exc:
                raise fail(exc) from None
            return self._attr(path)

        async def rmdir(self, parent_inode: pyfuse3.InodeT, name: bytes, ctx: pyfuse3.RequestContext) -> None:
            await self._gate()
            try:
                os.rmdir(self._path(parent_inode, name))
            except OSError as exc:
                raise fail(exc) from None

        async def unlink(self, parent_inode: pyfuse3.InodeT, name: bytes, ctx: pyfuse3.RequestContext) -> None:
            await self._gate()
            try:
                os.unlink(self._path(parent_inode, name))
            except OSError as exc:
                raise fail(exc) from None

        async def rename(
            self,
            parent_inode_old: pyfuse3.InodeT,
            name_old: bytes,
            parent_inode_new: pyfuse3.InodeT,
            name_new: bytes,
            flags: int,
            ctx: pyfuse3.RequestContext,
        ) -> None:
            await self._gate()
            old, new = self._path(parent_inode_old, name_old), self._path(parent_inode_new, name_new)
            try:
                os.rename(old, new)
            except OSError as exc:
                raise fail(exc) from None
            self._attr(new)

        async def opendir(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.FileHandleT:
            await self._gate()
            return pyfuse3.FileHandleT(inode)

        async def readdir(self, fh: pyfuse3.FileHandleT, start_id: int, token: pyfuse3.ReaddirToken) -> None:
            await self._gate()
            path = self._path(fh)
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                raise fail(exc) from None
            for i, name in enumerate(names[start_id:], start=start_id + 1):
                try:
                    attr = self._attr(os.path.join(path, name))
                except pyfuse3.FUSEError:
                    continue
                if not pyfuse3.readdir_reply(token, os.fsencode(name), attr, i):
                    return

        async def releasedir(self, fh: pyfuse3.FileHandleT) -> None:
            pass

        async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
            await self._gate()
            st = os.statvfs(source)
            out = pyfuse3.StatvfsData()
            for f in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail"):
                setattr(out, f, getattr(st, f))
            out.f_namemax = 255
            return out

        async def open(self, inode: pyfuse3.InodeT, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
            await self._gate()
            try:
                return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(os.open(self._path(inode), flags & ~os.O_CREAT)))
            except OSError as exc:
                raise fail(exc) from None

        async def create(
            self, parent_inode: pyfuse3.InodeT, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
        ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
            await self._gate()
            path = self._path(parent_inode, name)
            try:
                fd = os.open(path, flags | os.O_CREAT, mode)
            except OSError as exc:
                raise fail(exc) from None
            return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(fd)), self._attr(path)

        async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
            await self._gate()
            return os.pread(fh, size, off)

        async def write(self, fh: pyfuse3.FileHandleT, off: int, buf: bytes) -> int:
            await self._gate()
            return os.pwrite(fh, buf, off)

        async def flush(self, fh: pyfuse3.FileHandleT) -> None:
            await self._gate()

        async def fsync(self, fh: pyfuse3.FileHandleT, datasync: bool) -> None:
            await self._gate()
            os.fsync(fh)

        async def release(self, fh: pyfuse3.FileHandleT) -> None:
            os.close(fh)

    ops = StallFS()
    pyfuse3.init(ops, mountpoint, {"fsname=stallfs", "default_permissions", "allow_other"})
    try:
        trio.run(pyfuse3.main, 16, 256)
    finally:
        pyfuse3.close(unmount=False)


class StallingMount:
    """A stallfs mount in a subprocess: *source* mirrored at *mountpoint*; :meth:`stall`
    and :meth:`resume` toggle it; :meth:`close` resumes and unmounts (idempotent)."""

    def __init__(self, root: Path) -> None:
        self.source = root / "stall-source"
        self.mountpoint = root / "stall-mnt"
        self.flag = root / "stall-flag"
        self.source.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kvfs.tools.stallfs", str(self.source), str(self.mountpoint), str(self.flag)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while not os.path.ismount(self.mountpoint):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                err = self._proc.stderr.read().decode() if self._proc.stderr and self._proc.poll() is not None else ""
                self.close()
                raise RuntimeError(f"stallfs did not mount {self.mountpoint}: {err}")
            time.sleep(0.02)

    def stall(self) -> None:
        self.flag.write_bytes(b"")

    def resume(self) -> None:
        try:
            self.flag.unlink()
        except FileNotFoundError:
            pass

    @property
    def stalled(self) -> bool:
        return self.flag.exists()

    def close(self) -> None:
        self.resume()
        if os.path.ismount(self.mountpoint):
            tool = shutil.which("fusermount3") or "fusermount"
            subprocess.run([tool, "-u", "-z", str(self.mountpoint)], capture_output=True, check=False)
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":  # pragma: no cover - the filesystem process
    _serve(*sys.argv[1:4])
