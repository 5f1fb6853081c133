"""``kvfs bench engines`` end to end: a real client on a kvfs mount it makes and on a plain
directory, figures and ratios in JSON and as a table (small workloads)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.deadlines import ENGINE_DEADLINE
from support.engine_harness import need_client
from support.mounts import fuse_missing


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvfs.tools.cli", "bench", "engines", "--quick", *args],
        capture_output=True,
        text=True,
        timeout=ENGINE_DEADLINE,
        check=False,
    )


@pytest.fixture(autouse=True)
def _fuse():
    reason = fuse_missing()
    if reason:
        pytest.skip(reason)


def test_bench_engines_json_sglang():
    need_client("sglang")
    res = _bench("--clients", "sglang", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    (c,) = out["clients"]
    assert c["client"] == "sglang" and c["status"] == "ok", c.get("status")
    for kind in ("plain", "kvfs"):
        assert c[kind]["bytes"] == 16 * 2 * 8 * 64 * 8 * 128 * 2  # 16 pages of 2 MiB
        assert c[kind]["write_s"] > 0 and c[kind]["read_s"] > 0
    assert c["ratio"]["write"] > 0 and c["ratio"]["read_time"] > 0
    assert len(out["load_avg_before"]) == 3 and "bench engines: sglang on kvfs" in res.stderr


def test_bench_engines_table_and_bad_client():
    res = _bench("--clients", "nope")
    assert res.returncode != 0 and "unknown client nope (known: vllm, vllm-fs-tier" in res.stderr
    res = _bench("--clients", "safetensors")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["CLIENT", "FIGURE", "PLAIN", "KVFS", "KVFS/PLAIN", "AIM", "RESULT"]
    assert [ln.split()[:2] for ln in lines[1:3]] == [["safetensors", "write"], ["safetensors", "read"]]
    assert lines[-1].startswith("load average ")


def test_bench_engines_vllm_connector_json():
    """The connector rows: KvfsConnector on the mount against ExampleConnector on the plain
    directory and against no connector, the same tokens from all three."""
    need_client("vllm")
    res = _bench("--clients", "vllm-connector", "--json")
    assert res.returncode == 0, res.stderr
    (c,) = json.loads(res.stdout)["clients"]
    assert c["client"] == "vllm-connector" and c["status"] == "ok", c.get("status")
    for kind in ("plain", "kvfs"):
        assert c[kind]["ttft_cold_ms"] > 0 and c[kind]["ttft_warm_ms"] > 0
    assert c["none"]["ttft_cold_ms"] > 0 and c["step"]["ttft_warm_ms"] > 0
    assert set(c["ratio"]) == {
        "ttft_cold",
        "ttft_warm",
        "ttft_warm_step",
        "layer_vs_step",
        "ttft_warm_vs_none",
        "example_warm_vs_none",
    }
    assert "vllm-connector: kvfs connector on" in res.stderr and "(step)" in res.stderr


def test_bench_engines_vllm_connector_warm_row():
    """One warm engine process per connector: the cold pass and every warm pass of both
    produced the same tokens, kvfs loaded blocks in both modes, and the table has the
    aims' rows and the layer-wise floor."""
    need_client("vllm")
    res = _bench("--clients", "vllm-connector-warm", "--rounds", "2", "--json")
    assert res.returncode == 0, res.stderr
    (c,) = json.loads(res.stdout)["clients"]
    assert c["client"] == "vllm-connector-warm" and c["status"] == "ok", c.get("status")
    assert [len(c["passes_ms"][k]) for k in ("example", "layer", "step")] == [2, 2, 2]
    assert all(ms > 0 for k in c["warm_ms"] for ms in [c["warm_ms"][k], *c["passes_ms"][k]])
    assert all(n > 0 for n in c["cached_tokens"])  # the warm passes loaded the prompts' KV
    assert all(p and all(ms > 0 for ms in p) for m in ("layer", "step") for p in c["kvfs_load_ms"][m])
    assert set(c["ratio"]) == {"layer_vs_example", "step_vs_example", "layer_vs_step", "cold"}
    assert 0 < c["step_load_ms"] and c["layer_bound"] < 1
    assert all(c["connector_ms"][k] > 0 for k in ("example", "layer", "step")) and c["connector_bound"] > 0
    assert res.stderr.count("vllm-connector-warm: ") == 2  # two engine processes, no more
    from kvfs.tools import bench_vllm_connector

    rows = bench_vllm_connector.rows(c)
    assert [r[1] for r in rows] == [
        "cold TTFT ms",
        "warm TTFT ms, layers",
        "warm TTFT ms, steps",
        "warm layers vs steps",
        "step load ms (floor)",
        "connector ms/request",
    ]
    assert rows[0][-1] == "ok" and rows[1][5] == "<= 0.80" and rows[3][5] == "<= 0.85"


def test_bench_engines_json_sglang_backend():
    need_client("sglang-backend")
    res = _bench("--clients", "sglang-backend", "--json")
    assert res.returncode == 0, res.stderr
    (c,) = json.loads(res.stdout)["clients"]
    assert c["client"] == "sglang-backend" and c["status"] == "ok", c.get("status")
    assert c["baseline"] == "HiCacheFile on a plain directory"
    for kind in ("plain", "kvfs"):
        assert c[kind]["bytes"] == 16 * 2 * 64 * 8 * 8 * 128 * 2  # 16 pages of 2 MiB, read back byte-exact
        assert c[kind]["set_s"] > 0 and c[kind]["get_s"] > 0
    assert set(c["ratio"]) == {"set", "get"} and all(v > 0 for v in c["ratio"].values())


def test_bench_engines_vllm_tier_and_lmcache_backend_rows():
    """kvfs's vLLM tier against vLLM's fs tier, kvfs's LMCache plugin against LMCache's fs
    connector, each under the engine's own classes, in one run; a table with their aims."""
    need_client("vllm-tier")
    need_client("lmcache-backend")
    res = _bench("--clients", "vllm-tier,lmcache-backend", "--json")
    assert res.returncode == 0, res.stderr
    tier, lmc = json.loads(res.stdout)["clients"]
    assert tier["client"] == "vllm-tier" and tier["status"] == "ok", tier.get("status")
    assert tier["baseline"] == "vLLM's fs tier on a plain directory (O_DIRECT)"
    for kind in ("plain", "kvfs"):
        assert tier[kind]["bytes"] == 32 << 20 and tier[kind]["store_s"] > 0 and tier[kind]["load_s"] > 0
    assert set(tier["ratio"]) == {"store", "load"}
    assert lmc["client"] == "lmcache-backend" and lmc["status"] == "ok", lmc.get("status")
    for kind in ("plain", "kvfs"):
        assert lmc[kind]["bytes"] == 16 * 512 * 1024 and lmc[kind]["put_s"] > 0 and lmc[kind]["get_s"] > 0
    assert set(lmc["ratio"]) == {"put", "get"}
