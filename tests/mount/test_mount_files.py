"""Descriptor tricks and real programs' file patterns on a real kvfs mount.

Each test names the docs/SEMANTICS.md line it checks (``test_sNN_…``): publication at
the last release (dup, fork, a subprocess started by another thread mid-write),
close-to-open, failed writes, rename and unlink of files still open for writing (the
safetensors, ``NamedTemporaryFile`` and ``TemporaryFile`` patterns, done by hand with os
calls and with the real safetensors), a second open by path while creating (kvcr),
rewrites without ``O_TRUNC`` while readers read (LMCache), huge ``ftruncate``, O_DIRECT.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from support.files import blob, err, renameat2
from support.mounts import TRANSPORTS

pytestmark = [pytest.mark.fuse, TRANSPORTS]

MiB = 1 << 20


def readable(p: Path) -> bytes | None:
    try:
        with open(p, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def daemon_pid(mp: Path) -> int:
    from kvfs.mount.paths import pid_path

    return int(pid_path(mp).read_text())


def rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def aligned(data: bytes) -> mmap.mmap:
    """A page-aligned buffer holding *data* (O_DIRECT needs aligned memory)."""
    m = mmap.mmap(-1, max(len(data), 4096))
    m.write(data)
    return m


@pytest.fixture
def mp(kvfs_mount) -> Path:
    return kvfs_mount(dram="32MiB", disk="64MiB")


# -- 7: sealed at the last release -------------------------------------------------------


def test_s07_a_dup_closed_early_publishes_nothing_and_loses_nothing(mp):
    first, second = blob(MiB, 1), blob(MiB, 2)
    fd = os.open(mp / "dup", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, first)
    os.close(os.dup(fd))  # a FLUSH: not the last close
    assert readable(mp / "dup") is None  # nothing half-written under the real name
    os.write(fd, second)
    os.close(fd)
    assert (mp / "dup").read_bytes() == first + second


def test_s07_a_dup_closed_before_the_first_write_does_not_hold_it(kvfs_mount):
    """``dd of=x`` closes a duplicate before its first write; the kernel asks for the
    file's ``security.capability`` before that write. The answer (there is none) must not
    wait for the release a last close would bring (``release_wait``, 600 s here)."""
    mp = kvfs_mount(env={"KVFS_FUSE_OPTIONS": json.dumps({"release_wait": 600})})
    fd = os.open(mp / "dd", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.close(os.dup(fd))  # a FLUSH: the file is "closing" until a write or its release
    wrote = threading.Event()

    def first_write() -> None:
        os.write(fd, blob(4096, 9))
        wrote.set()

    threading.Thread(target=first_write, daemon=True).start()
    try:
        assert wrote.wait(120), "the first write waited for the release of a duplicate's close"
    finally:
        if wrote.is_set():
            os.close(fd)
    assert (mp / "dd").read_bytes() == blob(4096, 9)


def test_s07_a_forked_child_keeps_the_file_unpublished_until_it_closes(mp):
    first, second = blob(MiB, 3), blob(MiB, 4)
    fd = os.open(mp / "fork", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, first)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child holds the descriptor until told to exit
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    os.write(fd, second)
    os.close(fd)  # not the last close: the child still has it
    time.sleep(1.5)  # longer than the close-to-open wait
    assert readable(mp / "fork") is None
    os.write(w, b"x")  # the child exits: the last close
    os.close(w)
    os.waitpid(pid, 0)
    assert (mp / "fork").read_bytes() == first + second


def test_s07_a_subprocess_started_by_another_thread_mid_write(mp):
    """The child inherits the descriptor for an instant (fork, then close at exec): its
    close is a FLUSH in the middle of the writes, which must neither publish nor drop."""
    parts = [blob(256 * 1024, 10 + i) for i in range(16)]
    fd = os.open(mp / "sub", os.O_CREAT | os.O_WRONLY, 0o644)
    os.set_inheritable(fd, True)  # as a C library or an old Python would leave it
    stop = threading.Event()

    def spawner() -> None:
        while not stop.is_set():
            subprocess.run([sys.executable, "-c", "pass"], close_fds=False, check=True)

    t = threading.Thread(target=spawner)
    t.start()
    try:
        for p in parts:
            os.write(fd, p)
            time.sleep(0.02)
    finally:
        stop.set()
        t.join()
    os.close(fd)
    assert (mp / "sub").read_bytes() == b"".join(parts)


def test_s07_close_to_open_a_reader_right_after_the_close_sees_the_block(mp):
    """Another thread opens the name the moment the writer's close returns, 200 times."""
    os.mkdir(mp / "c2o")
    errors: list[str] = []
    for i in range(200):
        data = blob(4096 + i * 513, i)
        ready = threading.Event()
        got: list[bytes | None] = []

        def reader(p=mp / "c2o" / f"f{i % 20}", ready=ready, got=got) -> None:
            ready.wait()
            got.append(readable(p))

        t = threading.Thread(target=reader)
        t.start()
        with open(mp / "c2o" / f"f{i % 20}", "wb") as f:
            f.write(data)
        ready.set()
        t.join()
        if got[0] != data:
            errors.append(f"round {i}: {None if got[0] is None else len(got[0])} bytes")
    assert not errors, errors[:5]


