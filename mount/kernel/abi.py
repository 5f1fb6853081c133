"""The kernel's FUSE protocol (``linux/fuse.h``): opcodes, flags and message layouts.

Written from the kernel's documented interface (``include/uapi/linux/fuse.h``, protocol
7.40 and later for passthrough): every message is a ``fuse_in_header`` (or, from us, a
``fuse_out_header``) followed by the opcode's fixed-size argument struct and then any
names or data. Integers are in the host's byte order; structs are padded explicitly, so
``struct`` with ``=`` (native order, no alignment) matches them exactly. Only what kvfs
speaks is here.
"""

from __future__ import annotations

import enum
import struct

__all__ = [
    "ATTR",
    "ATTR_OUT",
    "BACKING_MAP",
    "DIRENT",
    "ENTRY_OUT",
    "INIT_IN",
    "INIT_OUT",
    "IN_HEADER",
    "IOC_BACKING_CLOSE",
    "IOC_BACKING_OPEN",
    "IOC_CLONE",
    "KERNEL_MAJOR",
    "KERNEL_MINOR",
    "MIN_MINOR",
    "OUT_HEADER",
    "Init",
    "Notify",
    "Op",
    "Open",
    "Setattr",
]

KERNEL_MAJOR = 7
KERNEL_MINOR = 40
"""The protocol minor version kvfs speaks (7.40: passthrough). A kernel that offers less
gets its own minor back (the two sides use the smaller one)."""
MIN_MINOR = 31
"""The oldest protocol kvfs accepts (Linux 5.10): every struct below has its current size."""

ROOT_ID = 1


class Op(enum.IntEnum):
    """``enum fuse_opcode``: the requests the kernel sends."""

    LOOKUP = 1
    FORGET = 2  # no reply
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    GETLK = 31
    SETLK = 32
    SETLKW = 33
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    BMAP = 37
    DESTROY = 38
    IOCTL = 39
    POLL = 40
    NOTIFY_REPLY = 41
    BATCH_FORGET = 42  # no reply
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47
    SETUPMAPPING = 48
    REMOVEMAPPING = 49
    SYNCFS = 50
    TMPFILE = 51
    STATX = 52


class Init(enum.IntFlag):
    """INIT flags (``flags``, and ``flags2`` shifted up by 32 with ``INIT_EXT``)."""

    ASYNC_READ = 1 << 0
    POSIX_LOCKS = 1 << 1
    ATOMIC_O_TRUNC = 1 << 3
    EXPORT_SUPPORT = 1 << 4
    BIG_WRITES = 1 << 5
    DONT_MASK = 1 << 6
    FLOCK_LOCKS = 1 << 10
    AUTO_INVAL_DATA = 1 << 12
    DO_READDIRPLUS = 1 << 13
    READDIRPLUS_AUTO = 1 << 14
    ASYNC_DIO = 1 << 15
    WRITEBACK_CACHE = 1 << 16
    NO_OPEN_SUPPORT = 1 << 17
    PARALLEL_DIROPS = 1 << 18
    ABORT_ERROR = 1 << 21
    MAX_PAGES = 1 << 22
    HANDLE_KILLPRIV_V2 = 1 << 28
    INIT_EXT = 1 << 30
    PASSTHROUGH = 1 << 37


class Open(enum.IntFlag):
    """``FOPEN_*``: how the kernel treats one open file (the reply to OPEN and CREATE)."""

    DIRECT_IO = 1 << 0
    KEEP_CACHE = 1 << 1
    NONSEEKABLE = 1 << 2
    CACHE_DIR = 1 << 3
    NOFLUSH = 1 << 5
    PARALLEL_DIRECT_WRITES = 1 << 6
    PASSTHROUGH = 1 << 7


class Setattr(enum.IntFlag):
    """``FATTR_*``: which fields of a SETATTR are set."""

    MODE = 1 << 0
    UID = 1 << 1
    GID = 1 << 2
    SIZE = 1 << 3
    ATIME = 1 << 4
    MTIME = 1 << 5
    FH = 1 << 6
    ATIME_NOW = 1 << 7
    MTIME_NOW = 1 << 8
    CTIME = 1 << 10


class Notify(enum.IntEnum):
    """``enum fuse_notify_code``: messages the daemon sends unasked (``unique`` 0)."""

    INVAL_INODE = 2
    INVAL_ENTRY = 3
    STORE = 4


RENAME_NOREPLACE = 1 << 0
RENAME_EXCHANGE = 1 << 1
GETATTR_FH = 1 << 0
WRITE_CACHE = 1 << 0  # a write from the page cache (writeback): the fh may be any of the inode's
MIN_READ_BUFFER = 8192

