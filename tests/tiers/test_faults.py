"""Real mounts while a shared tier stops answering, and unmount accounting.

The faults are real (tools/faultrig.py): a posix tier on a FUSE filesystem that stops
answering (tools/stallfs.py), a moto S3 server stopped with SIGSTOP, and a TCP listener
in front of S3 that never answers. While the fault lasts, DRAM and disk hits through the
mount complete byte-exact (another thread keeps asking the shared tier meanwhile), a
block only the shared tier holds fails with EHOSTDOWN, ``kvfs umount`` returns and says
what it could not copy, and after the fault nothing is lost. Latencies are printed by
``kvfs bench faults``; no test asserts a time.
"""

from __future__ import annotations

import json
import os
import random
import signal
import uuid

import pytest

from kvfs.tools.bench_faults import measure
from kvfs.tools.faultrig import SCENARIOS, FaultRig
from kvfs.tools.scratch import start_moto

from support.mounts import fuse_missing
from support.s3server import FAKE_ENV


@pytest.fixture
def fuse():
    reason = fuse_missing()
    if reason:
        pytest.skip(reason)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_local_hits_umount_and_recovery_while_a_shared_tier_does_not_answer(fuse, tmp_path, scenario):
    rig = FaultRig(scenario, root=tmp_path, blocks=10, hot=4, block_size=64 << 10, timeout=1.0)
    try:
        figures = measure(rig, hits=20)  # hits during the fault are checked byte-exact
    finally:
        rig.close()
    assert figures["dram"]["fault"]["n"] == 20 and figures["disk"]["fault"]["n"] == 20
    shared = figures["shared_only"]
    assert shared["first_errno"] == "EHOSTDOWN" and shared["again_errno"] == "EHOSTDOWN"
    umount = figures["umount"]
    assert umount["exit"] == 0, umount  # the blocks written during the fault are on disk
    tier = "posix" if scenario == "posix-stall" else "s3"
    assert f"3 write-through copies to {tier} were not made" in umount["said"]
    assert figures["lost_or_wrong"] == []
    assert figures["final_umount"]["exit"] == 0


S3_ONLY = """
[[tiers]]
kind = "dram"
capacity = "8MiB"
mlock = false
prefault = false

[[tiers]]
kind = "s3"
bucket = "{bucket}"
endpoint_url = "{endpoint}"
timeout = "1s"
max_attempts = 2
"""


def test_umount_with_s3_down_names_every_lost_block_and_fails(kvfs_mount, tmp_path):
    """S3 is the only persistent tier and stops answering: unmount cannot write the
    blocks only in DRAM anywhere, so it names each one and exits non-zero."""
    proc, endpoint = start_moto()
    try:
        import boto3

        bucket = f"kvfs-{uuid.uuid4().hex[:12]}"
        os.environ.update(FAKE_ENV)
        boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket=bucket
        )
        mp = kvfs_mount(S3_ONLY.format(bucket=bucket, endpoint=endpoint), env=dict(FAKE_ENV))
        proc.send_signal(signal.SIGSTOP)
        names = [f"blk{i}" for i in range(10)]
        for n in names:
            (mp / n).write_bytes(random.Random(n).randbytes(100_000))
        res = kvfs_mount.umount(mp)
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(10)
    assert res.returncode == 1, res
    assert "10 blocks only in DRAM could not be written to a persistent tier and are lost" in res.stderr
    for n in names:
        assert f"  {n}: s3 is unavailable" in res.stderr or f"  {n}: s3 " in res.stderr
    from kvfs.mount.paths import log_path, umount_report_path

    log = log_path(mp).read_text()
    assert all(n in log.rsplit("could not be written", 1)[1] for n in names)
    report = json.loads(umount_report_path(mp).read_text())
    assert sorted(e["name"] for e in report["lost"]) == sorted(names)