def test_s07_writes_after_fsync_are_published_at_the_last_close(mp):
    fd = os.open(mp / "fs", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"first")
    os.fsync(fd)
    assert (mp / "fs").read_bytes() == b"first"
    os.write(fd, b"+second")
    assert (mp / "fs").read_bytes() == b"first"  # the newer version is not sealed yet
    os.close(fd)
    assert (mp / "fs").read_bytes() == b"first+second"


def test_s07_s27_xattrs_by_path_right_after_fsync_and_close(mp):
    """fsync publishes a version on its own inode: the writer's dentry may still point at
    the inode it replaced when the next path call comes. Such calls are answered ESTALE,
    so the kernel looks the name up again and the call succeeds (it failed ENOENT for
    one call in five before)."""
    for i in range(200):
        p = mp / f"x{i}"
        fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"x" * 10_000)
        os.fsync(fd)
        os.close(fd)
        os.setxattr(p, "user.kvfs.pinned", b"1")
        assert os.getxattr(p, "user.kvfs.pinned") == b"1"


# -- 11, 13: sizes and bounds ------------------------------------------------------------


def test_s11_truncate_by_path_of_a_file_being_written(mp):
    with open(mp / "t", "wb", buffering=0) as f:
        f.write(b"0123456789")
        os.truncate(mp / "t", 4)
    assert (mp / "t").read_bytes() == b"0123"


def test_s13_huge_ftruncate_allocates_nothing_and_efbig_past_the_largest_block(kvfs_mount):
    mp = kvfs_mount(dram="16MiB", disk="1GiB")
    pid = daemon_pid(mp)
    before = rss_anon(pid)
    fd = os.open(mp / "sparse", os.O_CREAT | os.O_RDWR, 0o644)
    os.ftruncate(fd, 512 * MiB)  # a hole: no memory
    os.pwrite(fd, b"end", 512 * MiB - 3)
    assert rss_anon(pid) - before < 64 * MiB
    assert os.pread(fd, 8, 512 * MiB - 8) == bytes(5) + b"end"
    assert err(os.ftruncate, fd, 1 << 40) == errno.EFBIG  # past the largest block (1 GiB)
    assert err(os.close, fd) == errno.EFBIG  # the failed ftruncate failed the file
    assert readable(mp / "sparse") is None
    # a file of that size that did not fail is sealed, holes and all
    fd = os.open(mp / "sparse2", os.O_CREAT | os.O_RDWR, 0o644)
    os.ftruncate(fd, 40 * MiB)
    os.pwrite(fd, b"mid", 20 * MiB)
    os.close(fd)
    data = (mp / "sparse2").read_bytes()
    assert len(data) == 40 * MiB and data[20 * MiB : 20 * MiB + 3] == b"mid" and data.count(0) == len(data) - 3


