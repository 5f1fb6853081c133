"""Block files in a directory tree: the storage the ``disk`` and ``posix`` tiers share.

One file per block in the block format (:mod:`kvfs.blockfile`) under ``<root>/blocks/``,
at the block's own path (``blocks/<namespace>/<ab>/<abcdef...>``), written to a temporary
and renamed into place, so a crash never leaves a partial block under a real name. Reads
verify the header and the payload checksum. :class:`BlockDirectory` is the local layout
(temporaries in ``<root>/tmp/``); the posix tier subclasses it for a directory other nodes
write at the same time. Not a tier itself: the tiers own one and translate its errors.

Layouts: with ``beside`` (the disk tier, where the filesystem keeps user extended
attributes) a block is written as version 3: the file is exactly the payload and the
header is its ``user.kvfs.block`` attribute, so :meth:`BlockDirectory.open_file` can hand
the file itself to a reader that reads it by offset (FUSE passthrough). Otherwise, and
for names too long for an attribute, the header precedes the payload (version 2). Every
read takes either layout.

Checked once per file: :meth:`~BlockDirectory.open_file` hands out a file without reading
it when this directory wrote that very file or already checked it — the same device and
inode, size, mtime and ctime, remembered when it was written or last read whole (a bounded
table). Anything that changes the file through the filesystem changes its ctime, so the
next open checks it again.

Durability: with ``fsync`` a file is flushed to stable storage before it is renamed into
place and its directory after, so a block whose name survives a host crash has its bytes
too. Without it (the disk tier's default) a crash can leave a recently published name
with a short or zeroed file; the checksum catches it, the scan at restart counts and
removes it. Either way no reader ever gets wrong bytes.

Scanning (at restart) trusts nothing on disk: a file whose header does not decode, whose
name is not a valid kvfs name (``../../x``) or that is not a regular file is reported as a
problem (:attr:`~kvfs.tier.BlockInfo.problem`) and, where this process is the directory's
only writer, removed; it is never moved anywhere.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import secrets
import shutil
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvfs.blockfile import (
    ALIGN,
    XATTR,
    BlockHeader,
    align_up,
    beside_fits,
    decode_beside,
    decode_header,
    devsum,
    encode_beside,
    encode_header,
    header_length,
    read_header,
    verify,
)
from kvfs.errors import BlockCorrupt, BlockNotFound, InvalidName
from kvfs.names import normalize
from kvfs.pieces import Pieces
from kvfs.tier import BackingFile, BlockInfo, BlockRef

__all__ = ["BlockDirectory", "file_identity"]

log = logging.getLogger("kvfs.tiers.blockdir")


def _aligned(n: int) -> mmap.mmap:
    """A page-aligned, zeroed buffer of at least *n* bytes (anonymous mmap)."""
    return mmap.mmap(-1, max(align_up(n), ALIGN))


_NO_XATTR = (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)
_CHECKED_MAX = 1 << 16  # files remembered as checked (one small tuple each)

Identity = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, checksum


def file_identity(st: os.stat_result) -> tuple[int, int, int]:
    """What a checked file is known by besides its device and inode: anything written to
    it through the filesystem changes one of these."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _beside_header(fd: int) -> BlockHeader | None:
    """The version-3 header of the open file *fd*, or None when its header is in the file."""
    try:
        value = os.getxattr(fd, XATTR)
    except OSError as exc:
        if exc.errno in _NO_XATTR:
            return None
        raise
    return decode_beside(value)


