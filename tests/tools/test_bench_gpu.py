"""``kvfs bench gpu`` runs end to end on small figures and prints what it promises; its
GPU rows say why they are skipped here, and its TTFT code runs on the CPU too."""

import argparse
import json

import pytest

from kvfs.tools.cli import main

from support.mounts import fuse_missing


def test_bench_gpu_json(capsys, tmp_path):
    if fuse_missing():
        pytest.skip(fuse_missing())
    argv = ["bench", "gpu", "--block-size", "256KiB", "--blocks", "8", "--batch", "4", "--passes", "1"]
    rc = main([*argv, "--dir", str(tmp_path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["block_size"] == 256 << 10 and out["device"] == "cpu"
    rows = {r["op"]: r for r in out["results"]}
    cpu = [r for r in out["results"] if r["path"] == "cpu"]
    assert [r["op"] for r in cpu] == [
        "NIXL POSIX read (256 KiB blocks)",
        "agent map, disk (nixl-posix)",
        "agent map, arena",
        "agent map hit, 4 blocks",
    ]
    for r in cpu:
        assert r["ratio"] > 0
        if "gb_s" in r:
            assert abs(r["ratio"] - r["gb_s"] / r["baseline_gb_s"]) < 1e-9
    assert (
        abs(
            rows["agent map hit, 4 blocks"]["ratio"]
            - rows["agent map hit, 4 blocks"]["baseline_ms"] / rows["agent map hit, 4 blocks"]["ms"]
        )
        < 1e-9
    )
    gpu = [r for r in out["results"] if r["path"] == "gpu"]
    assert len(gpu) == 7 and all(r["skipped"].startswith("skipped: ") for r in gpu)
    assert {r["op"] for r in gpu} >= {"pinned H2D from the arena", "warm TTFT from disk"}


def test_the_ttft_rows_run_on_the_cpu_through_the_agent(kvfs_mount):
    pytest.importorskip("transformers")
    import torch

    from kvfs.tools.bench_gpu_cuda import _ttft

    mp = kvfs_mount(dram="64MiB", disk="128MiB")
    args = argparse.Namespace(model="tiny", ttft_tokens=96, ttft_block=16, passes=1)
    rows = _ttft(mp, args, torch.device("cpu"), lambda *a: None)
    assert [r["op"] for r in rows] == [f"warm TTFT from {t}, 96 tokens" for t in ("HBM", "DRAM", "disk")]
    assert all(r["ms"] > 0 and r["baseline"] == "cold prefill" for r in rows)
