"""Names of sealed blocks cached by the kernel past the 1 s entry timeout (no shared tier):
one LOOKUP fewer per open of a name idle over a second (issue 25), and still never a
name the store removed: the daemon makes the kernel forget the names the store's events
removed, replaced or renamed. On both transports."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from support.cli import run_kvfs
from support.deadlines import wait_for
from support.metrics import scrape
from support.mounts import TRANSPORTS

pytestmark = [pytest.mark.fuse, TRANSPORTS]

CONFIG = """\
[[tiers]]
kind = "dram"
name = "dram"
capacity = "16MiB"
prefault = false
mlock = false

[[tiers]]
kind = "disk"
name = "disk"
capacity = "64MiB"
path = "{data}/disk"

[mount]
metrics_port = {port}
"""

# an hour: a name the daemon did not make the kernel forget would stay for the whole test
HOUR = {"KVFS_FUSE_OPTIONS": '{"sealed_entry_timeout": 3600}'}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mount(kvfs_mount, tmp_path: Path, env: dict | None = None) -> tuple[Path, int]:
    port = _free_port()
    data = tmp_path / "data"
    return kvfs_mount(CONFIG.format(data=data, port=port), data=data, env=env), port


def _lookups(port: int) -> float:
    return scrape(port).get(("kvfs_fuse_operations_total", (("op", "lookup"),)), 0.0)


def _remove(path: Path) -> None:
    """Remove the block at *path* from every tier through the control socket: its last
    copy moved to the disk tier first (an evict of a DRAM copy demotes it), then dropped."""
    res = run_kvfs("evict", "--tier", "dram", str(path))
    assert res.returncode == 0, res.stderr
    res = run_kvfs("evict", "--force", str(path))
    assert res.returncode == 0 and "1 removed entirely" in res.stdout, (res.stdout, res.stderr)


def test_a_sealed_name_is_not_looked_up_again_after_a_second(kvfs_mount, tmp_path):
    mp, port = _mount(kvfs_mount, tmp_path)
    (mp / "a").write_bytes(b"x" * 5000)
    # The write's own event makes the kernel forget the name once, at the next drain of
    # the store's events (at most a second later); after that the name stays cached.
    # Each round lets the old 1 s entry timeout lapse (time passing is the point here).
    for _ in range(5):
        os.stat(mp / "a")
        before = _lookups(port)
        time.sleep(1.5)
        assert os.stat(mp / "a").st_size == 5000
        if _lookups(port) == before:
            return
    pytest.fail("every stat of the sealed name after 1.5 s sent a LOOKUP")


def test_names_the_store_removes_or_replaces_are_forgotten_by_the_kernel(kvfs_mount, tmp_path):
    mp, _ = _mount(kvfs_mount, tmp_path, env=HOUR)
    (mp / "gone").write_bytes(b"g" * 3000)
    (mp / "kept").write_bytes(b"k" * 3000)
    for n in ("gone", "kept"):
        os.stat(mp / n)  # the kernel caches the names (for an hour, at this setting)
    # removed from every tier by the control socket, not through the mount
    _remove(mp / "gone")
    wait_for(lambda: not os.path.exists(mp / "gone"))
    assert (mp / "kept").read_bytes() == b"k" * 3000


def test_with_the_default_timeout_a_removed_name_goes_too(kvfs_mount, tmp_path):
    mp, _ = _mount(kvfs_mount, tmp_path)
    (mp / "b").write_bytes(b"b" * 3000)
    os.stat(mp / "b")
    _remove(mp / "b")
    with pytest.raises(FileNotFoundError):  # the open asks the daemon: gone at once
        (mp / "b").read_bytes()
    wait_for(lambda: not os.path.exists(mp / "b"))
