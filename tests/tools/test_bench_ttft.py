"""``kvfs bench ttft`` runs end to end on a tiny model and reports every case."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvfs.tools.bench_ttft import format_tables
from kvfs.tools.cli import main


def test_bench_ttft_json_and_table(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    rc = main(
        [
            "bench",
            "ttft",
            "--model",
            "tiny",
            "--dtype",
            "fp32",
            "--lengths",
            "40,70",
            "--suffix",
            "8",
            "--block-tokens",
            "8",
            "--repeat",
            "1",
            "--turns",
            "2",
            "--turn-tokens",
            "20",
            "--answer-tokens",
            "3",
            "--dir",
            f"dram={a}",
            "--dir",
            f"disk={b}",
            "--json",
        ]
    )
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["tokens"] for r in res["prompts"]] == [40, 70]
    assert [r["cached_tokens"] for r in res["prompts"]] == [32, 56]
    for r in res["prompts"] + res["turns"][1:]:
        for label in ("dram", "disk"):
            assert r["warm"][label]["cached_tokens"] == r["cached_tokens"]
            assert r["warm"][label]["ttft_s"] > 0
    assert [t["tokens"] for t in res["turns"]] == [20, 43]
    assert [t["cached_tokens"] for t in res["turns"]] == [0, 16]  # 22 tokens had KV: 2 blocks
    # The bench cleans up after itself.
    assert list(a.iterdir()) == [] and list(b.iterdir()) == []
    text = format_tables(res)
    assert "dram/ideal" in text and "Multi-turn" in text


def test_bench_ttft_rejects_bad_dirs(tmp_path, capsys):
    assert main(["bench", "ttft", "--model", "tiny", "--dir", f"x={tmp_path / 'nope'}"]) == 1
    assert "--dir" in capsys.readouterr().err
    assert main(["bench", "ttft", "--model", "huge"]) == 1
    assert "--model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "ttft", "--dir", "no-label"])


def test_bench_ttft_with_the_batch_client(tmp_path, capsys):
    from support.mounts import fuse_missing

    if fuse_missing():
        pytest.skip(fuse_missing())
    argv = ["bench", "ttft", "--model", "tiny", "--dtype", "fp32", "--lengths", "40", "--suffix", "8"]
    argv += ["--block-tokens", "8", "--repeat", "1", "--turns", "0", "--kvfs", "dram,disk", "--client"]
    assert main([*argv, "--dir", f"plain={tmp_path}", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    [row] = res["prompts"]
    assert set(row["warm"]) == {"plain", "kvfs-dram", "kvfs-disk", "kvfs-dram+client", "kvfs-disk+client"}
    for label, w in row["warm"].items():
        assert w["cached_tokens"] == row["cached_tokens"] == 32, label
