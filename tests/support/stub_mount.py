"""A FUSE filesystem that is only an empty root, mounted with type ``fuse.kvfs``.

Run as ``python stub_mount.py MOUNTPOINT``. It lets the tools' mount discovery
(``/proc/self/mountinfo`` → mountpoint → control socket) be tested for real before the
kvfs filesystem itself exists; unmount with ``fusermount3 -u MOUNTPOINT``.
"""

import errno
import os
import stat
import sys

import pyfuse3
import trio


class EmptyRoot(pyfuse3.Operations):
    async def getattr(self, inode, ctx=None):
        if inode != pyfuse3.ROOT_INODE:
            raise pyfuse3.FUSEError(errno.ENOENT)
        e = pyfuse3.EntryAttributes()
        e.st_ino = inode
        e.st_mode = stat.S_IFDIR | 0o755
        e.st_nlink = 2
        e.st_uid, e.st_gid = os.getuid(), os.getgid()
        return e

    async def lookup(self, parent_inode, name, ctx=None):
        raise pyfuse3.FUSEError(errno.ENOENT)


def main() -> None:
    options = set(pyfuse3.default_options) | {"fsname=kvfs", "subtype=kvfs"}
    pyfuse3.init(EmptyRoot(), sys.argv[1], options)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)


if __name__ == "__main__":
    main()