class BlockDirectory:
    """Block files in a directory tree: the file format plus atomic publish.

    Shared by the ``disk`` tier and the ``posix`` tier (which adds timeouts and tolerates
    other nodes), so the on-disk format is written in one place.
    """

    repair_renames = True
    """:meth:`scan` completes a rename interrupted between the header rewrite and the
    file rename. Only safe when this process is the directory's only writer."""

    def __init__(self, root: Path, *, direct_io: bool = False, fsync: bool = False, beside: bool = False) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.blocks = self.root / "blocks"
        self.tmp = self.root / "tmp"
        self.blocks.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.direct_io = direct_io and self._probe_direct()
        self.beside = beside and self._probe_xattr()
        """New blocks are written as version 3 (header beside the payload)."""
        self._known_dirs: set[str] = set()
        self._checked: OrderedDict[tuple[int, int], Identity] = OrderedDict()
        self._checked_lock = threading.Lock()

    def _probe_direct(self) -> bool:
        probe = self.tmp / f".probe-{secrets.token_hex(4)}"
        try:
            fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
        except OSError:
            log.info("O_DIRECT is not supported under %s; using buffered I/O", self.root)
            return False
        os.close(fd)
        os.unlink(probe)
        return True

    def _probe_xattr(self) -> bool:
        probe = self.tmp / f".probe-{secrets.token_hex(4)}"
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            os.setxattr(fd, XATTR, b"probe")
            return True
        except OSError as exc:
            log.info(
                "%s keeps no user extended attributes (%s); block headers stay before the payload",
                self.root,
                exc.strerror,
            )
            return False
        finally:
            os.close(fd)
            os.unlink(probe)

    def layout_beside(self, name: str) -> bool:
        """Whether a new block *name* is written with its header beside the payload."""
        return self.beside and beside_fits(name)

    # -- files checked once -------------------------------------------------------

    def _remember(self, st: os.stat_result, checksum: int) -> None:
        """The file *st* describes holds a payload whose checksum is *checksum* (this
        process wrote it, or read it whole and checked it)."""
        key = (st.st_dev, st.st_ino)
        ident = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, checksum)
        with self._checked_lock:
            self._checked[key] = ident
            self._checked.move_to_end(key)
            while len(self._checked) > _CHECKED_MAX:
                self._checked.popitem(last=False)

    def _was_checked(self, st: os.stat_result, checksum: int) -> bool:
        ident = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, checksum)
        with self._checked_lock:
            return self._checked.get((st.st_dev, st.st_ino)) == ident

    def clean_tmp(self) -> None:
        for entry in os.scandir(self.tmp):
            try:
                os.unlink(entry.path)
            except OSError:
                pass

    def path(self, name: str) -> str:
        return f"{self.blocks}/{name}"

    def tmp_path(self, name: str) -> str:
        """Where the file for *name* is written before it is renamed into place: in tmp/
        by default (one writer, emptied on start). Subclasses may put it elsewhere on the
        same filesystem; :meth:`is_tmp` must then recognise it."""
        return f"{self.tmp}/{secrets.token_hex(8)}"

    def is_tmp(self, filename: str) -> bool:
        """True for a file under blocks/ that is an unpublished temporary (never by default)."""
        return False

    def _ensure_parent(self, name: str) -> None:
        i = name.rfind("/")
        if i < 0:
            return
        d = name[:i]
        if d not in self._known_dirs:
            os.makedirs(f"{self.blocks}/{d}", exist_ok=True)
            self._known_dirs.add(d)

    def write(self, name: str, data: Any, checksum: int) -> None:
        """Write the block file to tmp/ and rename it into place (replacing atomically)."""
        # one buffer: the device checksum is taken over it whole (a seal's pieces are joined
        # here, in a worker thread; the write-through's copies come from DRAM in one piece)
        mv = memoryview(Pieces.of(data).joined())
        dsum = devsum(mv)  # the device checksum: GPU reads verify on the GPU
        self._ensure_parent(name)  # first: tmp_path may be in the target's directory
        if self.layout_beside(name):
            try:
                self._write_file(name, mv, b"", encode_beside(name, len(mv), checksum, dsum))
                return
            except OSError as exc:
                if exc.errno not in (*_NO_XATTR, errno.ENOSPC, errno.E2BIG):
                    raise
                # the attribute did not fit (or the filesystem changed): the header goes first
        self._write_file(name, mv, encode_header(name, len(mv), checksum, dsum), None)

    def _write_file(self, name: str, mv: memoryview, header: bytes, beside: bytes | None) -> None:
        """One block file: *header* then the payload (padded to 4 KiB), or the payload
        alone with *beside* as its :data:`~kvfs.blockfile.XATTR`; renamed into place."""
        tmp = self.tmp_path(name)
        pad = (-len(mv)) % ALIGN
        try:
            if self.direct_io:
                total = len(header) + len(mv) + pad
                buf = _aligned(total)
                buf[: len(header)] = header
                buf[len(header) : len(header) + len(mv)] = mv
                fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_DIRECT, 0o600)
                try:
                    written = os.write(fd, memoryview(buf)[:total]) if total else 0
                    if beside is not None:
                        os.ftruncate(fd, len(mv))  # exactly the payload: no padding after it
                        os.setxattr(fd, XATTR, beside)
                    if self.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                    buf.close()
                if written != total:
                    raise OSError(errno.EIO, f"short write ({written} of {total} bytes)")
            else:
                fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                try:
                    parts: list[Any] = [header, mv] if header else [mv]
                    if pad and beside is None:
                        parts.append(bytes(pad))
                    total = sum(len(p) for p in parts)
                    written = os.writev(fd, parts) if total else 0
                    while written < total:  # writev may be short for large blocks
                        flat = b"".join(bytes(p) for p in parts)
                        written += os.pwrite(fd, flat[written:], written)
                    if beside is not None:
                        os.setxattr(fd, XATTR, beside)
                    if self.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            path = self.path(name)
            try:
                os.rename(tmp, path)
            except IsADirectoryError:
                os.rmdir(path)  # an empty directory left by an earlier name
                os.rename(tmp, path)
            if self.fsync:
                self._sync_dir(os.path.dirname(path))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        if beside is not None:
            try:  # this file holds exactly what was written: no need to read it to check it
                self._remember(os.stat(path), decode_beside(beside).checksum)
            except OSError:
                pass

    @staticmethod
    def _sync_dir(path: str) -> None:
        """Make a rename in directory *path* durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _open_fd(self, name: str) -> int:
        """A descriptor of the block file; a missing name, or a directory (a name that is a
        directory here, e.g. on another node's shared tier), is :class:`BlockNotFound`."""
        try:
            fd = os.open(self.path(name), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise BlockNotFound(name) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise BlockNotFound(name)
        return fd

    def read_into(self, name: str, out: Any) -> tuple[int, int]:
        """Read and verify the block into *out*; returns ``(length, checksum)``."""
        fd = self._open_fd(name)
        try:
            out_mv = memoryview(out).cast("B")
            beside = _beside_header(fd)
            if beside is not None:
                st = self._check_beside(fd, name, beside)
                if beside.length > len(out_mv):
                    raise ValueError(f"buffer of {len(out_mv)} bytes is too small for a block of {beside.length}")
                got = os.preadv(fd, [out_mv[: beside.length]], 0) if beside.length else 0
                if got < beside.length:
                    raise BlockCorrupt(f"{name}: block file is truncated")
                verify(out_mv[: beside.length], beside.checksum, name)
                self._remember(st, beside.checksum)
                return beside.length, beside.checksum
            size = os.fstat(fd).st_size
            head = bytearray(ALIGN)
            want = min(len(out_mv), max(size - ALIGN, 0))
            got = os.preadv(fd, [head, out_mv[:want]], 0)
            hdr = decode_header(head if got >= ALIGN else head[:got])
            if hdr.header_length != ALIGN:  # long names: re-read the payload at its offset
                head = bytearray(hdr.header_length)
                os.preadv(fd, [head], 0)
                hdr = decode_header(head)
                got = ALIGN + os.preadv(fd, [out_mv[: min(want, hdr.length)]], hdr.header_length)
            if hdr.name != name:
                raise BlockCorrupt(f"{name}: file holds block {hdr.name!r}")
            if hdr.length > len(out_mv):
                raise ValueError(f"buffer of {len(out_mv)} bytes is too small for a block of {hdr.length}")
            if got - ALIGN < hdr.length or size < hdr.header_length + hdr.length:
                raise BlockCorrupt(f"{name}: block file is truncated")
            verify(out_mv[: hdr.length], hdr.checksum, name)
            return hdr.length, hdr.checksum
        finally:
            os.close(fd)

    @staticmethod
    def _check_beside(fd: int, name: str, hdr: BlockHeader) -> os.stat_result:
        """The file's stat, once its version-3 header is *name*'s and its size the
        payload's (BlockCorrupt otherwise)."""
        if hdr.name != name:
            raise BlockCorrupt(f"{name}: file holds block {hdr.name!r}")
        st = os.fstat(fd)
        if st.st_size < hdr.length:
            raise BlockCorrupt(f"{name}: block file is truncated")
        if st.st_size > hdr.length:
            raise BlockCorrupt(f"{name}: block file is longer than its header says")
        return st

    def open_file(self, name: str) -> BackingFile | None:
        """The block file, open, when it holds exactly the payload (version 3), checked
        against its header's checksum — read whole only when this directory has not
        written or checked that very file before (see the module doc). None for a file
        with its header before the payload. Raises BlockNotFound and BlockCorrupt."""
        fd = self._open_fd(name)
        try:
            hdr = _beside_header(fd)
            if hdr is None:
                os.close(fd)
                return None
            st = self._check_beside(fd, name, hdr)
            if not self._was_checked(st, hdr.checksum):
                if hdr.length:
                    with mmap.mmap(fd, hdr.length, prot=mmap.PROT_READ) as mm:
                        verify(mm, hdr.checksum, name)
                self._remember(st, hdr.checksum)
            return BackingFile(fd, hdr.length, hdr.checksum, file_identity(st))
        except BaseException:
            os.close(fd)
            raise

    def read(self, name: str) -> BlockRef:
        """The verified payload in a buffer of its own (page-aligned with direct I/O).

        Buffers are freed by reference counting once the ref and its views are dropped:
        an mmap with live views cannot be closed explicitly.
        """
        fd = self._open_fd(name)
        try:
            beside = _beside_header(fd)
            if beside is not None:
                return self._read_beside(fd, name, beside)
            size = os.fstat(fd).st_size
            if self.direct_io and size % ALIGN == 0:
                buf = _aligned(size)
                try:
                    fl = os.O_RDONLY | os.O_DIRECT
                    dfd = os.open(self.path(name), fl)
                except OSError:
                    dfd = -1
                if dfd >= 0:
                    try:
                        got = os.preadv(dfd, [buf], 0)
                    finally:
                        os.close(dfd)
                    return self._finish(name, memoryview(buf), got)
            plain = bytearray(size)
            got = os.preadv(fd, [plain], 0)
            return self._finish(name, memoryview(plain), got)
        finally:
            os.close(fd)

    def _read_beside(self, fd: int, name: str, hdr: BlockHeader) -> BlockRef:
        st = self._check_beside(fd, name, hdr)
        n = hdr.length
        got = -1
        if self.direct_io and n:
            buf: Any = _aligned(n)
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            try:  # O_DIRECT on this very descriptor: a file renamed over the name meanwhile is not read
                fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
                got = os.preadv(fd, [buf], 0)  # the last block short: the file ends there
            except OSError:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
                got = -1
        if got < 0:
            buf = bytearray(n)
            got = os.preadv(fd, [buf], 0) if n else 0
        if got < n:
            raise BlockCorrupt(f"{name}: block file is truncated")
        payload = memoryview(buf)[:n].toreadonly()
        verify(payload, hdr.checksum, name)
        self._remember(st, hdr.checksum)
        return BlockRef(payload, hdr.checksum)

    @staticmethod
    def _finish(name: str, mv: memoryview, got: int) -> BlockRef:
        hdr = decode_header(mv[:got])
        if hdr.name != name:
            raise BlockCorrupt(f"{name}: file holds block {hdr.name!r}")
        end = hdr.header_length + hdr.length
        if got < end:
            raise BlockCorrupt(f"{name}: block file is truncated")
        payload = mv[hdr.header_length : end].toreadonly()
        verify(payload, hdr.checksum, name)
        return BlockRef(payload, hdr.checksum)

    def stat(self, name: str) -> BlockInfo | None:
        try:
            fd = self._open_fd(name)
        except BlockNotFound:
            return None
        try:
            hdr = read_header(fd)
            if hdr.name != name:
                return None
            return BlockInfo(name, hdr.length, hdr.checksum)
        finally:
            os.close(fd)

    def delete(self, name: str) -> None:
        try:
            os.unlink(self.path(name))
        except (FileNotFoundError, NotADirectoryError):
            pass

    def rename(self, old: str, new: str) -> None:
        """Rewrite the header in place when its length is unchanged (a version-3 file's
        attribute always is, when the new name fits in it), then rename the file.

        A crash between the two leaves a file whose header names *new* at *old*'s path;
        :meth:`scan` completes such a rename.
        """
        src = self.path(old)
        try:
            fd = os.open(src, os.O_RDWR)
        except FileNotFoundError as exc:
            raise BlockNotFound(old) from exc
        try:
            beside = _beside_header(fd)
            if beside is not None:
                in_place = beside_fits(new)
                if in_place:
                    os.setxattr(fd, XATTR, encode_beside(new, beside.length, beside.checksum, beside.device_checksum))
            else:
                in_place = header_length(old) == header_length(new)
                if in_place:
                    hdr = decode_header(os.pread(fd, header_length(old), 0))
                    in_place = hdr.header_length == header_length(new)  # an older format's may differ
                    if in_place:
                        os.pwrite(fd, encode_header(new, hdr.length, hdr.checksum, hdr.device_checksum), 0)
        finally:
            os.close(fd)
        if not in_place:
            with self.read(old) as ref:
                self.write(new, ref.data, ref.checksum)
            self.delete(old)
            return
        self._ensure_parent(new)
        try:
            os.rename(src, self.path(new))
        except IsADirectoryError:
            os.rmdir(self.path(new))
            os.rename(src, self.path(new))

    def scan(self, prefix: str = "") -> Iterator[BlockInfo]:
        top = self.blocks / prefix if prefix else self.blocks
        base = len(str(self.blocks)) + 1
        for dirpath, _dirs, files in os.walk(top):
            for fn in files:
                if self.is_tmp(fn):
                    continue
                path = f"{dirpath}/{fn}"
                info = self._scan_one(path, path[base:])
                if info.problem is not None:
                    log.warning("block file %s is corrupt: %s", path, info.problem)
                    if self.repair_renames:  # our own directory: a bad file is only in the way
                        try:
                            os.unlink(path)
                        except OSError:
                            pass
                yield info

    def _scan_one(self, path: str, name: str) -> BlockInfo:
        """The block in the file at *path* (whose name by its place is *name*), or a
        problem entry. Completes an interrupted rename where that is safe."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            return BlockInfo(name, 0, 0, f"cannot open it: {exc.strerror}")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return BlockInfo(name, 0, 0, "not a regular file")
            hdr = read_header(fd)
        except (OSError, BlockCorrupt) as exc:
            return BlockInfo(name, 0, 0, str(exc))
        finally:
            os.close(fd)
        try:
            if normalize(hdr.name) != hdr.name or not hdr.name:
                raise InvalidName(f"{hdr.name!r} is not a normalized name")
        except InvalidName as exc:
            return BlockInfo(name, hdr.length, hdr.checksum, f"its header names an invalid block: {exc}")
        if st.st_size < hdr.header_length + hdr.length:
            return BlockInfo(name, hdr.length, hdr.checksum, "truncated")
        if not hdr.header_length and st.st_size != hdr.length:
            return BlockInfo(name, hdr.length, hdr.checksum, "longer than its header says")
        if hdr.name != name:
            if not self.repair_renames:
                log.warning("skipping %s: its header names %s", path, hdr.name)
                return BlockInfo(name, hdr.length, hdr.checksum, f"its header names {hdr.name!r}")
            target = self.path(hdr.name)
            if os.path.lexists(target):
                return BlockInfo(name, hdr.length, hdr.checksum, f"its header names {hdr.name!r}, which exists")
            self._ensure_parent(hdr.name)
            os.rename(path, target)  # complete an interrupted rename (inside blocks/: the name is valid)
            log.info("completed the interrupted rename of %s to %s", name, hdr.name)
        return BlockInfo(hdr.name, hdr.length, hdr.checksum)

    def destroy(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
