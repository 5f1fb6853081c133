"""Blocks the kernel serves without asking the daemon, and what keeps them right.

On the kernel transport run as root, a block whose hottest copy is a disk file of the
payload alone is read by the kernel from that file (FUSE passthrough): no READ reaches
the daemon. Blocks served from DRAM keep their pages in the kernel across opens, and
read-only opens send no FLUSH. None of it may ever serve wrong bytes: a backing file
corrupted behind the tier, a block replaced, evicted or demoted while a reader has it
open (docs/SEMANTICS.md, "What the kernel serves without asking the daemon").

The daemon's counts of FUSE operations (its Prometheus metrics) show what reached it.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from support.cli import run_kvfs
from support.configs import dram_over_disk
from support.deadlines import wait_for
from support.metrics import scrape

pytestmark = pytest.mark.fuse

MiB = 1 << 20

CONFIG = (
    dram_over_disk("16MiB", "64MiB", "{data}/disk", names=True)
    + """
[mount]
transport = "{transport}"
metrics_port = {port}
"""
)


def blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mount:
    def __init__(self, kvfs_mount, tmp_path: Path, transport: str = "kernel") -> None:
        self.data = tmp_path / "data"
        self.port = _free_port()
        self.mp = kvfs_mount(CONFIG.format(data=self.data, transport=transport, port=self.port), data=self.data)

    def ops(self, op: str) -> float:
        return scrape(self.port).get(("kvfs_fuse_operations_total", (("op", op),)), 0.0)

    def block_file(self, name: str) -> Path:
        return self.data / "disk" / "blocks" / name

    def to_disk(self, name: str) -> None:
        res = run_kvfs("evict", "--tier", "dram", str(self.mp / name))
        assert res.returncode == 0, res.stderr
        assert os.getxattr(self.mp / name, "user.kvfs.tiers") == b"disk"


def _passthrough_possible() -> str | None:
    if os.geteuid() != 0:
        return "passthrough needs CAP_SYS_ADMIN in the daemon (run as root)"
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    if (major, minor) < (6, 9):
        return "passthrough needs Linux 6.9 or later"
    return None


needs_passthrough = pytest.mark.skipif(_passthrough_possible() is not None, reason=str(_passthrough_possible()))


def read_all(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def flip(path: Path, at: int) -> None:
    """Change one byte of *path* in place (through the filesystem: its ctime moves)."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ 0x5A]))


