"""Unmount at the edges (issue 20, item 11): a stack whose persistent tiers cannot hold the
DRAM tier is refused at mount."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import run_kvfs

CONFIG = """\
[[tiers]]
kind = "dram"
capacity = "16MiB"
prefault = false
mlock = false

[[tiers]]
kind = "disk"
capacity = "64MiB"
path = "{data}/disk"

[[tiers]]
kind = "posix"
capacity = "1GiB"
path = "{shared}/blocks"
timeout = "1s"
"""


def test_persistent_tiers_smaller_than_dram_are_refused_at_mount(tmp_path):
    (tmp_path / "m").mkdir()
    text = (
        '[[tiers]]\nkind = "dram"\ncapacity = "8MiB"\nmlock = false\nprefault = false\n\n'
        f'[[tiers]]\nkind = "disk"\ncapacity = "4MiB"\npath = "{tmp_path / "disk"}"\n'
    )
    (tmp_path / "c.toml").write_text(text)
    res = run_kvfs("mount", str(tmp_path / "m"), "--config", str(tmp_path / "c.toml"))
    assert res.returncode != 0
    assert (
        "config error in tiers: the persistent tiers (disk: 4 MiB) are smaller than the DRAM tier (8 MiB): "
        "a clean unmount could not write every block only in DRAM down" in res.stderr
    ), res.stderr
    assert not os.path.ismount(tmp_path / "m") and not Path(tmp_path / "disk").exists()
