"""``kvfs bench tiers`` runs end to end on small figures and prints what it promises."""

import json

from kvfs.tools.cli import main


def test_bench_tiers_json(capsys, tmp_path):
    rc = main(
        [
            "bench",
            "tiers",
            "--block-size",
            "64KiB",
            "--blocks",
            "4",
            "--passes",
            "1",
            "--catalog-blocks",
            "2000",
            "--dir",
            str(tmp_path),
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    rows = {(r["tier"], r["op"]): r for r in out["throughput"]}
    assert set(rows) == {(t, op) for t in ("dram", "disk", "disk (O_DIRECT)") for op in ("put", "get")}
    for r in rows.values():
        assert r["GB/s"] > 0 and r["baseline GB/s"] > 0 and abs(r["ratio"] - r["GB/s"] / r["baseline GB/s"]) < 1e-9
    assert out["catalog"]["blocks"] == 2000 and out["catalog"]["bytes_per_block"] > 0


def test_bench_tiers_table(capsys, tmp_path):
    assert (
        main(
            [
                "bench",
                "tiers",
                "--block-size",
                "64KiB",
                "--blocks",
                "2",
                "--passes",
                "1",
                "--catalog-blocks",
                "1000",
                "--dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["tier", "op", "GB/s", "baseline", "baseline", "GB/s", "ratio"]
    assert "lookup+touch" in out
