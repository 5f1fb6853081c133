"""The ``posix`` tier: a directory every node mounts (Lustre, NFS); how nodes share blocks.

Block files in the block format (:mod:`kvfs.blockfile`) under ``<path>/blocks/``, in the
sharded directories of the block names, written by :class:`~kvfs.tiers.blockdir.BlockDirectory`
(the same code as the disk tier). What differs, because other nodes use the directory at
the same time:

- A block is written to a hidden temporary in the *same directory* as its final name
  (``.kvfs-tmp.<base>.<random>``) and renamed into place. Rename within a directory is
  atomic on NFS and Lustre, so a reader on any node sees the old file, the new file or
  none, never a partial one. Two nodes publishing the same name at once is harmless: both
  files are whole and, the name being a content hash, identical; the last rename wins.
- No locks, no ``flock``, no ``O_DIRECT``: nothing NFS lacks. Temporaries of other nodes
  are never cleaned at start (they may be in flight); :meth:`PosixTier.clean_stale_tmp`
  removes old ones on request.
- A file another node deleted reads as missing (``ENOENT``, and ``ESTALE`` from NFS,
  become :class:`BlockNotFound`).
- Rename is copy + delete (the default), never a header rewrite in place, which a reader
  on another node could catch half done; :meth:`scan` never "repairs" other nodes' files.
- ``fsync`` (on by default) flushes a file to the server before its name appears.
- Lifetimes (``kvfs gc``, the retention sweep): :meth:`PosixTier.inventory` walks the
  tree one directory per deadline; :meth:`PosixTier.expire` removes a block only if its
  file is older than a cutoff, exactly: the file is first renamed aside (atomic), its age
  checked on the renamed inode, and a file another node published meanwhile is linked
  back into place. A reader on another node may miss the block for that instant, never
  get wrong bytes.
- Every operation runs in the tier's helper process (:class:`PosixOps` there,
  :class:`~kvfs.helper.HelperProcess` here) with the configured timeout: a stalled mount
  raises :class:`TierUnavailable` after ``timeout`` seconds instead of hanging the caller,
  and a call stuck in the kernel (a FUSE-based filesystem waits for its server
  uninterruptibly) holds the helper, never the daemon, which can always exit. A call that
  outlives its caller never touches the caller's buffers: writes send a copy, reads come
  back as bytes of their own.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvfs.blockfile import file_length
from kvfs.config import PosixConfig, TierKind
from kvfs.errors import BlockCorrupt, BlockNotFound, TierFull, TierUnavailable
from kvfs.helper import HelperProcess
from kvfs.names import RESERVED_PREFIX
from kvfs.pieces import Pieces
from kvfs.tier import BlockInfo, BlockRef, StoredObject, Tier, os_error

from .blockdir import BlockDirectory

__all__ = ["PosixOps", "PosixTier", "SharedBlockDirectory"]

log = logging.getLogger("kvfs.tiers.posix")


TMP_PREFIX = RESERVED_PREFIX + "tmp."  # within the reserved names no block or directory may have (kvfs.names)
_ASIDE = TMP_PREFIX + "gc."  # a block being expired, renamed aside (a temporary if gc dies there)
_MISSING = (errno.ENOENT, errno.ESTALE, errno.ENOTDIR)


class SharedBlockDirectory(BlockDirectory):
    """A :class:`BlockDirectory` that other nodes write at the same time."""

    repair_renames = False

    def tmp_path(self, name: str) -> str:
        parent, _, base = self.path(name).rpartition("/")
        return f"{parent}/{TMP_PREFIX}{base[:100]}.{secrets.token_hex(8)}"

    def is_tmp(self, filename: str) -> bool:
        return filename.startswith(TMP_PREFIX)

    def listdir(self, directory: str) -> dict[str, bool]:
        top = f"{self.blocks}/{directory}" if directory else str(self.blocks)
        try:
            entries = list(os.scandir(top))
        except FileNotFoundError:
            return {}
        except NotADirectoryError:
            return {}
        return {e.name: e.is_dir() for e in entries if not e.name.startswith(TMP_PREFIX)}


class PosixOps:
    """The posix tier's calls on its directory, run in the tier's helper process
    (:class:`~kvfs.helper.HelperProcess`): a call into a filesystem that stopped answering
    may block its thread in the kernel for good, and that holds the helper, never the
    daemon. Answers are plain data (bytes, records, lists) that cross a socket."""

    def __init__(self, path: str, fsync: bool) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._dir: SharedBlockDirectory | None = None

    @property
    def dir(self) -> SharedBlockDirectory:
        if self._dir is None:
            self._dir = SharedBlockDirectory(self.path, fsync=self.fsync)
        return self._dir

    def open_dir(self) -> None:
        """Make (or check) the directory tree."""
        _ = self.dir

    def write(self, name: str, data: bytes, checksum: int) -> None:
        try:
            self.dir.write(name, data, checksum)
        except FileNotFoundError:
            # Someone removed the shard directory this process remembered; make it again.
            self.dir._known_dirs.clear()
            self.dir.write(name, data, checksum)

    def read(self, name: str) -> tuple[bytes, int]:
        ref = self.dir.read(name)
        return bytes(ref.data), ref.checksum

    def delete(self, name: str) -> None:
        self.dir.delete(name)

    def stat(self, name: str) -> BlockInfo | None:
        return self.dir.stat(name)

    def scan(self, prefix: str) -> list[BlockInfo]:
        return list(self.dir.scan(prefix))

    def listdir(self, directory: str) -> dict[str, bool]:
        return self.dir.listdir(directory)

    def list_dir(self, rel: str) -> list[tuple[str, bool, float, int]]:
        """``(name, is_dir, mtime, size)`` of each entry of the directory *rel* (relative to
        the tier's root); symlinks and other odd entries are left out."""
        out = []
        try:
            entries = list(os.scandir(f"{self.dir.root}/{rel}"))
        except (FileNotFoundError, NotADirectoryError):
            return []
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                out.append((e.name, stat.S_ISDIR(st.st_mode), st.st_mtime, st.st_size))
        return out

    def expire(self, name: str, cutoff: float) -> bool:
        path = self.dir.path(name)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_mtime >= cutoff:
            return False
        parent, _, base = path.rpartition("/")
        aside = f"{parent}/{_ASIDE}{base[:100]}.{secrets.token_hex(8)}"
        try:
            os.rename(path, aside)  # whatever is there now: its age is checked on the inode moved
        except FileNotFoundError:
            return False
        if os.lstat(aside).st_mtime < cutoff:
            os.unlink(aside)
            return True
        try:  # published again since we looked: put it back, unless a newer one is there already
            os.link(aside, path)
        except FileExistsError:
            pass
        os.unlink(aside)
        return False

    def remove_leftover(self, name: str, cutoff: float) -> bool:
        path = f"{self.dir.root}/{name}"
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_mtime >= cutoff:
                return False  # a writer still at it (its file grew since)
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False

    def clean_stale_tmp(self, older_than: float) -> int:
        cutoff = time.time() - older_than
        n = 0
        for dirpath, _dirs, files in os.walk(self.dir.blocks):
            for fn in files:
                if fn.startswith(TMP_PREFIX):
                    p = f"{dirpath}/{fn}"
                    try:
                        if os.stat(p).st_mtime < cutoff:
                            os.unlink(p)
                            n += 1
                    except FileNotFoundError:
                        pass
        return n


class _Paths:
    """Where a posix tier's files are, computed here without touching the filesystem
    (the helper process does every call that does)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blocks = self.root / "blocks"
        self.tmp = self.root / "tmp"

    def path(self, name: str) -> str:
        return f"{self.blocks}/{name}"


class PosixTier(Tier):
    kind = TierKind.POSIX
    persistent = True
    shared = True

    def __init__(self, config: PosixConfig) -> None:
        super().__init__(config)
        self._what = f"posix tier {config.name!r}"
        self.dir = _Paths(config.path)
        self._helper = HelperProcess(
            self._what,
            "kvfs.tiers.posix:PosixOps",
            (str(config.path), config.fsync),
            timeout=config.timeout,
            workers=config.concurrency,
        )
        try:
            self._helper.call("open_dir", op=f"opening {config.path}")
        except OSError as exc:
            self._helper.close()
            raise TierUnavailable(f"{self._what}: cannot use {config.path}: {exc.strerror}") from exc
        except BaseException:
            self._helper.close()
            raise

    def _call(self, op: str, method: str, *args: Any) -> Any:
        """``method(*args)`` of the helper's :class:`PosixOps`, with the deadline; OSError
        becomes a kvfs error."""
        try:
            return self._helper.call(method, *args, op=op)
        except OSError as exc:
            if exc.errno in _MISSING:
                raise BlockNotFound(f"{self._what}: {op}: {exc.strerror}") from exc
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise TierFull(f"{self._what} is out of space: {exc.strerror}") from exc
            raise os_error(f"{self._what}: {op}", exc) from exc

    def footprint(self, name: str, size: int) -> int:
        return file_length(name, size)

    def put(self, name: str, data: Any, checksum: int) -> None:
        # A copy, sent to the helper: nothing there ever reads the caller's buffer.
        data = bytes(Pieces.of(data).joined())
        try:
            self._call(f"write of {name}", "write", name, data, checksum)
        except BlockNotFound as exc:  # ENOENT twice: the tree itself is gone
            raise TierUnavailable(f"{self._what}: write of {name} failed: {exc}") from exc

    def open(self, name: str) -> BlockRef:
        data, checksum = self._call(f"read of {name}", "read", name)
        return BlockRef(memoryview(data), checksum)

    # read_into is the Tier default (open, then copy in the caller's thread).

    def delete(self, name: str) -> None:
        try:
            self._call(f"delete of {name}", "delete", name)
        except BlockNotFound:
            pass  # another node won

    def stat(self, name: str) -> BlockInfo | None:
        try:
            info: BlockInfo | None = self._call(f"stat of {name}", "stat", name)
        except (BlockNotFound, BlockCorrupt):
            return None
        return info

    def scan(self, prefix: str = "") -> Iterator[BlockInfo]:
        # Collected in the helper so the deadline covers the walk; scans are for tools
        # and tests (rebuild skips shared tiers), the mount lists with listdir().
        return iter(self._call(f"scan of {prefix or '/'}", "scan", prefix))

    def listdir(self, directory: str = "") -> dict[str, bool]:
        out: dict[str, bool] = self._call(f"listing of {directory or '/'}", "listdir", directory)
        return out

    # -- lifetimes -------------------------------------------------------------------

    def inventory(self, prefix: str = "") -> Iterator[StoredObject]:
        """Block files and temporaries under ``blocks/<prefix>`` (and, for the whole tier,
        the files in ``tmp/``); one deadline per directory."""
        p = prefix.strip("/")
        stack = [f"blocks/{p}" if p else "blocks"]
        if not p:
            for fn, is_dir, mtime, size in self._call("listing of tmp/", "list_dir", "tmp"):
                if not is_dir:
                    yield StoredObject(f"tmp/{fn}", mtime, size, leftover=True)
        while stack:
            d = stack.pop()
            entries = self._call(f"listing of {d}", "list_dir", d)
            for fn, is_dir, mtime, size in sorted(entries):
                rel = f"{d}/{fn}"
                if is_dir:
                    stack.append(rel)
                elif fn.startswith(TMP_PREFIX):
                    yield StoredObject(rel, mtime, size, leftover=True)
                else:
                    yield StoredObject(rel[len("blocks/") :], mtime, size)

    def expire(self, name: str, cutoff: float) -> bool:
        return bool(self._call(f"expiry of {name}", "expire", name, cutoff))

    def remove_leftover(self, obj: StoredObject, cutoff: float) -> bool:
        if not obj.leftover:
            raise ValueError(f"{obj.name} is a block, not a leftover; use expire()")
        return bool(self._call(f"removal of {obj.name}", "remove_leftover", obj.name, cutoff))

    def clean_stale_tmp(self, older_than: float = 3600.0) -> int:
        """Remove temporaries older than *older_than* seconds (left by crashed writers on
        any node); returns how many. Not run automatically: a slow writer elsewhere may
        still own a young one."""
        return int(self._call("cleaning temporaries", "clean_stale_tmp", older_than))

    def close(self) -> None:
        self._helper.close()