def test_s13_write_buffers_are_capped(kvfs_mount):
    mp = kvfs_mount(kvfs_config(kvfs_mount, write_buffer="16MiB"))
    held = os.open(mp / "held", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(held, bytes(10 * MiB))  # stays open: its memory is not freed
    fd = os.open(mp / "more", os.O_CREAT | os.O_WRONLY, 0o644)
    t0 = time.monotonic()
    with pytest.raises(OSError) as info:
        for _ in range(8):
            os.write(fd, bytes(MiB))
    assert info.value.errno == errno.ENOSPC
    assert time.monotonic() - t0 >= 4  # it waited for memory first
    assert err(os.close, fd) == errno.ENOSPC
    os.close(held)
    assert os.stat(mp / "held").st_size == 10 * MiB and readable(mp / "more") is None
    with open(mp / "after", "wb") as f:  # freed: writes go on
        f.write(bytes(8 * MiB))


def kvfs_config(mounter, **mount_keys) -> str:
    from support.configs import DEFAULT_CONFIG

    data = mounter.base / f"data-{len(mounter.mounts) + 1}"
    text = DEFAULT_CONFIG.format(dram="32MiB", disk="64MiB", data=data, allow_other="false")
    return text + "".join(f'{k} = "{v}"\n' for k, v in mount_keys.items())


# -- 14: O_DIRECT, O_TMPFILE ---------------------------------------------------------------


def test_s14_o_direct_reads_and_writes(mp):
    data = blob(3 * MiB, 14)
    fd = os.open(mp / "d", os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    buf = aligned(data)
    assert os.pwrite(fd, buf, 0) == len(data)
    os.close(fd)
    fd = os.open(mp / "d", os.O_RDONLY | os.O_DIRECT)
    out = mmap.mmap(-1, len(data))
    assert os.preadv(fd, [out], 0) == len(data)
    os.close(fd)
    assert out[:] == data
    # vLLM's fs tier probes O_DIRECT on its root before using it
    probe = os.open(mp / ".probe", os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    os.close(probe)
    os.unlink(mp / ".probe")


def test_s14_o_tmpfile_is_refused_and_temporaryfile_falls_back(mp):
    assert err(os.open, mp, os.O_TMPFILE | os.O_RDWR, 0o600) == errno.EOPNOTSUPP
    with tempfile.TemporaryFile(dir=mp) as f:  # mkstemp, then unlink while open
        f.write(b"scratch" * 1000)
        f.seek(0)
        assert f.read() == b"scratch" * 1000
        assert os.listdir(mp) == []
    assert os.listdir(mp) == []


# -- 15: a second open of a file being written ---------------------------------------------


def test_s15_kvcr_slab_create_fchmod_reopen_by_path_odirect(mp):
    slab = mp / "slab0"
    fd = os.open(slab, os.O_RDWR | os.O_CREAT, 0o644)
    os.fchmod(fd, 0o600)
    os.ftruncate(fd, 4 * 4096)
    fd2 = os.open(slab, os.O_RDWR | os.O_DIRECT)  # by path, while the first is open
    for slot in range(4):
        os.pwrite(fd2, aligned(bytes([slot + 1]) * 4096), slot * 4096)
    os.pwrite(fd, b"head", 0)  # the first descriptor writes the same file
    assert os.pread(fd, 4, 4096) == b"\x02" * 4
    os.close(fd2)
    os.close(fd)
    data = slab.read_bytes()
    assert data[:4] == b"head" and data[4:4096] == b"\x01" * 4092
    assert data[4096:] == b"\x02" * 4096 + b"\x03" * 4096 + b"\x04" * 4096


def test_s15_a_second_writer_with_o_trunc_never_mixes_bytes(mp):
    a, b = blob(2 * MiB, 151), blob(2 * MiB, 152)
    fa = open(mp / "race", "wb")
    fa.write(a[:MiB])
    fb = open(mp / "race", "wb")  # O_TRUNC on a file being written: a version of its own
    fb.write(b)
    fa.write(a[MiB:])
    fb.close()
    assert (mp / "race").read_bytes() == b
    fa.close()
    assert (mp / "race").read_bytes() == a  # released last: the name ends with it


# -- 16, 19: rename and unlink of files still open ---------------------------------------


def test_s16_safetensors_pattern_by_hand_rename_while_open(mp):
    """safetensors >= 0.8 save_file: O_RDWR|O_CREAT|O_EXCL temp, ftruncate, write,
    rename while open, close."""
    data = blob(MiB + 17, 16)
    old = blob(1000, 160)
    (mp / "model.safetensors").write_bytes(old)
    reader = open(mp / "model.safetensors", "rb")
    tmp = mp / ".tmpAbC123"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.ftruncate(fd, len(data))
    os.pwrite(fd, data, 0)
    os.rename(tmp, mp / "model.safetensors")
    assert (mp / "model.safetensors").read_bytes() == old  # the target shows its block until the seal
    os.close(fd)
    assert (mp / "model.safetensors").read_bytes() == data
    assert sorted(os.listdir(mp)) == ["model.safetensors"]  # no temp file left behind
    assert reader.read() == old
    reader.close()


def test_s16_named_temporary_file_replace_before_close(mp):
    f = tempfile.NamedTemporaryFile(dir=mp, delete=False)
    f.write(b"payload" * 1000)
    f.flush()
    os.replace(f.name, mp / "final")
    f.write(b"!")  # still the same file, now called "final"
    f.close()
    assert (mp / "final").read_bytes() == b"payload" * 1000 + b"!"
    assert os.listdir(mp) == ["final"]


def test_s16_real_safetensors_save_and_load(mp):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    tensors = {"k": torch.randn(64, 128), "v": torch.arange(4096, dtype=torch.int32)}
    st.save_file(tensors, str(mp / "kv.safetensors"))
    st.save_file(tensors, str(mp / "kv.safetensors"))  # over an existing one
    back = st.load_file(str(mp / "kv.safetensors"))  # mmap
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    assert os.listdir(mp) == ["kv.safetensors"]


def test_s17_rename_noreplace_onto_a_file_being_written(mp):
    (mp / "a").write_bytes(b"a")
    with open(mp / "b", "wb") as f:
        f.write(b"b")
        assert err(renameat2, mp / "a", mp / "b", 1) == errno.EEXIST
    assert (mp / "a").read_bytes() == b"a" and (mp / "b").read_bytes() == b"b"


def test_s19_unlink_while_open_leaves_nothing(mp):
    fd, name = tempfile.mkstemp(dir=mp)
    os.unlink(name)
    os.write(fd, b"gone" * 1000)
    assert os.pread(fd, 4, 0) == b"gone"
    os.close(fd)
    assert os.listdir(mp) == []
    (mp / "x").write_bytes(b"old")
    with open(mp / "x", "wb") as f:  # a replacement being written, then the name unlinked
        f.write(b"new")
        os.unlink(mp / "x")
    assert readable(mp / "x") is None and os.listdir(mp) == []


def test_s21_rmdir_of_a_directory_with_a_file_being_written(mp):
    os.mkdir(mp / "d")
    with open(mp / "d" / "f", "wb") as f:
        f.write(b"f")
        assert err(os.rmdir, mp / "d") == errno.ENOTEMPTY
    assert (mp / "d" / "f").read_bytes() == b"f"


# -- 9, 25: new versions while readers read ------------------------------------------------


def _readers(paths: list[Path], versions: dict[bytes, str], stop: threading.Event, bad: list[str], reads: list[int]):
    """Read the names over and over: every read must be exactly one known version."""

    def loop(p: Path) -> None:
        n = 0
        while not stop.is_set():
            try:
                with open(p, "rb") as f:
                    data = f.read()
                    size = os.fstat(f.fileno()).st_size
            except FileNotFoundError:
                continue
            n += 1
            if data not in versions:
                bad.append(f"{p.name}: {len(data)} bytes that are no version")
            elif size != len(data):
                bad.append(f"{p.name}: fstat says {size} for {len(data)} bytes")
        reads.append(n)

    threads = [threading.Thread(target=loop, args=(p,)) for p in paths for _ in range(2)]
    for t in threads:
        t.start()
    return threads


def test_s09_s25_rewrites_without_o_trunc_while_readers_read(mp):
    """LMCache's re-store after a restart: O_WRONLY|O_CREAT|O_DIRECT, no O_TRUNC, over
    blocks that readers are reading; sizes change too (a version that grows)."""
    names = [mp / f"k{i}.pt" for i in range(3)]
    versions: dict[bytes, str] = {}
    for i, p in enumerate(names):
        v = blob(MiB, 900 + i)
        p.write_bytes(v)
        versions[v] = "v0"
    stop, bad, reads = threading.Event(), [], []
    threads = _readers(names, versions, stop, bad, reads)
    try:
        for r in range(1, 13):
            for i, p in enumerate(names):
                new = blob(MiB + r * 4096, 1000 * r + i)
                versions[new] = f"v{r}"
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
                os.pwrite(fd, aligned(new), 0)
                os.close(fd)
                assert p.read_bytes() == new
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad, bad[:5]
    assert sum(reads) > 20


def test_s25_every_version_has_its_own_inode(mp):
    (mp / "n").write_bytes(b"one" * 1000)
    old = open(mp / "n", "rb")
    ino = os.fstat(old.fileno()).st_ino
    (mp / "n").write_bytes(b"two, longer" * 1000)
    with open(mp / "n", "rb") as new:
        assert os.fstat(new.fileno()).st_ino != ino
        assert new.read() == b"two, longer" * 1000
    assert os.fstat(old.fileno()).st_size == 3000 and old.read() == b"one" * 1000
    old.close()
