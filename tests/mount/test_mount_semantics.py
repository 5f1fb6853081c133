"""docs/SEMANTICS.md, line by line, on a real kvfs mount (test names carry the numbers),
plus the behaviours issue 3 asks to see: concurrent writers, spill to disk, eviction to
ENOENT, remount after umount, du/ls agreement, the mount/umount command errors."""

from __future__ import annotations

import errno
import mmap
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.cli import run_kvfs
from support.configs import dram_over_disk
from support.deadlines import DEADLINE
from support.files import blob, err, renameat2, write
from support.mounts import TRANSPORTS

pytestmark = [pytest.mark.fuse, TRANSPORTS]

MiB = 1 << 20


def wait_for(pred, timeout=DEADLINE):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def sealed(p: Path) -> bool:
    """True once *p*'s last close is sealed (its tiers are known; ENOATTR while it is being written)."""
    try:
        return bool(os.getxattr(p, "user.kvfs.tiers"))
    except OSError as e:
        if e.errno != errno.ENODATA:
            raise
        return False


def exited(pid: int) -> bool:
    """True once process *pid* is gone or a zombie (nobody may reap the daemon here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def mp(kvfs_mount) -> Path:
    return kvfs_mount()


# -- reading ----------------------------------------------------------------------------


def test_s01_stat_true_size_blocks_mode_owner(mp):
    sizes = {"a": 0, "b": 1, "c": 4097, "d": 3 * MiB + 5}
    for name, n in sizes.items():
        write(mp / name, blob(n, n))
    os.mkdir(mp / "dir")
    for name, n in sizes.items():
        st = os.stat(mp / name)
        assert st.st_size == n
        assert st.st_blocks == (n + 511) // 512
        assert oct(st.st_mode) == oct(0o100644)
        assert st.st_nlink == 1
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
        assert abs(st.st_mtime - time.time()) < 60
    d = os.stat(mp / "dir")
    assert oct(d.st_mode) == oct(0o040755) and d.st_nlink == 1
    du = subprocess.run(["du", "-sb", str(mp)], capture_output=True, text=True, check=True)
    assert int(du.stdout.split()[0]) == sum(sizes.values())
    ls = subprocess.run(["ls", "-ln", str(mp)], capture_output=True, text=True, check=True).stdout
    listed = {line.split()[-1]: int(line.split()[4]) for line in ls.splitlines()[1:] if line.startswith("-")}
    assert listed == sizes


def test_s02_readers_keep_their_bytes(mp):
    old, new = blob(MiB, 1), blob(MiB, 2)
    for name in ("replaced", "renamed_over", "unlinked"):
        write(mp / name, old)
    readers = {name: open(mp / name, "rb") for name in ("replaced", "renamed_over", "unlinked")}
    for f in readers.values():
        assert f.read(10) == old[:10]
    write(mp / "replaced", new)
    write(mp / "src", new)
    os.replace(mp / "src", mp / "renamed_over")
    os.unlink(mp / "unlinked")
    for name, f in readers.items():
        assert f.read() == old[10:], name
        f.close()
    assert (mp / "replaced").read_bytes() == new
    assert (mp / "renamed_over").read_bytes() == new


def test_s03_missing_is_enoent(mp):
    assert err(os.stat, mp / "nope") == errno.ENOENT
    assert err(open, mp / "nope", "rb") == errno.ENOENT
    assert err(os.listdir, mp / "nodir") == errno.ENOENT


def test_s04_mmap_and_numpy_memmap(mp):
    np = pytest.importorskip("numpy")
    arr = np.arange(1 << 18, dtype=np.float32)
    write(mp / "t.bin", arr.tobytes())
    mm = np.memmap(mp / "t.bin", dtype=np.float32, mode="r")
    assert np.array_equal(mm, arr)
    del mm
    with open(mp / "t.bin", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[-8:] == arr.tobytes()[-8:]


def test_s05_a_file_being_written_is_listed_but_not_readable(mp):
    write(mp / "old", b"old block")
    with open(mp / "w", "wb") as f, open(mp / "old", "r+b") as r:
        f.write(b"x" * 1000)
        f.flush()
        r.write(b"new")  # a new version of "old", not sealed yet
        r.flush()
        assert err(open, mp / "w", "rb") == errno.ENOENT  # no block yet: never part of one
        assert os.stat(mp / "w").st_size == 1000  # but the name is there, as on a local disk
        assert "w" in os.listdir(mp)
        assert (mp / "old").read_bytes() == b"old block"  # a name being replaced shows the old block
    assert (mp / "w").read_bytes() == b"x" * 1000
    assert (mp / "old").read_bytes() == b"new block"


# -- writing ----------------------------------------------------------------------------


def test_s06_random_writes_and_readback_while_creating(mp):
    with open(mp / "r", "w+b") as f:
        f.seek(3 * MiB)
        f.write(b"tail")
        f.seek(100)
        f.write(b"middle")
        f.seek(0)
        head = f.read(106)
        assert head == bytes(100) + b"middle"
        os.ftruncate(f.fileno(), 3 * MiB + 2)
    data = (mp / "r").read_bytes()
    assert len(data) == 3 * MiB + 2
    assert data[100:106] == b"middle" and data[-2:] == b"ta" and data.count(0) == len(data) - 8
    excl = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    assert err(os.open, mp / "r", excl) == errno.EEXIST  # a block
    fd = os.open(mp / "new", excl, 0o600)
    try:
        assert err(os.open, mp / "new", excl) == errno.EEXIST  # a file being written
    finally:
        os.close(fd)


def test_s07_close_seals_and_fsync_publishes(mp):
    fd = os.open(mp / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"abc")
    os.fsync(fd)
    assert (mp / "f").read_bytes() == b"abc"
    os.close(fd)
    assert (mp / "f").read_bytes() == b"abc"


def test_s08_a_failed_write_publishes_nothing_and_fsync_reports_enospc(kvfs_mount):
    mp = kvfs_mount(dram="1MiB", disk="2MiB")
    block = blob(1000 * 1024, 8)
    for name in "abc":
        write(mp / name, block)
        os.setxattr(mp / name, "user.kvfs.pinned", b"1")
    # every tier is full of pinned blocks: fsync reports the seal's ENOSPC
    fd = os.open(mp / "d", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, block)
    assert err(os.fsync, fd) == errno.ENOSPC
    assert err(os.close, fd) == errno.ENOSPC  # close promises the seal room, and there is none (line 43)
    assert err(open, mp / "d", "rb") == errno.ENOENT
    for name in "abc":
        assert (mp / name).read_bytes() == block
        os.setxattr(mp / name, "user.kvfs.pinned", b"0")
    # a write past the largest block (2 MiB here) fails the file: close reports it, the
    # name keeps its older block, and nothing of the failed version is published
    write(mp / "big", b"older")
    fd = os.open(mp / "big", os.O_WRONLY | os.O_TRUNC)
    n = os.write(fd, bytes(3 * MiB))  # the kernel reports the part that was taken
    assert n <= 2 * MiB
    assert err(os.write, fd, bytes(10)) == errno.EFBIG  # and every later write fails too
    assert err(os.fsync, fd) == errno.EFBIG
    assert err(os.close, fd) == errno.EFBIG
    assert (mp / "big").read_bytes() == b"older"


def test_s09_writing_without_o_trunc_starts_from_the_old_bytes(mp):
    old = blob(3 * MiB, 9)
    write(mp / "s", old)
    reader = open(mp / "s", "rb")
    head = reader.read(10)
    fd = os.open(mp / "s", os.O_WRONLY)  # no O_TRUNC: a new version from the old bytes
    os.pwrite(fd, b"NEW", MiB)
    assert (mp / "s").read_bytes() == old  # not replaced before it is sealed
    os.close(fd)
    assert (mp / "s").read_bytes() == old[:MiB] + b"NEW" + old[MiB + 3 :]
    with open(mp / "s", "ab") as f:  # O_APPEND: the old bytes and then the new ones
        f.write(b"tail")
    assert (mp / "s").read_bytes()[-7:] == old[-3:] + b"tail"
    assert head + reader.read() == old  # the reader kept its version, whole
    reader.close()


def test_s10_o_trunc_replaces_atomically_on_close(mp):
    old, new = blob(2 * MiB, 3), blob(MiB, 4)
    write(mp / "k", old)
    reader = open(mp / "k", "rb")
    with open(mp / "k", "wb") as w:
        w.write(new)
        assert (mp / "k").read_bytes() == old  # not replaced before close
    assert (mp / "k").read_bytes() == new
    assert os.stat(mp / "k").st_size == len(new)
    assert reader.read() == old
    reader.close()


def test_s11_truncate_sealed_is_eperm(mp):
    write(mp / "t", b"1234")
    assert err(os.truncate, mp / "t", 0) == errno.EPERM
    assert (mp / "t").read_bytes() == b"1234"


def test_s12_chmod_accepted_chown_to_the_owner_only_utime_accepted(mp):
    write(mp / "m", b"x")
    os.chmod(mp / "m", 0o600)  # accepted, changes nothing
    assert oct(os.stat(mp / "m").st_mode) == oct(0o100644)
    with open(mp / "n", "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # kvcr does this to its new slab files
        os.fchown(f.fileno(), os.getuid(), os.getgid())
        f.write(b"n")
    os.chown(mp / "m", os.getuid(), -1)
    assert err(os.chown, mp / "m", os.getuid() + 1234, -1) == errno.EPERM
    assert err(os.chown, mp / "m", -1, os.getgid() + 1234) == errno.EPERM
    os.utime(mp / "m")
    subprocess.run(["touch", str(mp / "m")], check=True)
    assert (mp / "m").read_bytes() == b"x" and (mp / "n").read_bytes() == b"n"


# -- namespace --------------------------------------------------------------------------


def test_s16_rename_and_temp_then_replace(mp):
    write(mp / "x.tmp", b"v1")
    os.replace(mp / "x.tmp", mp / "x")
    assert (mp / "x").read_bytes() == b"v1" and not (mp / "x.tmp").exists()
    os.makedirs(mp / "d1/d2")
    write(mp / "y.tmp", b"v2")
    os.replace(mp / "y.tmp", mp / "x")
    assert (mp / "x").read_bytes() == b"v2"
    os.rename(mp / "x", mp / "d1/d2/x")
    assert (mp / "d1/d2/x").read_bytes() == b"v2"
    assert sorted(os.listdir(mp)) == ["d1"]


def test_s17_rename_flags(mp):
    write(mp / "a", b"a")
    write(mp / "b", b"b")
    assert err(renameat2, mp / "a", mp / "b", 1) == errno.EEXIST  # RENAME_NOREPLACE
    assert err(renameat2, mp / "a", mp / "b", 2) == errno.EINVAL  # RENAME_EXCHANGE
    renameat2(mp / "a", mp / "c", 1)
    assert (mp / "c").read_bytes() == b"a" and (mp / "b").read_bytes() == b"b"


def test_s18_rename_directory_is_exdev_and_mv_copies(mp):
    os.makedirs(mp / "d/e")
    write(mp / "d/e/f", b"f")
    assert err(os.rename, mp / "d", mp / "d2") == errno.EXDEV
    subprocess.run(["mv", str(mp / "d"), str(mp / "d2")], check=True)
    assert (mp / "d2/e/f").read_bytes() == b"f"


def test_s19_unlink_removes_from_every_tier(kvfs_mount, tmp_path):
    mp = kvfs_mount(dram="2MiB")
    data = kvfs_mount.config_files[mp].read_text().split('path = "')[1].split('"')[0]
    for i in range(4):  # the first ones spill to disk
        write(mp / f"u{i}", blob(MiB, i))
        # Each seal before the next close: a 1 MiB seal into a 2 MiB DRAM runs in a worker
        # thread, and the next close promises its room at once. Under load a later close came
        # while u0 and u1 were still unsealed: DRAM was all promised (reserved, nothing to
        # evict), so u2 and u3 were promised disk and u0 was never demoted.
        wait_for(lambda p=mp / f"u{i}": sealed(p))
    # the demotion's file appears before the store commits the copy (two-phase move)
    wait_for(
        lambda: os.path.exists(f"{data}/blocks/u0") and "disk" in os.getxattr(mp / "u0", "user.kvfs.tiers").decode()
    )
    os.unlink(mp / "u0")
    assert not os.path.exists(f"{data}/blocks/u0")
    assert err(os.stat, mp / "u0") == errno.ENOENT
    assert err(os.unlink, mp / "u0") == errno.ENOENT
    os.mkdir(mp / "dd")
    assert err(os.unlink, mp / "dd") == errno.EISDIR


def test_s20_mkdir(mp):
    os.makedirs(mp / "a/b/c")
    os.makedirs(mp / "a/b/c", exist_ok=True)
    assert err(os.mkdir, mp / "a/b") == errno.EEXIST
    write(mp / "blk", b"1")
    assert err(os.mkdir, mp / "blk") == errno.EEXIST
    assert err(os.mkdir, mp / "blk/sub") == errno.ENOTDIR
    assert os.path.isdir(mp / "a/b/c")


def test_s21_rmdir(mp):
    os.makedirs(mp / "e/f")
    write(mp / "e/f/g", b"g")
    assert err(os.rmdir, mp / "e/f") == errno.ENOTEMPTY
    assert err(os.rmdir, mp / "e/f/g") == errno.ENOTDIR
    assert err(os.rmdir, mp / "missing") == errno.ENOENT
    os.unlink(mp / "e/f/g")
    os.rmdir(mp / "e/f")
    os.rmdir(mp / "e")
    assert os.listdir(mp) == []


def test_s22_readdir_large_directory(mp):
    os.mkdir(mp / "big")
    names = {f"{i:05d}-{'x' * 40}" for i in range(3000)}
    for n in names:
        write(mp / "big" / n, b"")
    listed = os.listdir(mp / "big")
    assert len(listed) == len(names) and set(listed) == names
    with os.scandir(mp / "big") as it:
        entries = [e.name for e in it if e.is_file()]
    assert sorted(entries) == sorted(names)
    out = subprocess.run(["ls", "-f", str(mp / "big")], capture_output=True, text=True, check=True).stdout.split()
    assert set(out) - {".", ".."} == names


def test_s23_name_too_long(mp):
    assert err(open, mp / ("n" * 256), "wb") == errno.ENAMETOOLONG
    write(mp / ("n" * 255), b"ok")
    assert (mp / ("n" * 255)).read_bytes() == b"ok"


def test_s24_symlink_link_mknod_eperm(mp):
    write(mp / "t", b"t")
    assert err(os.symlink, "t", mp / "sl") == errno.EPERM
    assert err(os.link, mp / "t", mp / "hl") == errno.EPERM
    assert err(os.mkfifo, mp / "fifo") == errno.EPERM


# -- xattrs and statfs ------------------------------------------------------------------


def test_s26_to_s30_xattrs(kvfs_mount):
    from kvfs.blockfile import checksum

    mp = kvfs_mount(dram="2MiB")
    data = blob(MiB + 3, 22)
    write(mp / "x", data)
    assert os.getxattr(mp / "x", "user.kvfs.tiers") == b"dram"
    for i in range(3):  # push x down to disk
        write(mp / f"fill{i}", blob(MiB, 100 + i))
    os.getxattr(mp / "fill2", "user.kvfs.tiers")  # an operation on fill2 waits for its seal
    assert os.getxattr(mp / "x", "user.kvfs.tiers") == b"disk"
    # promoted (a read through the store; the kernel reading the disk file itself, line 34,
    # promotes nothing): now in both, hottest first
    assert run_kvfs("prefetch", str(mp / "x")).returncode == 0
    assert os.getxattr(mp / "x", "user.kvfs.tiers") == b"dram,disk"
    assert err(os.setxattr, mp / "x", "user.kvfs.tiers", b"disk") == errno.EPERM
    assert err(os.removexattr, mp / "x", "user.kvfs.tiers") == errno.EPERM
    # 27: pinned
    assert os.getxattr(mp / "x", "user.kvfs.pinned") == b"0"
    os.setxattr(mp / "x", "user.kvfs.pinned", b"1")
    assert os.getxattr(mp / "x", "user.kvfs.pinned") == b"1"
    assert err(os.setxattr, mp / "x", "user.kvfs.pinned", b"yes") == errno.EINVAL
    os.removexattr(mp / "x", "user.kvfs.pinned")
    assert os.getxattr(mp / "x", "user.kvfs.pinned") == b"0"
    # 28: hits
    hits = int(os.getxattr(mp / "x", "user.kvfs.hits"))
    (mp / "x").read_bytes()
    (mp / "x").read_bytes()
    assert int(os.getxattr(mp / "x", "user.kvfs.hits")) == hits + 2
    assert err(os.setxattr, mp / "x", "user.kvfs.hits", b"0") == errno.EPERM
    # 29: checksum
    assert os.getxattr(mp / "x", "user.kvfs.checksum").decode() == f"xxh3-64:{checksum(data):016x}"
    # 30: listing and unknown attributes
    assert sorted(os.listxattr(mp / "x")) == sorted(
        ["user.kvfs.tiers", "user.kvfs.pinned", "user.kvfs.hits", "user.kvfs.checksum"]
    )
    os.mkdir(mp / "d")
    assert os.listxattr(mp / "d") == []
    assert err(os.getxattr, mp / "x", "user.other") == errno.ENODATA
    assert err(os.setxattr, mp / "x", "user.other", b"1") == errno.ENOTSUP
    subprocess.run(["getfattr", "-d", str(mp / "x")], capture_output=True)  # tools do not choke


def test_s31_parent_xattr_set_before_seal(mp):
    write(mp / "p0", b"root")
    with open(mp / "p1", "wb") as f:
        f.write(b"child")
        os.setxattr(f.fileno(), "user.kvfs.parent", b"p0")
        assert err(os.setxattr, f.fileno(), "user.kvfs.parent", b"../x") == errno.EINVAL
    assert os.getxattr(mp / "p1", "user.kvfs.parent") == b"p0"
    assert err(os.getxattr, mp / "p0", "user.kvfs.parent") == errno.ENODATA
    assert err(os.setxattr, mp / "p1", "user.kvfs.parent", b"p0") == errno.EPERM  # sealed


def test_s33_statfs_reports_tier_capacity(mp):
    before = os.statvfs(mp)
    assert before.f_frsize == 4096 and before.f_namemax == 255
    assert before.f_blocks * before.f_frsize == 8 * MiB + 32 * MiB
    write(mp / "f", bytes(4 * MiB))
    # statfs names no file, so close-to-open does not hold it back: the release that seals
    # f may come after close returned (half the time on a loaded machine). An operation on
    # the name that reaches the daemon waits for the seal (a stat may be the kernel's cache)
    os.getxattr(mp / "f", "user.kvfs.tiers")
    after = os.statvfs(mp)
    assert before.f_bfree - after.f_bfree >= (4 * MiB) // 4096
    df = subprocess.run(["df", "-B1", str(mp)], capture_output=True, text=True, check=True).stdout
    assert str(40 * MiB) in df


# -- capacity, tiers, lifecycle ---------------------------------------------------------


def test_s34_spill_to_disk_then_evict_to_enoent(mp):
    n = 2 * MiB - 8192
    written = {}
    for i in range(5):  # 8 MiB of DRAM holds four: the fifth pushes the first to disk
        written[f"b{i}"] = blob(n, i)
        write(mp / f"b{i}", written[f"b{i}"])
    os.getxattr(mp / "b4", "user.kvfs.tiers")  # an operation on b4 waits for its seal
    tiers = {k: os.getxattr(mp / k, "user.kvfs.tiers").decode() for k in written}
    assert any("disk" in t for t in tiers.values()), tiers
    for k, v in written.items():
        assert (mp / k).read_bytes() == v
    # beyond all capacity (40 MiB): the least recently used blocks are evicted
    for i in range(5, 26):
        written[f"b{i}"] = blob(n, i)
        write(mp / f"b{i}", written[f"b{i}"])

    def readable(k: str) -> bool:  # open, not stat: the kernel caches names for a second
        try:
            with open(mp / k, "rb"):
                return True
        except FileNotFoundError:
            return False

    gone = [k for k in written if not readable(k)]
    assert gone and "b25" not in gone
    assert gone == sorted(gone, key=lambda k: int(k[1:]))[: len(gone)]  # oldest first (LRU)
    for k in written:  # noqa: PLC0206 - a list of keys
        if k in gone:
            assert err(open, mp / k, "rb") == errno.ENOENT
        else:
            assert (mp / k).read_bytes() == written[k]


def test_s35_umount_flushes_and_remount_finds_every_block(kvfs_mount, tmp_path):
    data = tmp_path / "persist"
    mp = kvfs_mount(data=data)
    blocks = {f"ns/{i:02x}/blk{i}": blob(300_000 + i, i) for i in range(12)}
    for name, b in blocks.items():
        (mp / name).parent.mkdir(parents=True, exist_ok=True)
        write(mp / name, b)
    res = kvfs_mount.umount(mp)
    assert res.returncode == 0, res.stderr
    assert run_kvfs("umount", str(mp)).returncode != 0  # no longer mounted
    mp2 = kvfs_mount(data=data, mountpoint=mp)
    for name, b in blocks.items():
        assert (mp2 / name).read_bytes() == b
        assert os.getxattr(mp2 / name, "user.kvfs.tiers") in (b"disk", b"dram,disk")
    # fusermount3 -u flushes just as well: the daemon writes DRAM down before it exits
    from kvfs.mount.paths import pid_path

    write(mp2 / "late", b"late")
    pid = int(pid_path(mp2).read_text())
    subprocess.run(["fusermount3", "-u", str(mp2)], check=True)
    wait_for(lambda: exited(pid))  # its flush is over (not merely the file's rename)
    assert any(p.name == "late" for p in (data / "disk/blocks").iterdir())
    mp3 = kvfs_mount(data=data, mountpoint=mp)
    assert (mp3 / "late").read_bytes() == b"late"


def test_s35_foreground_sigterm_flushes(kvfs_mount, tmp_path):
    data = tmp_path / "fg"
    mp = kvfs_mount(data=data, foreground=True)
    write(mp / "fgblock", b"kept")
    proc = kvfs_mount.foreground[mp]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=DEADLINE) == 0
    from kvfs.mount.daemon import mount_type

    assert mount_type(mp) is None
    mp2 = kvfs_mount(data=data, mountpoint=mp)
    assert (mp2 / "fgblock").read_bytes() == b"kept"


def test_s36_permissions_and_allow_other(kvfs_mount):
    mp = kvfs_mount(allow_other=True)
    opts = next(line for line in open("/proc/self/mountinfo") if f" {mp} " in line)
    assert "allow_other" in opts and "default_permissions" in opts and "fuse.kvfs" in opts
    write(mp / "f", b"1")
    assert os.stat(mp / "f").st_uid == os.getuid()


def test_s37_mount_refusals_leave_nothing_mounted(kvfs_mount, tmp_path):
    from kvfs.mount.daemon import mount_type

    good = tmp_path / "good.toml"
    good.write_text(dram_over_disk("4MiB", "8MiB", f"{tmp_path}/d"))
    missing = tmp_path / "missing"
    res = run_kvfs("mount", str(missing), "--config", str(good))
    assert res.returncode != 0 and "does not exist" in res.stderr
    afile = tmp_path / "afile"
    afile.write_text("x")
    res = run_kvfs("mount", str(afile), "--config", str(good))
    assert res.returncode != 0 and "not a directory" in res.stderr
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    res = run_kvfs("mount", str(full), "--config", str(good))
    assert res.returncode != 0 and "not empty" in res.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[[tiers]]\nkind = "dram"\ncapacity = "lots"\n')
    empty = tmp_path / "empty"
    empty.mkdir()
    res = run_kvfs("mount", str(empty), "--config", str(bad))
    assert res.returncode != 0 and "tiers[0].capacity" in res.stderr
    assert mount_type(empty) is None
    mp = kvfs_mount()
    res = run_kvfs("mount", str(mp), "--config", str(good))
    assert res.returncode != 0 and "already mounted" in res.stderr
    for p in (missing, afile, full, empty):
        assert mount_type(p) is None


def test_s37_umount_cleans_up_a_stale_mount(kvfs_mount):
    from kvfs.mount.daemon import mount_type
    from kvfs.mount.paths import pid_path

    mp = kvfs_mount()
    write(mp / "f", b"f")
    pid = int(pid_path(mp).read_text())
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: exited(pid))
    res = run_kvfs("umount", str(mp))
    assert res.returncode == 0, res.stderr
    assert "stale" in res.stderr
    assert mount_type(mp) is None


# -- concurrency ------------------------------------------------------------------------


def test_many_files_by_several_threads_byte_exact(mp):
    os.mkdir(mp / "par")

    def work(t: int) -> None:
        mine = {}
        for i in range(40):
            data = blob(16 * 1024 + t * 977 + i, t * 1000 + i)
            p = mp / "par" / f"t{t}-{i}"
            write(p, data)
            mine[p] = data
        for p, data in mine.items():
            assert p.read_bytes() == data

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(work, range(8)))
    assert len(os.listdir(mp / "par")) == 320
