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
