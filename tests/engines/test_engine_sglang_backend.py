"""kvfs's SGLang HiCache backend (``kvfs.gpu.sglang_backend``) under SGLang's own code, in
``.venvs/sglang`` (sglang 0.5.23 and kvfs installed there by ``.ci/engines sglang``), on a
real kvfs mount, next to SGLang's ``HiCacheFile`` on a plain directory as the reference.

SGLang's real host memory pool (``MHATokenToKVPoolHost``) on CPU, the backend made by its
``StorageBackendFactory`` (``dynamic``), and its HiCache controller's page transfer
functions: one engine process backs pages up; a second engine process (a fresh pool and
backend) finds the prefix with ``batch_exists`` and gets byte-exact pages into other
host-pool indices. A block corrupted behind kvfs's back, or removed, is a miss there and
for every page after it, never wrong bytes. See
``tools/engine_clients/sglang_backend_client.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from kvfs.client import Client
from kvfs.tools.engine_clients import client_python

from support.deadlines import ENGINE_DEADLINE
from support.engine_harness import need_client, run, without

PAGES = 6
OFFSET = 5  # the second engine's pages start 5 pages into its pool


def _mount(kvfs_mount, tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "data"
    return kvfs_mount(dram="32MiB", disk="128MiB", data=data), data


def _phases(client, where: str, backend: str, *extra: str) -> tuple[dict, dict]:
    args = ("--backend", backend, "--dir", where, "--pages", str(PAGES), *extra)
    store = run(client, *args, "--phase", "store", where=backend)
    load = run(client, *args, "--phase", "load", "--offset", str(OFFSET), where=backend)
    return store, load


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_a_second_engine_gets_the_stored_prefix_byte_exact(kvfs_mount, tmp_path, layout):
    client = need_client("sglang-backend")
    mp, _ = _mount(kvfs_mount, tmp_path)
    plain = tmp_path / "plain"
    plain.mkdir()
    # SGLang's own file backend on a plain directory: the reference
    ref_store, ref_load = _phases(client, str(plain), "file", "--layout", layout)
    assert ref_store["set"] is True and ref_store["batch_exists"] == PAGES
    assert ref_load["got"] == PAGES and ref_load["sha256"] == ref_store["sha256"]

    store, load = _phases(client, str(mp), "kvfs", "--layout", layout)
    assert store["set"] is True and store["set_again"] is True
    assert store["batch_exists"] == PAGES  # the missing key after the prefix stops it
    assert store["sha256"] == ref_store["sha256"]  # the same pages (same seed) as the reference
    assert load["batch_exists"] == PAGES
    assert load["first_index"] == OFFSET * 64  # other host-pool indices than the store's
    assert load["got"] == PAGES and load["sha256"] == store["sha256"]
    assert load["exists"] == [True, True] and load["batch_get_flat"] == [True, True]
    assert load["batch_get_flat_sha256"] == store["sha256"][:2]  # the old interface reads the same bytes
    assert without(load, "first_index", "backend") == without(ref_load, "first_index", "backend")
    # the blocks are files of the mount, of a page's bytes each, under the namespace
    names = store["names"]
    assert len({n.split("/")[0] for n in names}) == 1 and names[0].startswith("kvfs-test-tiny-llama-")
    for n in names:
        assert (mp / n).stat().st_size == store["page_bytes"]
    # the file backend's .bin files hold the same bytes as kvfs's blocks
    bins = sorted(plain.glob("*.bin"))
    assert len(bins) == PAGES
    with Client(mp) as c:
        for n in names:
            key = n.rsplit("/", 1)[1]
            [v] = c.get([n])
            with v:
                assert bytes(v.data) == (plain / f"{key}_kvfs-test-tiny-llama_0_1.bin").read_bytes()


def test_a_corrupt_or_missing_block_is_a_miss_never_wrong_bytes(kvfs_mount, tmp_path):
    client = need_client("sglang-backend")
    mp, data = _mount(kvfs_mount, tmp_path)
    args = ("--backend", "kvfs", "--dir", str(mp), "--pages", str(PAGES))
    store = run(client, *args, "--phase", "store", where="kvfs")
    names = store["names"]
    with Client(mp, write=True) as c:
        c.evict([names[3]], tier="dram")  # its only copy is now the disk tier's file
        assert c.stat(names[3]).tiers == ("disk",)
    f = data / "disk" / "blocks" / names[3]
    raw = bytearray(f.read_bytes())
    raw[4096 + 1000] ^= 0x01  # one bad bit in the payload, behind kvfs's back
    f.write_bytes(raw)
    load = run(client, *args, "--phase", "load", "--offset", str(OFFSET), where="kvfs")
    assert load["batch_exists"] == PAGES  # the lookup cannot know yet...
    assert load["got"] == 3  # ...the read finds it bad: a miss from there on (SGLang recomputes)
    assert load["sha256"][:3] == store["sha256"][:3]
    assert load["sha256"][3] != store["sha256"][3]  # the pool's page holds nothing SGLang uses
    again = run(client, *args, "--phase", "load", where="kvfs")
    assert again["batch_exists"] == 3  # the bad copy was dropped: now a plain miss
    # a block removed through the mount: a miss too
    (mp / names[1]).unlink()
    gone = run(client, *args, "--phase", "load", where="kvfs")
    assert gone["batch_exists"] == 1 and gone["got"] == 1 and gone["sha256"][0] == store["sha256"][0]
    # a block of another size under a page's name (written through the mount): a miss, both ways
    page = store["page_bytes"]
    (mp / names[0]).write_bytes(b"\x07" * (page + 4096))
    big = run(client, *args, "--phase", "load", where="kvfs")
    assert big["batch_exists"] == 0 and big["got"] == 0 and big["exists"] == [False, False]
    assert big["batch_get_flat"] == [False, False]
    (mp / names[0]).write_bytes(b"\x07" * (page - 2))
    short = run(client, *args, "--phase", "load", where="kvfs")
    assert short["batch_exists"] == 0 and short["got"] == 0 and short["batch_get_flat"] == [False, False]


def test_concurrent_prefetch_and_backup_threads_on_one_backend(kvfs_mount, tmp_path):
    client = need_client("sglang-backend")
    mp, _ = _mount(kvfs_mount, tmp_path)
    rounds = 12
    r = run(
        client,
        "--dir",
        str(mp),
        "--phase",
        "threads",
        "--pages",
        "4",
        "--offset",
        "4",
        "--rounds",
        str(rounds),
        where="kvfs",
    )
    assert r["set"] is True and "errors" not in r, r.get("errors")
    assert r["gets"] == [True] * rounds  # every get, beside the puts, byte-exact
    assert r["sets"] == [True] * rounds and r["stored_after"] == [4] * rounds


def test_no_daemon_is_a_clear_error_at_construction(tmp_path):
    client = need_client("sglang-backend")
    out = run(client, "--probe", "--dir", str(tmp_path), "--phase", "store", where="no daemon")
    error = out["made"]["error"]  # raised by SGLang's factory, out of the backend's constructor
    assert error.startswith("BackendUnavailable: kvfs HiCache backend:"), error
    assert "kvfs_mount" in error and "is neither a kvfs mount" in error
    out = run(
        client, "--probe", "--dir", str(tmp_path), "--phase", "store", "--extra", '{"kvfs_mont": "/x"}', where="bad key"
    )
    error = out["made"]["error"]
    assert "unknown kvfs key(s) in hicache_storage_backend_extra_config: kvfs_mont" in error, error
    assert "kvfs_mount" in error  # the known keys are listed
    out = run(
        client,
        "--probe",
        "--dir",
        str(tmp_path),
        "--phase",
        "store",
        "--extra",
        '{"kvfs_timeout": -1}',
        where="bad value",
    )
    assert "kvfs_timeout = -1" in out["made"]["error"]


_LONG = 900  # seconds: the backend's kvfs_timeout in the next test, far past what a failing call takes


def test_the_daemon_going_away_is_a_quick_miss_and_coming_back_a_hit(kvfs_mount, tmp_path):
    client = need_client("sglang-backend")
    mp, data = _mount(kvfs_mount, tmp_path)
    flag = str(tmp_path / "flag")
    proc = subprocess.Popen(
        [
            *(client_python(client), str(client.path), "--dir", str(mp), "--phase", "store", "--pages", "4"),
            *("--flag", flag, "--extra", json.dumps({"kvfs_timeout": _LONG})),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    try:
        assert _wait_file(flag + ".ready", proc), "the client did not get ready"
        assert kvfs_mount.umount(mp).returncode == 0  # flushed to the disk tier, daemon gone
        Path(flag + ".go").touch()
        assert _wait_file(flag + ".missed", proc), "the calls with no daemon did not return"
        kvfs_mount(dram="32MiB", disk="128MiB", data=data, mountpoint=mp)  # the same blocks again
        Path(flag + ".back").touch()
        out, _ = proc.communicate(timeout=ENGINE_DEADLINE)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    r = json.loads(out.split("KVFS-RESULT ", 1)[1].splitlines()[0])
    assert r["set"] is True
    assert r["down"] == {"batch_exists": 0, "get": 0, "set": False, "exists": False}
    # each call fails at once (no socket): four calls that waited for their timeout would
    # take 4 x _LONG; a loaded machine takes seconds
    assert r["down_s"] < _LONG
    assert r["back"] == {"batch_exists": 4, "get": 4}


def _wait_file(path: str, proc: subprocess.Popen, timeout: float = ENGINE_DEADLINE) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False
