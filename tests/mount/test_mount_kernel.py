"""kvfs's own FUSE session layer (``kvfs.mount.kernel``) on a real kernel.

A small filesystem (the ``kvfs bench fuse`` ceiling, with a recorder of what its handlers
see) is served by the kernel transport in a subprocess: mounted with ``mount(2)`` or
through fusermount3's descriptor passing, asked with large requests, and every handler —
``flush``, ``release``, ``read`` and ``write`` included — knows the process it serves.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvfs.mount.daemon import mount_type

from support.mounts import fuse_missing

pytestmark = pytest.mark.fuse

MiB = 1 << 20

RECORDER = textwrap.dedent(
    """
    import json, os, sys, trio
    from kvfs.mount import context
    from kvfs.mount.ceiling import CeilingOperations
    from kvfs.mount.kernel.device import MountSpec
    from kvfs.mount.kernel.session import Session

    seen = {"pids": {}, "write_sizes": []}

    class Recording(CeilingOperations):
        def _note(self, op):
            ctx = context.current()
            seen["pids"].setdefault(op, []).append(None if ctx is None else ctx.pid)

        async def write(self, fh, off, buf):
            self._note("write")
            seen["write_sizes"].append(len(buf))
            return await super().write(fh, off, buf)

        async def read(self, fh, off, size):
            self._note("read")
            return await super().read(fh, off, size)

        async def flush(self, fh, pid=None):
            self._note("flush")

        async def release(self, fh):
            self._note("release")

    mountpoint, out, helper = sys.argv[1], sys.argv[2], sys.argv[3] == "helper"
    s = Session(Recording(), MountSpec(fsname="kvfs-test", subtype="kvfs-test"))
    s.mount(os.path.realpath(mountpoint), helper=helper)
    try:
        trio.run(s.serve)
    finally:
        s.close(unmount=False)
        with open(out, "w") as f:
            json.dump({"seen": seen, "max_write": s.max_write, "passthrough": s.passthrough}, f)
    """
)


@pytest.fixture
def served(tmp_path):
    """``start(helper=False)``: serve the recorder at a fresh mountpoint; returns it.
    ``stop()``: unmount (fusermount3 -u) and return what the recorder saw."""
    reason = fuse_missing()
    if reason:
        pytest.skip(reason)
    mp = tmp_path / "mnt"
    mp.mkdir()
    out = tmp_path / "seen.json"
    procs: list[subprocess.Popen] = []

    class Served:
        def start(self, helper: bool = False) -> Path:
            proc = subprocess.Popen(
                [sys.executable, "-c", RECORDER, str(mp), str(out), "helper" if helper else "direct"],
                stderr=subprocess.PIPE,
            )
            procs.append(proc)
            deadline = time.monotonic() + 60
            while mount_type(mp) != "fuse.kvfs-test":
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"the recorder did not mount: {proc.stderr.read().decode() if proc.stderr else ''}"
                    )
                time.sleep(0.05)
            return mp

        def stop(self) -> dict:
            res = subprocess.run(["fusermount3", "-u", str(mp)], capture_output=True, text=True)
            assert res.returncode == 0, res.stderr
            assert procs[-1].wait(timeout=60) == 0  # the kernel ended the session: serve() returned
            return json.loads(out.read_text())

    yield Served()
    for p in procs:
        if p.poll() is None:
            subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
            p.kill()
            p.wait(timeout=30)


@pytest.mark.parametrize("helper", [False, True], ids=["mount(2)", "fusermount3"])
def test_mount_serve_and_unmount(served, helper):
    if not helper and os.geteuid() != 0:
        pytest.skip("mount(2) needs root")
    if helper and shutil.which("fusermount3") is None:
        pytest.skip("needs fusermount3")
    mp = served.start(helper=helper)
    (mp / "d").mkdir()
    data = os.urandom(3 * MiB + 17)
    (mp / "d" / "f").write_bytes(data)
    assert (mp / "d" / "f").read_bytes() == data
    assert sorted(os.listdir(mp / "d")) == ["f"]
    os.rename(mp / "d" / "f", mp / "d" / "g")
    assert os.stat(mp / "d" / "g").st_size == len(data)
    seen = served.stop()
    assert mount_type(mp) is None
    assert seen["seen"]["write_sizes"]


def test_every_handler_knows_its_requester_and_requests_are_large(served):
    mp = served.start()
    me = os.getpid()
    with open(mp / "big", "wb", buffering=0) as f:
        f.write(os.urandom(4 * MiB))
    with open(mp / "big", "rb", buffering=0) as f:
        assert len(f.read()) == 4 * MiB
    seen = served.stop()
    pids = seen["seen"]["pids"]
    for op in ("write", "flush"):  # pyfuse3 gives these handlers no context at all
        assert pids[op] and set(pids[op]) == {me}, (op, pids[op])
    assert pids["release"] and all(p in (me, 0) for p in pids["release"])  # the kernel's async release: 0 or us
    limit = (
        int(Path("/proc/sys/fs/fuse/max_pages_limit").read_text())
        if os.path.exists("/proc/sys/fs/fuse/max_pages_limit")
        else 256
    )
    want = min(limit, 256) * 4096
    assert seen["max_write"] == want
    assert max(seen["seen"]["write_sizes"]) == want  # 1 MiB requests, not libfuse's 128 KiB


FALLBACK = textwrap.dedent(
    """
    import json, os, sys, trio
    from kvfs.config import Transport
    from kvfs.mount.ceiling import CeilingOperations
    from kvfs.mount.daemon import mount_type
    from kvfs.mount.kernel import abi
    from kvfs.mount.kernel.device import MountFailed, MountSpec
    from kvfs.mount.transport import open_transport

    mp, kind = os.path.realpath(sys.argv[1]), sys.argv[2]
    abi.MIN_MINOR = abi.KERNEL_MINOR + 1000  # this kernel is then too old for the transport: INIT gets EPROTO

    def mounts():
        with open("/proc/self/mountinfo") as f:
            return sum(1 for line in f if line.split(" ")[4] == mp)

    try:
        t = open_transport(Transport(kind), CeilingOperations(), mp, MountSpec(fsname="kvfs-test", subtype="kvfs-test"))
    except MountFailed as exc:
        print(json.dumps({"failed": exc.errno, "message": str(exc), "mounts": mounts()}))
        sys.exit(0)
    result = {"name": t.name, "mounts": mounts(), "type": mount_type(mp)}

    def use():
        with open(os.path.join(mp, "f"), "wb") as f:
            f.write(b"x" * 5000)
        with open(os.path.join(mp, "f"), "rb") as f:
            return f.read()

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(t.serve)
            result["read"] = len(await trio.to_thread.run_sync(use))
            n.cancel_scope.cancel()

    trio.run(main)
    t.close(unmount=True)
    result["mounts_after"] = mounts()
    print(json.dumps(result))
    """
)


@pytest.mark.parametrize("kind", ["auto", "kernel"])
def test_auto_falls_back_to_pyfuse3_where_the_kernel_refuses_the_protocol(tmp_path, kind):
    """A kernel whose FUSE protocol is older than the transport needs (simulated by
    raising the transport's minimum above this kernel's, so the real INIT is refused with
    EPROTO): ``auto`` leaves nothing of that attempt mounted and serves on pyfuse3;
    ``kernel`` fails with a message that names the fix."""
    reason = fuse_missing()
    if reason:
        pytest.skip(reason)
    mp = tmp_path / "mnt"
    mp.mkdir()
    proc = subprocess.run([sys.executable, "-c", FALLBACK, str(mp), kind], capture_output=True, text=True, timeout=300)
    try:
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        if mount_type(mp) is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
    if kind == "auto":
        assert got == {"name": "pyfuse3", "mounts": 1, "type": "fuse.kvfs-test", "read": 5000, "mounts_after": 0}
    else:
        assert got["failed"] == 71 and 'transport = "pyfuse3"' in got["message"], got
        assert got["mounts"] == 0


def test_readdirplus_entries_packed_as_the_kernel_reads_them():
    """``DirBuffer`` (the kernel transport's READDIRPLUS reply): each entry a
    ``fuse_entry_out`` and a ``fuse_dirent`` with the name padded to 8 bytes with zeros,
    filled across its growth up to the size the kernel asked for and not a byte past it."""
    import pyfuse3

    from kvfs.mount.kernel import abi
    from kvfs.mount.kernel.encode import DirBuffer

    size = 200_000  # past the first buffer (64 KiB): the buffer grows while filled
    buf = DirBuffer(size)
    sent = []
    while True:
        i = len(sent)
        a = pyfuse3.EntryAttributes()
        a.st_ino, a.st_mode, a.st_size, a.st_nlink = 1000 + i, 0o40755 if i % 5 == 0 else 0o100644, 7 * i, 1
        a.st_mtime_ns = a.st_ctime_ns = a.st_atime_ns = 1_700_000_000_000_000_000 + i
        a.entry_timeout, a.attr_timeout = 1.5, 30.0
        name = b"e" * (1 + i % 40)
        if not buf.add(name, a, i + 1):
            break
        sent.append((name, a))
    raw = bytes(buf.payload())
    assert len(raw) <= size and len(raw) % 8 == 0
    pos, got = 0, 0
    while pos < len(raw):
        e = abi.ENTRY_OUT.unpack_from(raw, pos)
        ino, off, namelen, kind = abi.DIRENT.unpack_from(raw, pos + abi.ENTRY_OUT.size)
        name, a = sent[got]
        start = pos + abi.ENTRY_OUT.size + abi.DIRENT.size
        assert raw[start : start + namelen] == name
        end = start + ((namelen + 7) & ~7)
        assert raw[start + namelen : end] == b"\0" * (end - start - namelen)
        assert (e[0], e[2], e[3], e[4], e[5]) == (a.st_ino, 1, 30, 500_000_000, 0)  # ino, timeouts
        assert (e[6], e[7], e[15], e[16]) == (a.st_ino, a.st_size, a.st_mode, 1)  # attr: ino, size, mode, nlink
        assert (e[10], e[13]) == divmod(a.st_mtime_ns, 1_000_000_000)
        assert (ino, off, kind) == (a.st_ino, got + 1, a.st_mode >> 12)
        pos, got = end, got + 1
    assert got == len(sent) > 500  # more entries than the first buffer holds
    assert len(raw) + abi.ENTRY_OUT.size + abi.DIRENT.size + 48 > size  # it stopped because it was full
