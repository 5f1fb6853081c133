"""kvfs's LMCache remote storage plugin (``kvfs.gpu.lmcache_backend.KvfsRemoteConnector``)
under LMCache 0.5.6's own ``StorageManager`` and ``RemoteBackend`` (``.venvs/lmcache``,
kvfs installed there by ``.ci/engines``), loaded from the config as an engine gives it
(``remote_storage_plugins`` with ``module_path``): a first process puts chunks, a second
(an empty CPU cache) finds and reads them byte-exact. LMCache's own fs connector on a
plain directory runs the same script first, the reference
(``tools/engine_clients/lmcache_backend_client.py``)."""

from __future__ import annotations

from pathlib import Path

from support.engine_harness import MOUNT, need_client, run, without

CHUNKS = 4
CHUNK_BYTES = 2 * 4 * 256 * 2 * 64 * 2  # K/V, layers, tokens, KV heads, head size, bf16
TRAILER = 24 + 28  # magic and key digest, then LMCache's RemoteMetadata


def _run(where: str, backend: str, d: Path | str, phase: str) -> dict:
    args = ["--backend", backend, "--dir", d, "--phase", phase, "--chunks", str(CHUNKS), "--timeout", "60"]
    return without(run("lmcache-backend", *args, where=where))


def _stored(mp: Path) -> list[Path]:
    return sorted(p for p in (mp / "lmcache").rglob("*") if p.is_file())


def test_fs_connector_reference_on_a_plain_directory(tmp_path):
    need_client("lmcache-backend")
    d = tmp_path / "lmcache-fs"
    store = _run("plain", "fs", d, "store")
    assert store["connected"] is True and "error" not in store, store
    load = _run("plain", "fs", d, "load")
    assert load["contains"] == CHUNKS and load["get_equal"] == [True] * CHUNKS


def test_put_then_a_new_process_gets_byte_exact_and_damage_is_a_miss(kvfs_mount):
    need_client("lmcache-backend")
    mp = kvfs_mount(**MOUNT)
    store = _run("kvfs", "kvfs", mp, "store")
    assert store["connected"] is True and "error" not in store and store["put_failed"] == 0, store
    blocks = _stored(mp)
    # lmcache/<model>/<world size>_<worker>_<dtype>/<ab>/<chunk hash>: one block per chunk
    assert len(blocks) == CHUNKS
    for p in blocks:
        parts = p.relative_to(mp).parts
        assert parts[:3] == ("lmcache", "kvfs-test--tiny-llama", "1_0_bfloat16") and parts[4].startswith(parts[3])
        assert p.stat().st_size == CHUNK_BYTES + TRAILER
    load = _run("kvfs", "kvfs", mp, "load")
    assert load["contains"] == CHUNKS and load["get_equal"] == [True] * CHUNKS
    # another chunk's bytes under a name, and a chunk cut short: misses, never their bytes
    swapped, short = blocks[1], blocks[2]
    swapped.write_bytes(blocks[0].read_bytes())
    short.write_bytes(short.read_bytes()[: CHUNK_BYTES // 2])
    damaged = _run("kvfs", "kvfs", mp, "load")
    assert damaged["contains"] == CHUNKS  # present, of a plausible size: found, then refused when read
    assert sorted(damaged["get_equal"]) == [False, False, True, True], damaged  # (blocks sort by hash)


def test_no_daemon_means_no_remote_backend_and_no_hits(tmp_path):
    """kvfs_path where no kvfs is mounted: LMCache logs the plugin's error and runs
    without the remote backend (its own handling of a remote that cannot be reached)."""
    need_client("lmcache-backend")
    r = _run("kvfs", "kvfs", tmp_path, "load")
    assert r["connected"] is False and r["contains"] == 0
