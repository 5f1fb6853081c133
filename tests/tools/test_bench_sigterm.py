"""A bench ended by SIGTERM (``timeout``, ``kill``, a CI job's cancel) unmounts what it
mounted: its mount daemon does not outlive it (issue 25)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from support.cli import KVFS
from support.deadlines import DEADLINE, wait_for
from support.mounts import fuse_missing

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(fuse_missing() is not None, reason=str(fuse_missing()))]


def _kvfs_mounts_under(root: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p.startswith(str(root) + "/") and p.endswith("/mnt")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for this purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_bench_fuse_killed_by_sigterm_unmounts_and_ends_its_daemon(tmp_path):
    from kvfs.mount.paths import pid_path

    # --rss-rounds keeps the kvfs phase going far longer than the test waits for it
    proc = subprocess.Popen(
        [*KVFS, "bench", "fuse", "--blocks", "2", "--entries", "100", "--rss-rounds", "1000000"]
        + ["--dir", str(tmp_path), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        pids: list[int] = []

        def mounted() -> bool:
            for mp in _kvfs_mounts_under(tmp_path):
                try:
                    pids.append(int(pid_path(Path(mp)).read_text()))
                except (OSError, ValueError):
                    return False
                return True
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return False

        wait_for(mounted, timeout=4 * DEADLINE)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, proc.returncode
    assert _kvfs_mounts_under(tmp_path) == []
    wait_for(lambda: not _alive(pids[0]))
