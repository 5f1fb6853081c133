"""The transformers prefix cache loading through the GPU agent when a device is given, on
a real kvfs mount: ``device="cpu"`` runs the agent's code path (``prefill`` passes the
model's device), with the same answers as the batch client's path and the file path."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvfs.client import Client
from kvfs.gpu.agent import Agent
from kvfs.gpu.kv_block_file import HEADER_LENGTH
from kvfs.gpu.prefix_cache import PrefixCache, StopReason, generate, prefill
from kvfs.gpu.random_llama import build_model

from support.deadlines import DEADLINE

T = 8


@pytest.fixture(scope="module")
def fp32():
    return build_model("tiny", dtype=torch.float32, seed=1)


def tokens(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_load_with_a_device_goes_through_the_agent_and_stays_in_its_cache(kvfs_mount, fp32):
    mp = kvfs_mount(dram="16MiB", disk="64MiB")
    prompt = tokens(40, seed=3)
    pc = PrefixCache.for_model(mp / "kv", fp32.model, fp32.name, tokens_per_block=T)
    pc.store(prompt, prefill(fp32.model, prompt).cache)
    names = pc.block_names(prompt)
    via_client = pc.load(prompt, fp32.model)  # no device: the batch client's path
    hit = pc.load(prompt, fp32.model, device="cpu")
    agent = pc._agents._own["cpu"]
    assert (hit.tokens, hit.blocks, hit.stop) == (40, 5, StopReason.COMPLETE)
    assert agent.loads["arena"] + agent.loads["file"] == 5 and all(n in agent.cache for n in names)
    for a, b in zip(hit.cache.layers, via_client.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    again = pc.load(prompt, fp32.model, device="cpu")
    assert again.tokens == 40 and agent.loads["hit"] >= 5  # from the agent's cache
    ref = generate(fp32.model, prompt + [5, 6], 3)
    got = generate(fp32.model, prompt + [5, 6], 3, pc)  # prefill passes the model's device
    assert got.cached_tokens == 40 and got.tokens == ref.tokens
    for a, b in zip(ref.logits, got.logits, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    pc.close()


def test_bad_kv_under_a_valid_kvfs_block_stops_the_prefix_and_leaves_the_agent(kvfs_mount, fp32):
    mp = kvfs_mount(dram="16MiB", disk="64MiB")
    prompt = tokens(32, seed=4)
    with Client(mp, write=True) as c, Agent(c, device="cpu", capacity="64MiB") as ag:
        pc = PrefixCache.for_model(mp / "kv", fp32.model, fp32.name, tokens_per_block=T, agent=ag)
        pc.store(prompt, prefill(fp32.model, prompt).cache)
        names = pc.block_names(prompt)
        assert pc.load(prompt, fp32.model).tokens == 32  # the agent is used even without a device
        path = pc.path(pc.digests(prompt)[2])
        data = bytearray(open(path, "rb").read())
        data[HEADER_LENGTH + 100] ^= 0xFF  # a program rewrites the block with bad KV: valid for kvfs
        with open(path, "wb") as f:
            f.write(data)
        c.evict([names[2]], tier="dram")  # and it went to disk: the agent reads its file
        deadline = time.monotonic() + DEADLINE  # the replacement's event marks the cached copy for a re-check
        while names[2] in ag.cache and names[2] not in ag._stale and time.monotonic() < deadline:
            time.sleep(0.02)
        hit = pc.load(prompt, fp32.model)
        assert (hit.tokens, hit.stop) == (16, StopReason.CORRUPT) and "payload checksum mismatch" in hit.detail
        assert names[2] not in ag.cache
        pc.close()