@needs_passthrough
def test_a_disk_block_is_read_by_the_kernel_and_mmap_works(kvfs_mount, tmp_path):
    m = Mount(kvfs_mount, tmp_path)
    data = blob(3 * MiB + 5, 1)
    (m.mp / "b").write_bytes(data)
    m.to_disk("b")
    assert m.block_file("b").stat().st_size == len(data)  # the file is the payload alone
    reads = m.ops("read")
    assert read_all(m.mp / "b") == data
    with open(m.mp / "b", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        assert mm[:] == data
    assert m.ops("read") == reads  # every byte came from the backing file: no READ reached the daemon
    assert os.getxattr(m.mp / "b", "user.kvfs.tiers") == b"disk"  # and nothing was promoted for it
    assert int(os.getxattr(m.mp / "b", "user.kvfs.hits")) >= 2  # but the reads count as hits


def test_dram_blocks_keep_their_pages_and_read_only_opens_send_no_flush(kvfs_mount, tmp_path):
    m = Mount(kvfs_mount, tmp_path)
    data = blob(2 * MiB, 2)
    (m.mp / "d").write_bytes(data)
    assert read_all(m.mp / "d") == data
    reads, flushes = m.ops("read"), m.ops("flush")
    for _ in range(3):  # the inode keeps its pages across opens: no READ, and no FLUSH at close
        assert read_all(m.mp / "d") == data
    assert m.ops("read") == reads
    assert m.ops("flush") == flushes


def _resident(path: Path) -> int:
    """Bytes of *path* in the kernel's page cache (fincore: mincore of a mapping, which
    reads nothing)."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True, text=True
    )
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.split() else -1


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs fincore (util-linux)")
@pytest.mark.parametrize("transport", ["kernel", "pyfuse3"])
def test_pages_a_writer_covered_in_part_are_kept_too(kvfs_mount, tmp_path, transport):
    """A header of 28 bytes, then the payload: the kernel keeps only pages one write
    covered whole; the daemon puts the others in its page cache once the block is
    sealed, so the first read after the write needs no READ either."""
    m = Mount(kvfs_mount, tmp_path, transport=transport)
    head, body = b"h" * 28, blob(100000, 11)
    with open(m.mp / "hdr", "wb", buffering=0) as f:
        f.write(head)
        f.write(body)
    wait_for(lambda: _resident(m.mp / "hdr") == 25 * 4096, timeout=60)  # every page, the edges too
    reads = m.ops("read")
    assert read_all(m.mp / "hdr") == head + body
    assert m.ops("read") == reads


@needs_passthrough
def test_a_backing_file_corrupted_behind_the_tier_is_never_served(kvfs_mount, tmp_path):
    m = Mount(kvfs_mount, tmp_path)
    data = blob(MiB, 3)
    (m.mp / "c").write_bytes(data)
    m.to_disk("c")
    assert read_all(m.mp / "c") == data  # served from the file (checked when it was written)
    flip(m.block_file("c"), 777)
    with pytest.raises(OSError) as info:  # its only copy is bad: a miss, never wrong bytes
        read_all(m.mp / "c")
    assert info.value.errno == errno.ENOENT
    assert not m.block_file("c").exists()  # dropped (and counted corrupt)


@needs_passthrough
def test_a_backing_file_corrupted_while_a_reader_holds_it_is_not_served_to_the_next(kvfs_mount, tmp_path):
    m = Mount(kvfs_mount, tmp_path)
    data = blob(MiB, 12)
    (m.mp / "h").write_bytes(data)
    m.to_disk("h")
    assert read_all(m.mp / "h") == data  # the inode keeps its backing file after this close
    with open(m.mp / "h", "rb", buffering=0) as holder:  # the kernel reads the file for it
        assert holder.read(4096) == data[:4096]
        flip(m.block_file("h"), 200000)
        with pytest.raises(FileNotFoundError):  # a new open checks it again: bad, dropped
            read_all(m.mp / "h")
    (m.mp / "h").write_bytes(data)  # written again: a new version, a new file
    m.to_disk("h")
    with open(m.mp / "h", "rb", buffering=0) as holder:
        assert holder.read(4096) == data[:4096]
        assert run_kvfs("prefetch", str(m.mp / "h")).returncode == 0  # in DRAM too, now
        flip(m.block_file("h"), 300000)
        # the inode is open in passthrough, so a new open of it would have to use that file:
        # it changed, so the name gets a new inode, served from DRAM
        assert read_all(m.mp / "h") == data
    reads = m.ops("read")
    (m.mp / "h").write_bytes(data)
    m.to_disk("h")
    for _ in range(3):  # its inode keeps the id: the next opens need no file checked
        assert read_all(m.mp / "h") == data
    assert m.ops("read") == reads


@needs_passthrough
def test_a_backing_file_corrupted_while_unmounted_is_checked_before_it_is_served(kvfs_mount, tmp_path):
    m = Mount(kvfs_mount, tmp_path)
    good, bad = blob(MiB, 4), blob(MiB, 5)
    (m.mp / "ok").write_bytes(good)
    (m.mp / "bad").write_bytes(bad)
    m.to_disk("ok")
    m.to_disk("bad")
    assert kvfs_mount.umount(m.mp).returncode == 0
    flip(m.block_file("bad"), 4096 * 3 + 1)  # damaged while no daemon ran
    m.mp = kvfs_mount(kvfs_mount.config_files[m.mp].read_text(), data=m.data, mountpoint=m.mp)
    assert read_all(m.mp / "ok") == good  # read whole once, checked, then served by the kernel
    with pytest.raises(FileNotFoundError):
        read_all(m.mp / "bad")


@needs_passthrough
def test_a_reader_keeps_its_version_when_the_block_is_replaced_or_evicted(kvfs_mount, tmp_path):
    m = Mount(kvfs_mount, tmp_path)
    old, new = blob(2 * MiB, 6), blob(MiB + 7, 7)
    (m.mp / "r").write_bytes(old)
    m.to_disk("r")
    with open(m.mp / "r", "rb", buffering=0) as reader:
        assert reader.read(MiB) == old[:MiB]
        (m.mp / "r").write_bytes(new)  # a new version: a new inode; the old file renamed over
        assert read_all(m.mp / "r") == new
        m.to_disk("r")
        assert read_all(m.mp / "r") == new  # the new version's own backing file
        assert reader.read() == old[MiB:]  # the old reader: its own bytes, its own size
        assert os.fstat(reader.fileno()).st_size == len(old)
    with open(m.mp / "r", "rb", buffering=0) as reader:
        assert reader.read(100) == new[:100]
        res = run_kvfs("evict", "--force", str(m.mp / "r"))  # gone from every tier: its file deleted
        assert res.returncode == 0, res.stderr
        with pytest.raises(FileNotFoundError):
            read_all(m.mp / "r")
        assert reader.read() == new[100:]  # the open reader still reads the whole version


@needs_passthrough
def test_a_block_demoted_or_promoted_while_open_reads_right_in_either_mode(kvfs_mount, tmp_path):
    m = Mount(kvfs_mount, tmp_path)
    data = blob(2 * MiB, 8)
    (m.mp / "p").write_bytes(data)
    with open(m.mp / "p", "rb", buffering=0) as first:  # from DRAM, through the page cache
        assert first.read(4096) == data[:4096]
        m.to_disk("p")  # demoted while open
        # the same inode is open through the page cache: a second open must stay so
        assert read_all(m.mp / "p") == data
        assert first.read() == data[4096:]
    # the kernel sends a RELEASE after close returns: until the daemon has had the three
    # (the write's, read_all's, first's), the inode is still open in page-cache mode and
    # a new open must join that mode (its reads then reach the daemon, rightly)
    wait_for(lambda: m.ops("release") >= 3)
    reads = m.ops("read")
    with open(m.mp / "p", "rb", buffering=0) as second:  # now from the disk file, by the kernel
        assert second.read(MiB) == data[:MiB]
        assert (m.mp / "p").read_bytes() == data
        # promoted to DRAM by a reader outside the mount while the inode is passthrough
        res = run_kvfs("prefetch", str(m.mp / "p"))
        assert res.returncode == 0, res.stderr
        assert read_all(m.mp / "p") == data  # follows the inode's backing file
        assert second.read() == data[MiB:]
    assert m.ops("read") == reads


def test_on_pyfuse3_the_daemon_reads_disk_blocks_and_checks_them(kvfs_mount, tmp_path):
    """The same history on pyfuse3 (no passthrough): the daemon serves every read."""
    m = Mount(kvfs_mount, tmp_path, transport="pyfuse3")
    good, bad = blob(MiB, 9), blob(MiB, 10)
    (m.mp / "y").write_bytes(good)
    (m.mp / "z").write_bytes(bad)
    m.to_disk("y")
    m.to_disk("z")
    assert kvfs_mount.umount(m.mp).returncode == 0  # a remount: no pages of them in the kernel
    flip(m.block_file("z"), 10)
    m.mp = kvfs_mount(kvfs_mount.config_files[m.mp].read_text(), data=m.data, mountpoint=m.mp)
    assert read_all(m.mp / "y") == good
    assert m.ops("read") >= 1
    with pytest.raises(FileNotFoundError):
        read_all(m.mp / "z")
