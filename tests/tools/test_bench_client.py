"""``kvfs bench client`` runs end to end on small figures and prints what it promises."""

import json

import pytest

from kvfs.tools.cli import main

from support.mounts import fuse_missing


def test_bench_client_json(capsys, tmp_path):
    if fuse_missing():
        pytest.skip(fuse_missing())
    argv = ["bench", "client", "--block-size", "256KiB", "--blocks", "8", "--batch", "4", "--passes", "1"]
    rc = main([*argv, "--names", "100", "--dir", str(tmp_path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["block_size"] == 256 << 10 and out["blocks"] == 8
    rows = {(r["path"], r["op"]): r for r in out["results"]}
    assert set(rows) == {
        ("client", "put"),
        ("client", "get"),
        ("client copy", "put"),
        ("client copy", "get"),
        ("client", "get (disk, direct)"),
        ("client", "lookup 100 names"),
        ("fuse", "put"),
        ("fuse", "get"),
    }
    for r in out["results"]:
        assert set(r) >= {"path", "op", "gb_s", "baseline", "baseline_gb_s", "ratio"} and r["ratio"] > 0
        if r["gb_s"] is not None:
            assert abs(r["ratio"] - r["gb_s"] / r["baseline_gb_s"]) < 1e-9
    look = rows[("client", "lookup 100 names")]
    assert look["ms"] > 0 and abs(look["ratio"] - look["baseline_ms"] / look["ms"]) < 1e-9
    assert len(out["load"]["before"]) == 3
