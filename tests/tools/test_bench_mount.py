"""``kvfs bench soak`` (the short version: every byte read checked under mixed load) and
``kvfs bench fuse`` (kvfs next to the ceiling filesystem and tmpfs) on real mounts."""

from __future__ import annotations

import json

import pytest

from support.cli import run_kvfs
from support.deadlines import DEADLINE
from support.mounts import fuse_missing

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(fuse_missing() is not None, reason=str(fuse_missing()))]


@pytest.mark.slow
def test_soak_of_25_seconds_reads_nothing_wrong(tmp_path):
    res = run_kvfs("bench", "soak", "--seconds", "25", "--dir", str(tmp_path), "--json", timeout=4 * DEADLINE)
    out = json.loads(res.stdout)
    assert res.returncode == 0, out["examples"]
    assert out["wrong_reads"] == 0 and out["close_to_open_failures"] == 0 and out["errors"] == 0, out["examples"]
    assert out["reads"] > 100 and out["close_to_open_checks"] > 20
    assert all(out["writes"][p] > 0 for p in out["writes"]), out["writes"]  # every pattern ran
    assert out["evictions"] > 0 and out["misses"] > 0  # under eviction pressure
    assert out["seal_failures"] == 0


def test_bench_fuse_prints_kvfs_the_ceiling_and_tmpfs(tmp_path):
    res = run_kvfs(
        "bench", "fuse", "--blocks", "2", "--entries", "300", "--dir", str(tmp_path), "--json", timeout=4 * DEADLINE
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    keys = {"write_GBps", "read_repeat_GBps", "open_read_close_p50_us", "miss_per_s", "create_entries_per_s"}
    keys |= {"open_read_close_idle_p50_us"}
    for side in ("kvfs", "ceiling", "tmpfs", "ratio", "ratio_ceiling"):
        assert keys <= set(out[side]), side
    assert all(v > 0 for v in out["ceiling"].values())
    # blocks only on the disk tier, read through the mount and directly, in the same run
    assert out["disk_first"]["kvfs_GBps"] > 0 and out["disk_first"]["direct_GBps"] > 0