# struct fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
IN_HEADER = struct.Struct("=IIQQIIIHH")
# struct fuse_out_header: len, error (negative errno), unique
OUT_HEADER = struct.Struct("=IiQ")
# struct fuse_attr: ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec,
# mode, nlink, uid, gid, rdev, blksize, flags
ATTR = struct.Struct("=QQQQQQIIIIIIIIII")
# struct fuse_entry_out: nodeid, generation, entry_valid, attr_valid, *_nsec, attr
ENTRY_OUT = struct.Struct("=QQQQII" + ATTR.format[1:])
# struct fuse_attr_out: attr_valid, attr_valid_nsec, dummy, attr
ATTR_OUT = struct.Struct("=QII" + ATTR.format[1:])
# struct fuse_open_out: fh, open_flags, backing_id
OPEN_OUT = struct.Struct("=QIi")
# struct fuse_init_in: major, minor, max_readahead, flags, flags2 (then unused[11])
INIT_IN = struct.Struct("=IIIII")
# struct fuse_init_out: major, minor, max_readahead, flags, max_background,
# congestion_threshold, max_write, time_gran, max_pages, map_alignment, flags2,
# max_stack_depth, request_timeout, unused[11]
INIT_OUT = struct.Struct("=IIIIHHIIHHIIH22x")
GETATTR_IN = struct.Struct("=IIQ")  # getattr_flags, dummy, fh
# struct fuse_setattr_in: valid, padding, fh, size, lock_owner, atime, mtime, ctime,
# atimensec, mtimensec, ctimensec, mode, unused4, uid, gid, unused5
SETATTR_IN = struct.Struct("=IIQQQQQQIIIIIIII")
OPEN_IN = struct.Struct("=II")  # flags, open_flags
CREATE_IN = struct.Struct("=IIII")  # flags, mode, umask, open_flags
MKNOD_IN = struct.Struct("=IIII")  # mode, rdev, umask, padding
MKDIR_IN = struct.Struct("=II")  # mode, umask
RENAME_IN = struct.Struct("=Q")  # newdir
RENAME2_IN = struct.Struct("=QII")  # newdir, flags, padding
RELEASE_IN = struct.Struct("=QIIQ")  # fh, flags, release_flags, lock_owner
FLUSH_IN = struct.Struct("=QIIQ")  # fh, unused, padding, lock_owner
READ_IN = struct.Struct("=QQIIQII")  # fh, offset, size, read_flags, lock_owner, flags, padding
WRITE_IN = READ_IN  # fh, offset, size, write_flags, lock_owner, flags, padding
WRITE_OUT = struct.Struct("=II")  # size, padding
FSYNC_IN = struct.Struct("=QII")  # fh, fsync_flags, padding
SETXATTR_IN = struct.Struct("=II")  # size, flags (without FUSE_SETXATTR_EXT)
GETXATTR_IN = struct.Struct("=II")  # size, padding
GETXATTR_OUT = struct.Struct("=II")  # size, padding
ACCESS_IN = struct.Struct("=II")  # mask, padding
FORGET_IN = struct.Struct("=Q")  # nlookup
BATCH_FORGET_IN = struct.Struct("=II")  # count, dummy
FORGET_ONE = struct.Struct("=QQ")  # nodeid, nlookup
LSEEK_IN = struct.Struct("=QQII")  # fh, offset, whence, padding
LSEEK_OUT = struct.Struct("=Q")
# struct fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare[6]
STATFS_OUT = struct.Struct("=QQQQQIIII24x")
DIRENT = struct.Struct("=QQII")  # ino, off, namelen, type (then the name, padded to 8)
NOTIFY_INVAL_INODE = struct.Struct("=Qqq")  # ino, off, len
NOTIFY_INVAL_ENTRY = struct.Struct("=QII")  # parent, namelen, flags (then the name and a NUL)
NOTIFY_STORE = struct.Struct("=QQII")  # nodeid, offset, size, padding (then the data)
BACKING_MAP = struct.Struct("=iIQ")  # fd, flags, padding


def _ioc(direction: int, nr: int, size: int) -> int:
    """``_IOC`` of the generic Linux ioctl encoding for the FUSE device (type 229)."""
    return (direction << 30) | (size << 16) | (229 << 8) | nr


_IOC_WRITE, _IOC_READ = 1, 2
IOC_CLONE = _ioc(_IOC_READ, 0, 4)
"""FUSE_DEV_IOC_CLONE: make a descriptor of /dev/fuse read requests of a session."""
IOC_BACKING_OPEN = _ioc(_IOC_WRITE, 1, BACKING_MAP.size)
"""FUSE_DEV_IOC_BACKING_OPEN: register a backing file for passthrough; returns its id."""
IOC_BACKING_CLOSE = _ioc(_IOC_WRITE, 2, 4)
"""FUSE_DEV_IOC_BACKING_CLOSE: drop a backing id (open files keep their backing file)."""
