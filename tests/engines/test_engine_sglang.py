"""SGLang's own HiCache file backend (``HiCacheFile``, sglang 0.5.23 in ``.venvs/sglang``) on
a kvfs mount, next to a plain directory: ``set``/``batch_set`` (dot-named temp file +
``os.replace``), ``exists``/``batch_exists_v2``, ``get``/``batch_get`` (``readinto``), then a
second process with the metadata cache (``os.listdir`` at start) reading every page and
``clear()``. See ``tools/engine_clients/sglang_client.py``.
"""

from __future__ import annotations

from support.engine_harness import assert_same, kv_dirs, need_client, run, without  # noqa: F401  (kv_dirs: fixture)

PAGES = 8


def test_hicache_file_set_get_exists_restart_clear(kv_dirs):
    client = need_client("sglang")

    def store_then_load(kind: str) -> dict:
        args = ("--dir", kv_dirs[kind] / "hicache", "--pages", str(PAGES))
        store = run(client, *args, "--phase", "store", where=kind)
        load = run(client, *args, "--phase", "load", where=kind)
        return {"store": without(store), "load": without(load)}

    plain = store_then_load("plain")
    store, load = plain["store"], plain["load"]
    # What SGLang does on a plain directory (the reference).
    assert store["set_first"] is True and store["batch_set_rest"] is True and store["set_existing_skipped"] is True
    assert store["exists"] == [True] * PAGES + [False]
    assert store["batch_exists_v2"]["kv_hit_pages"] == PAGES
    assert store["get_first_equal"] is True and store["get_missing_is_none"] is True
    assert store["batch_get_equal"] == [True] * PAGES
    assert len(store["tree"]) == PAGES and all(n.endswith("_kvfs-test-tiny-llama_0_1.bin") for n in store["tree"])
    assert load["metadata_cache_exists"] == [True] * PAGES + [False]
    assert load["batch_get_equal"] == [True] * PAGES
    assert load["clear"] is True and load["after_clear"] == [] and load["exists_after_clear"] == [False] * PAGES
    kvfs = store_then_load("kvfs")
    for phase in ("store", "load"):
        assert_same(kvfs[phase], plain[phase], f"SGLang HiCacheFile, {phase} process")
