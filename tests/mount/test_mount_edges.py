"""Writers that die and tiers with no room, on a real mount (issue 20, items 4 and 5).

- A writer killed by a signal publishes nothing of the version it was writing: real
  processes write half a block (after running one subprocess, whose exec closed an
  inherited copy of the descriptor), then die of SIGKILL, SIGTERM or SIGSEGV sent by
  another process; the name keeps its older block, or stays absent. A process that exits
  normally without closing publishes (the kernel's close at exit is a close); a child
  holding an inherited descriptor that is killed does not stop its parent's block.
- No block is accepted and then dropped: when no tier can take a file (larger than DRAM
  with the disk full of pinned blocks; every tier full of pinned blocks) its ``close()``
  fails with ``ENOSPC`` and the name is never published.

docs/SEMANTICS.md lines 42 and 43; docs/mount-internals.md, "Killed writers" and "Room
promised at close".
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.configs import dram_over_disk
from support.files import blob, err, write

pytestmark = pytest.mark.fuse

MiB = 1 << 20

# A writer: opens PATH (O_TRUNC or not), writes HALF bytes of pattern SEED, runs one
# subprocess (its exec closes an inherited copy of the descriptor: a FLUSH), says "ready"
# and then does what it is told: "exit" (os._exit(0) without closing), "finish" (the
# other half, then close), or nothing (it waits to be killed).
WRITER = r"""
import os, random, subprocess, sys
path, total, seed, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
data = random.Random(seed).randbytes(total)
fd = os.open(path, os.O_CREAT | os.O_WRONLY | (os.O_TRUNC if mode == "trunc" else 0), 0o644)
os.set_inheritable(fd, True)
os.write(fd, data[: total // 2])
subprocess.run(["/bin/true"], close_fds=False, check=True)
print("ready", flush=True)
cmd = sys.stdin.readline().strip()
if cmd == "exit":
    os._exit(0)
if cmd == "finish":
    os.write(fd, data[total // 2 :])
    os.close(fd)
    print("done", flush=True)
    sys.stdin.readline()
"""


def start_writer(path: Path, total: int, seed: int, mode: str = "trunc") -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(total), str(seed), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def readable(p: Path) -> bytes | None:
    try:
        with open(p, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def releases(mp: Path) -> int:
    """RELEASEs the daemon of *mp* has answered (``kvfs top``'s FUSE op counts): a file's
    seal, or its end unpublished, is done when its release is counted."""
    from kvfs.client.connection import Connection
    from kvfs.protocol import Top
    from kvfs.runtime import control_socket_path

    with Connection(control_socket_path(mp)) as c:
        return next((o.count for o in c.request(Top()).ops if o.op == "release"), 0)


def released(mp: Path, before: int, n: int = 1, timeout: float = 60.0) -> None:
    """Wait until *n* more RELEASEs than *before* were answered (no condition on time)."""
    deadline = time.monotonic() + timeout
    while releases(mp) < before + n:
        assert time.monotonic() < deadline, "the release did not come"
        time.sleep(0.05)


@pytest.fixture
def mp(kvfs_mount) -> Path:
    return kvfs_mount(dram="32MiB", disk="64MiB")


# -- 42: a writer killed by a signal publishes nothing ------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_s42_a_writer_killed_by_a_signal_publishes_nothing(mp, sig):
    old = blob(2 * MiB, 1)
    write(mp / "old", old)
    for name, mode in (("old", "trunc"), ("old", "append"), ("new", "trunc")):
        proc = start_writer(mp / name, 4 * MiB, 7, mode)
        before = releases(mp)
        proc.send_signal(sig)
        assert proc.wait(30) == -sig
        released(mp, before)  # the killed writer's file has ended (published or not)
        assert readable(mp / "old") == old, (name, mode)  # the older block, whole
        assert readable(mp / "new") is None, (name, mode)  # never published
    assert "new" not in os.listdir(mp)


def test_s42_a_writer_that_exits_without_closing_publishes(mp):
    """exit() closes a process's files like close(): a normal exit publishes."""
    proc = start_writer(mp / "exit", 2 * MiB, 8)
    before = releases(mp)
    proc.stdin.write("exit\n")
    proc.stdin.flush()
    assert proc.wait(30) == 0
    released(mp, before)
    data = blob(2 * MiB, 8)  # the writer's pattern, of which it wrote the first half
    assert readable(mp / "exit") == data[:MiB]


def test_s42_a_killed_child_with_an_inherited_descriptor_does_not_stop_its_parent(mp):
    """The parent writes half, forks a child that keeps the descriptor; the child is
    killed (its descriptor's close is a FLUSH from a dying process that never opened the
    file), the parent writes the rest and closes: the whole block is published."""
    first, second = blob(MiB, 11), blob(MiB, 12)
    fd = os.open(mp / "parent", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, first)
    child = os.fork()
    if child == 0:  # holds the inherited descriptor until killed
        while True:
            time.sleep(60)
    try:
        os.kill(child, signal.SIGKILL)
        _, status = os.waitpid(child, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        os.write(fd, second)  # the file goes on
    finally:
        os.close(fd)
    assert (mp / "parent").read_bytes() == first + second


# The writer opens PATH, writes, forks a child that keeps the descriptor and, once told
# (through a pipe whose write end only the writer holds), tries a write and a close and
# prints their errnos; the writer prints that pipe end's number and waits to be killed.
ORPHANS = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
os.write(fd, b"x" * 100000)
r, w = os.pipe()
if os.fork() == 0:
    os.read(r, 1)
    out = []
    for op in (lambda: os.write(fd, b"y"), lambda: os.close(fd)):
        try:
            op()
            out.append("ok")
        except OSError as exc:
            out.append(str(exc.errno))
    print(*out, flush=True)
    os._exit(0)
print(w, flush=True)
time.sleep(600)
"""


def test_s42_a_killed_writer_fails_the_writes_of_a_child_that_inherited_its_descriptor(mp):
    """The writer opened the file and is killed while a child it forked still holds the
    descriptor: the version is its, so it is not published, and the child's writes and
    close say so (ECANCELED)."""
    parent = subprocess.Popen([sys.executable, "-c", ORPHANS, str(mp / "orphan")], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    wfd = int(parent.stdout.readline())
    before = releases(mp)
    # the child's pipe end lives in the parent only: send the go through /proc before the kill
    go = os.open(f"/proc/{parent.pid}/fd/{wfd}", os.O_WRONLY)
    parent.send_signal(signal.SIGKILL)
    assert parent.wait(30) == -signal.SIGKILL
    os.write(go, b"g")
    os.close(go)
    assert parent.stdout.readline().split() == [str(errno.ECANCELED), str(errno.ECANCELED)]
    released(mp, before)  # the child's close was the last
    assert readable(mp / "orphan") is None


# -- 43: no room anywhere is ENOSPC at close, never a block dropped later -----------------

FULL = dram_over_disk("4MiB", "8MiB", "{data}/disk")

BLOCK = MiB  # a disk copy takes exactly 1 MiB (block format 3: the payload alone; its header is an xattr)


def fill_and_pin(mp: Path, n: int, prefix: str, size: int) -> None:
    for i in range(n):
        write(mp / f"{prefix}{i}", blob(size, 100 + i))
        os.setxattr(mp / f"{prefix}{i}", "user.kvfs.pinned", b"1")


def test_s08_s43_a_block_no_tier_can_take_fails_its_close_with_enospc(kvfs_mount, tmp_path):
    mp = kvfs_mount(FULL.format(data=tmp_path))
    fill_and_pin(mp, 4, "hot", MiB)  # DRAM: 4 pinned blocks fill it
    fill_and_pin(mp, 8, "cold", BLOCK)  # the disk: 8 more fill it (DRAM is full of pinned ones)
    assert {os.getxattr(mp / f"cold{i}", "user.kvfs.tiers") for i in range(8)} == {b"disk"}

    # larger than DRAM, with the disk full: close says ENOSPC, nothing is published
    big = blob(6 * MiB, 5)
    before = releases(mp)
    fd = os.open(mp / "big", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, big)
    assert err(os.close, fd) == errno.ENOSPC
    # every tier full of pinned blocks: a small block too
    fd = os.open(mp / "small", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"s" * 4096)
    assert err(os.close, fd) == errno.ENOSPC
    released(mp, before, 2)
    assert readable(mp / "big") is None and readable(mp / "small") is None
    # a replace that finds no room keeps the older block
    with pytest.raises(OSError) as info, open(mp / "hot0", "wb") as f:
        f.write(b"new")
    assert info.value.errno == errno.ENOSPC
    assert (mp / "hot0").read_bytes() == blob(MiB, 100)

    # every block accepted is there, whole; with room again, writes are accepted again
    for i in range(8):
        assert (mp / f"cold{i}").read_bytes() == blob(BLOCK, 100 + i)
    os.setxattr(mp / "hot1", "user.kvfs.pinned", b"0")
    write(mp / "small", b"s" * 4096)
    assert (mp / "small").read_bytes() == b"s" * 4096


def test_s43_room_promised_at_a_close_is_there_at_the_seal(kvfs_mount, tmp_path):
    """A descriptor closed early promises room; the rest of the file is written through
    another, whose close promises again for the whole: each close that returned 0 is a
    block that is published, even when the tiers fill up in between."""
    mp = kvfs_mount(FULL.format(data=tmp_path))
    fill_and_pin(mp, 4, "hot", MiB)
    fill_and_pin(mp, 6, "cold", BLOCK)  # room for two more blocks on disk
    fds = []
    for i in range(2):
        fd = os.open(mp / f"p{i}", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, blob(BLOCK, 200 + i))
        os.close(os.dup(fd))  # a close: room promised, the file still open
        fds.append(fd)
    fd = os.open(mp / "third", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, blob(BLOCK, 300))
    before = releases(mp)
    assert err(os.close, fd) == errno.ENOSPC  # the two open files hold the last room
    released(mp, before)
    for i, fd in enumerate(fds):
        os.close(fd)
        assert (mp / f"p{i}").read_bytes() == blob(BLOCK, 200 + i)
    assert readable(mp / "third") is None
