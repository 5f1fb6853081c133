"""``kvfs bench quota`` runs end to end on small figures and prints what it promises."""

import json

from kvfs.tools.cli import main


def test_bench_quota_json(capsys):
    rc = main(["bench", "quota", "--blocks", "400", "--passes", "1", "--du-blocks", "2000", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    put = out["put_us"]
    assert set(put) == {"no_namespaces", "namespaces_elsewhere", "quota_held"} and all(v > 0 for v in put.values())
    assert abs(out["put_ratio"]["quota_held"] - put["quota_held"] / put["no_namespaces"]) < 1e-9
    assert out["quota_accounting_us"] == put["quota_held"] - put["no_namespaces"]
    assert out["du_small_us"] > 0 and out["du_big_us"] > 0 and out["du_blocks"] == {"small": 1000, "big": 2000}
    assert out["retention_sweep_us_per_block"] > 0 and "load1" in out


def test_bench_quota_table(capsys):
    assert main(["bench", "quota", "--blocks", "200", "--passes", "1", "--du-blocks", "1500"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kvfs bench quota: 200 puts of 4096 B into a full DRAM tier")
    assert "put, namespace held to its DRAM quota" in out and "quota accounting adds" in out
