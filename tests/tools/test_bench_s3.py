"""``kvfs bench s3`` runs end to end against a moto server it starts (tiny sizes)."""

import json
import subprocess
import sys

from support.deadlines import DEADLINE


def test_bench_s3_json():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvfs.tools.cli",
            "bench",
            "s3",
            "--blocks",
            "2",
            "--rounds",
            "1",
            "--block-size",
            "64KiB",
            "--concurrency",
            "1,2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=4 * DEADLINE,
        check=True,
    ).stdout
    rows = json.loads(out)["results"]
    assert [(r["op"], r["threads"]) for r in rows] == [("put", 1), ("get", 1), ("put", 2), ("get", 2)]
    assert all(r["kvfs_MBps"] > 0 and r["boto3_MBps"] > 0 and r["ratio"] > 0 for r in rows)
