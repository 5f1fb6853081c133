"""The ``kvfs`` tools on a real kvfs mount, through plain file I/O and path discovery.

Uses the ``kvfs_mount`` fixture (tests/conftest.py), which skips with a reason where
/dev/fuse or pyfuse3 is missing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvfs.mount.paths import control_socket_path
from kvfs.protocol import Events, Subscribed
from kvfs.tools.cli import main
from kvfs.tools.control_client import ENV_SOCKET, ControlClient


@pytest.fixture
def mp(kvfs_mount, monkeypatch) -> Path:
    """A fresh real mount (DRAM 8 MiB over disk 32 MiB); tools find it from the path."""
    monkeypatch.delenv(ENV_SOCKET, raising=False)
    return kvfs_mount()


def kvfs_json(capsys, *argv):
    capsys.readouterr()
    rc = main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_ls_du_stat_df_on_a_written_block(mp, capsys):
    blk = mp / "tools" / "aa" / "b1"
    write(blk, b"k" * 5000)
    st = kvfs_json(capsys, "stat", str(blk))
    assert st["size"] == 5000 and st["tiers"] and st["pinned"] is False and st["path"] == str(blk)
    ls = kvfs_json(capsys, "ls", str(blk.parent))
    assert [e["name"] for e in ls["entries"]] == ["b1"]
    du = kvfs_json(capsys, "du", str(mp / "tools"))
    assert du["total"]["blocks"] == 1 and du["total"]["size"] == 5000
    df = kvfs_json(capsys, "df", str(mp))
    assert df["mountpoint"] == str(mp) and df["blocks"] >= 1


def test_a_tool_right_after_a_program_closed_the_file_sees_the_block(kvfs_mount, capsys, monkeypatch):
    """``cp big /mnt/kvfs/x && kvfs stat /mnt/kvfs/x``: the kernel releases (and kvfs
    seals) a file after close returned, and a tool's request names the block without a
    lookup on the mount; it waits for that seal as an operation on the name does. A
    probe of 40 such 4 MiB files on a loaded machine missed 33 before."""
    monkeypatch.delenv(ENV_SOCKET, raising=False)
    mp = kvfs_mount(disk="128MiB")
    for i in range(8):
        blk = mp / "big" / f"b{i}"
        write(blk, bytes([i]) * (4 << 20))
        st = kvfs_json(capsys, "stat", str(blk))
        assert st["size"] == 4 << 20 and st["tiers"], st


def test_prefetch_after_evict_on_a_mount(mp, capsys):
    tiers = [t["name"] for t in kvfs_json(capsys, "df", str(mp))["tiers"]]
    if len(tiers) < 2:
        pytest.skip("needs two tiers")
    blk = mp / "tools" / "pf"
    write(blk, b"p" * 4096)
    assert main(["evict", "--tier", tiers[0], str(blk)]) == 0
    assert tiers[0] not in kvfs_json(capsys, "stat", str(blk))["tiers"]
    assert main(["prefetch", str(blk)]) == 0
    assert kvfs_json(capsys, "stat", str(blk))["tiers"][0] == tiers[0]
    assert blk.read_bytes() == b"p" * 4096


def test_events_of_a_write_through_the_mount(mp):
    with ControlClient(control_socket_path(mp)) as client:
        items = iter(client.stream(Events()))
        assert isinstance(next(items), Subscribed)
        write(mp / "tools" / "ev", b"e" * 100)
        os.unlink(mp / "tools" / "ev")
        kinds = []
        for item in items:
            ev = item.event
            if ev.name == "tools/ev":
                kinds.append(ev.kind.value)
            if ev.kind.value == "removed":
                break
    assert kinds[0] == "stored" and kinds[-1] == "removed"


def test_metrics_of_a_real_mount_change_as_files_flow(kvfs_mount):
    """``kvfs mount --metrics-port``: the daemon serves Prometheus metrics over HTTP, and
    the tier and FUSE series move as files are written and read through the mount."""
    import socket

    from support.metrics import scrape, tier

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m0 = kvfs_mount(args=("--metrics-port", str(port)))
    before = scrape(port)
    for i in range(3):
        write(m0 / f"b{i}", bytes([i]) * 100_000)
    assert (m0 / "b1").read_bytes() == bytes([1]) * 100_000
    after = scrape(port)
    assert after[("kvfs_blocks", ())] == before[("kvfs_blocks", ())] + 3
    assert tier(after, "kvfs_tier_stored_total", "dram") == tier(before, "kvfs_tier_stored_total", "dram") + 3
    assert tier(after, "kvfs_tier_used_bytes", "dram", "dram") > tier(before, "kvfs_tier_used_bytes", "dram", "dram")
    assert after[("kvfs_fuse_operations_total", (("op", "create"),))] >= 3
    assert after[("kvfs_fuse_operations_total", (("op", "open"),))] >= 1  # a read may come from the page cache
