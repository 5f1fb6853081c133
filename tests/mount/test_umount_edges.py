"""Unmount at the edges (issue 20, item 11): ``kvfs umount`` with a hard-stalled shared tier
returns when the daemon is gone, and the daemon goes (its calls into the tier are in a
helper process); a stack whose persistent tiers cannot hold the DRAM tier is refused at
mount."""

from __future__ import annotations

import os
from pathlib import Path

from kvfs.runtime import pid_path
from kvfs.tools.stallfs import StallingMount

from support.cli import run_kvfs
from support.configs import dram_over_disk
from support.deadlines import wait_for

CONFIG = (
    dram_over_disk("16MiB", "64MiB", "{data}/disk")
    + """
[[tiers]]
kind = "posix"
capacity = "1GiB"
path = "{shared}/blocks"
timeout = "1s"
"""
)


def _threads(pid: int) -> list[str]:
    """The states of the live threads of *pid* (none: the process is gone), with
    ``"fuse"`` for each waiting on a FUSE server's answer."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(state)
            try:
                with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                    if f.read().strip() == "request_wait_answer":
                        out.append("fuse")
            except OSError:
                pass
    return out


def _helpers(pid: int) -> list[int]:
    """The helper processes (kvfs.helper) of process *pid*."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if ppid == pid and b"kvfs.helper" in cmd:
            out.append(int(p))
    return out


def test_umount_with_a_stalled_tier_returns_when_the_daemon_is_gone(kvfs_mount, tmp_path):
    """A call into the stalled tier blocks in the kernel for good (a FUSE server holds it):
    it is the tier's helper process that it holds, so the daemon still ends, and kvfs
    umount returns once it has -- never while it lives."""
    with StallingMount(tmp_path / "stall") as st:
        cfg = CONFIG.format(data=tmp_path, shared=st.mountpoint)
        mp = kvfs_mount(cfg)
        pid = int(pid_path(mp).read_text())
        blocks = {f"a{i}": os.urandom(100_000) for i in range(3)}
        for n, data in blocks.items():
            (mp / n).write_bytes(data)
        st.stall()
        for i in range(3):  # written through to the stalled tier: a call into it blocks in the kernel
            blocks[f"b{i}"] = os.urandom(100_000)
            (mp / f"b{i}").write_bytes(blocks[f"b{i}"])
        stuck = [pid, *_helpers(pid)]
        wait_for(lambda: any("fuse" in _threads(p) for p in stuck), timeout=60)
        res = run_kvfs("umount", str(mp), timeout=120)
        assert res.returncode == 0, res.stderr
        assert _threads(pid) == [], "kvfs umount returned while the daemon was alive"
        [helper] = stuck[1:]
        assert "fuse" in _threads(helper)  # what the stalled filesystem holds is the helper, still stuck
        st.resume()
        wait_for(lambda: _threads(helper) == [], timeout=60)  # and it goes once the call returns
        again = kvfs_mount(cfg, mountpoint=mp, data=tmp_path)
        for n, data in blocks.items():  # nothing was lost
            assert (again / n).read_bytes() == data
        kvfs_mount.umount(again)


def test_persistent_tiers_smaller_than_dram_are_refused_at_mount(tmp_path):
    (tmp_path / "m").mkdir()
    text = dram_over_disk("8MiB", "4MiB", str(tmp_path / "disk"))
    (tmp_path / "c.toml").write_text(text)
    res = run_kvfs("mount", str(tmp_path / "m"), "--config", str(tmp_path / "c.toml"))
    assert res.returncode != 0
    assert (
        "config error in tiers: the persistent tiers (disk: 4 MiB) are smaller than the DRAM tier (8 MiB): "
        "a clean unmount could not write every block only in DRAM down" in res.stderr
    ), res.stderr
    assert not os.path.ismount(tmp_path / "m") and not Path(tmp_path / "disk").exists()
