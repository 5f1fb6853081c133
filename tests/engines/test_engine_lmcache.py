"""LMCache 0.5.6 (``.venvs/lmcache``) on a kvfs mount, next to a plain directory: its
``StorageManager`` with the fs connector in each config form, and its LocalDiskBackend
re-storing keys after a restart. A first process stores chunks, a second one (a restart:
empty CPU cache, empty disk index) finds and reads them. See
``tools/engine_clients/lmcache_client.py`` for the config of each setup.
"""

from __future__ import annotations

from support.engine_harness import assert_same, kv_dirs, need_client, run, without  # noqa: F401  (kv_dirs: fixture)

CHUNKS = 4
CHUNK_BYTES = 2 * 4 * 256 * 2 * 64 * 2  # K/V, layers, tokens, KV heads, head size, bf16
HEADER = 28  # save_chunk_meta: struct "iiiiiii" before the raw chunk


def _store_and_restart(kv_dirs, kind: str, setups: str) -> dict:
    client = need_client("lmcache")
    # put tasks finish in milliseconds; 15 s is only how long a stuck one is waited for
    args = ("--dir", kv_dirs[kind] / "lmcache", "--setups", setups, "--chunks", str(CHUNKS), "--timeout", "15")
    store = run(client, *args, "--phase", "store", where=kind)
    load = run(client, *args, "--phase", "load", where=kind)
    return {"store": without(store)["setups"], "load": without(load)["setups"]}


def _sizes(result: dict) -> list[int]:
    return sorted(f["size"] for f in (result["tree"] or {}).values())


def test_fs_connector_config_forms(kv_dirs):
    """``remote_storage_plugins`` and ``fs://localhost:0/path`` store and find chunks across
    processes; ``fs_connector_use_odirect`` takes effect only with ``save_chunk_meta: false``
    (raw chunks, no header); ``fs:///path`` is refused ("missing host") and saves nothing."""
    setups = "plugin,url,odirect,meta_odirect,refused"
    plain = _store_and_restart(kv_dirs, "plain", setups)
    store, load = plain["store"], plain["load"]
    for setup in ("plugin", "url", "odirect", "meta_odirect"):
        assert store[setup]["connected"] is True and store[setup]["put"]["pending_put_tasks"] == 0, setup
        assert load[setup]["contains"] == CHUNKS and load[setup]["get_equal"] == [True] * CHUNKS, setup
        assert all(n.endswith("@bfloat16.data") and "-SEP-" in n for n in store[setup]["tree"]), setup
    for setup in ("plugin", "url", "meta_odirect"):
        assert store[setup]["use_odirect"] is False and _sizes(store[setup]) == [HEADER + CHUNK_BYTES] * CHUNKS
    assert "Cannot use O_DIRECT if save_chunk_meta enabled." in store["meta_odirect"]["warnings"]
    assert store["odirect"]["use_odirect"] is True and store["odirect"]["save_chunk_meta"] is False
    assert _sizes(store["odirect"]) == [CHUNK_BYTES] * CHUNKS
    refused = store["refused"]
    assert refused["connected"] is False and refused["tree"] is None and refused["contains"] == 0
    assert any("missing host" in w for w in refused["warnings"])
    assert load["refused"]["get_equal"] == [False] * CHUNKS
    kvfs = _store_and_restart(kv_dirs, "kvfs", setups)
    for phase in ("store", "load"):
        for setup, want in plain[phase].items():
            assert_same(kvfs[phase][setup], want, f"LMCache fs connector '{setup}', {phase} process")


def test_local_disk_backend_restores_keys_after_restart(kv_dirs):
    """LocalDiskBackend (``use_odirect``) after a restart finds nothing in its index and
    stores the same keys again: each existing ``.pt`` is opened
    ``O_WRONLY|O_CREAT|O_DIRECT`` without ``O_TRUNC``. The put tasks complete and every
    chunk reads back byte-exact."""
    plain = _store_and_restart(kv_dirs, "plain", "disk")
    store, load = plain["store"]["disk"], plain["load"]["disk"]
    assert store["put"]["pending_put_tasks"] == 0 and store["get_equal"] == [True] * CHUNKS
    assert _sizes(store) == [CHUNK_BYTES] * CHUNKS and all(n.endswith("@bfloat16.pt") for n in store["tree"])
    assert load["contains_before_restore"] == 0
    assert load["put"]["pending_put_tasks"] == 0 and load["contains"] == CHUNKS
    assert load["get_equal"] == [True] * CHUNKS and load["tree"] == store["tree"]
    kvfs = _store_and_restart(kv_dirs, "kvfs", "disk")
    for phase in ("store", "load"):
        assert_same(kvfs[phase]["disk"], plain[phase]["disk"], f"LMCache LocalDiskBackend, {phase} process")
