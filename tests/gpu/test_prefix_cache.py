"""The transformers prefix cache: cached-prefix output equals a full recomputation.

Real parts throughout: a real transformers Llama model (random weights, tiny), real
files, real torch tensors. Every test runs twice: on a real kvfs FUSE mount and, for
reference, on a plain directory (``kv_dir``).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvfs.errors import BlockCorrupt, KvfsError
from kvfs.gpu.kv_block_file import HEADER_LENGTH, KVBlockHeader, decode_header, encode_header
from kvfs.gpu.prefix_cache import (
    PrefixCache,
    StopReason,
    UnsupportedModel,
    cache_from_tensors,
    generate,
    namespace_for,
    prefill,
)
from kvfs.gpu.random_llama import build_model
from kvfs.hashing import block_path

T = 8  # tokens per block in these tests


@pytest.fixture(params=["kvfs", "plain-dir"])
def kv_dir(request, tmp_path):
    if request.param == "plain-dir":
        return tmp_path
    return request.getfixturevalue("kvfs_mount")(dram="16MiB", disk="64MiB")


@pytest.fixture(scope="module")
def fp32():
    return build_model("tiny", dtype=torch.float32, seed=1)


@pytest.fixture(scope="module")
def bf16():
    return build_model("tiny", dtype=torch.bfloat16, seed=1)


def tokens(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_same_generation(ref, got, dtype):
    assert got.tokens == ref.tokens
    for a, b in zip(ref.logits, got.logits, strict=True):
        if dtype is torch.float32:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        else:
            assert int(a.argmax()) == int(b.argmax())
            torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("n", [40, 43])  # a whole number of blocks, and a partial final block
def test_cached_prefix_matches_full_recompute(request, kv_dir, dtype_name, n):
    rm = request.getfixturevalue(dtype_name)
    dtype = next(rm.model.parameters()).dtype
    prompt = tokens(n)
    pc = PrefixCache.for_model(kv_dir, rm.model, rm.name, tokens_per_block=T)
    ref = generate(rm.model, prompt, 6)  # no prefix cache: full recomputation
    first = generate(rm.model, prompt, 6, pc)  # cold: computes and stores
    assert first.cached_tokens == 0
    assert_same_generation(ref, first, dtype)
    again = generate(rm.model, prompt, 6, pc)  # warm: loads the prefix
    # The last token is always computed; only full blocks are stored.
    assert again.cached_tokens == min((n // T) * T, n - 1)
    assert_same_generation(ref, again, dtype)


def test_loaded_kv_is_bit_identical_and_so_is_the_output(kv_dir, fp32):
    """Loading is exact: the KV read back equals the KV computed, bit for bit, and the
    logits equal those computed from the same prefix held in process memory."""
    prompt = tokens(37, seed=3)
    pc = PrefixCache.for_model(kv_dir, fp32.model, fp32.name, tokens_per_block=T)
    full = prefill(fp32.model, prompt)
    res = pc.store(prompt, full.cache)
    assert (res.written, res.present) == (4, 0)
    hit = pc.load(prompt, fp32.model)
    assert (hit.tokens, hit.blocks, hit.stop) == (32, 4, StopReason.COMPLETE)
    for a, b in zip(full.cache.layers, hit.cache.layers, strict=True):
        assert torch.equal(a.keys[:, :, :32], b.keys)
        assert torch.equal(a.values[:, :, :32], b.values)
    kv = [(layer.keys, layer.values) for layer in full.cache.layers]
    ideal = prefill(fp32.model, prompt, cache=cache_from_tensors(fp32.model, kv, 32))
    warm = prefill(fp32.model, prompt, pc)
    assert warm.cached_tokens == 32
    assert torch.equal(warm.logits, ideal.logits)
    torch.testing.assert_close(warm.logits, full.logits, rtol=1e-5, atol=1e-5)


def test_files_are_named_by_the_kvfs_chain_and_partial_blocks_are_not_written(kv_dir, fp32):
    prompt = tokens(21)
    pc = PrefixCache.for_model(kv_dir, fp32.model, fp32.name, tokens_per_block=T)
    pc.store(prompt, prefill(fp32.model, prompt).cache)
    ns = namespace_for(fp32.model, fp32.name, tokens_per_block=T)
    digests = pc.digests(prompt)
    assert len(digests) == 2  # 21 tokens: two full blocks, the 5-token tail is not cached
    expected = sorted(str(kv_dir / block_path(ns, d)) for d in digests)
    found = sorted(str(p) for p in kv_dir.rglob("*") if p.is_file())
    assert found == expected
    size = HEADER_LENGTH + 2 * 2 * T * 2 * 16 * 4  # layers * K/V * tokens * heads * dim * fp32
    assert all(os.path.getsize(p) == size for p in found)
    assert pc.lookup(prompt) == 16
    # Storing again writes nothing: blocks are written once.
    again = pc.store(prompt, prefill(fp32.model, prompt).cache)
    assert (again.written, again.present) == (0, 2)


def test_a_longer_request_extends_the_stored_prefix(kv_dir, fp32):
    """Multi-turn: each turn reuses the previous turn's blocks and stores its own."""
    pc = PrefixCache.for_model(kv_dir, fp32.model, fp32.name, tokens_per_block=T)
    convo = tokens(20, seed=5)
    prev_len = 0
    for turn in range(3):
        ref = generate(fp32.model, convo, 3)
        got = generate(fp32.model, convo, 3, pc)
        assert got.cached_tokens == (0 if turn == 0 else (prev_len // T) * T)
        assert_same_generation(ref, got, torch.float32)
        prev_len = len(convo) + len(got.tokens) - 1  # KV of prompt + output (bar the last)
        convo = convo + got.tokens + tokens(11, seed=10 + turn)


def rewrite(path, data: bytes) -> None:
    """Replace the file's bytes. kvfs blocks are immutable once sealed, so damage is done the
    way kvfs allows, by an O_TRUNC rewrite: the engine's own checks must catch it."""
    with open(path, "wb") as f:
        f.write(data)


def flip_bytes(path, offset, n=4):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[offset : offset + n] = bytes(b ^ 0xFF for b in data[offset : offset + n])
    rewrite(path, bytes(data))


@pytest.mark.parametrize("damage", ["payload", "header", "truncate", "missing", "wrong-name"])
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("io_threads", [1, 4])  # one by one, and read ahead by a pool
def test_a_bad_block_in_the_middle_stops_the_prefix_there(request, kv_dir, dtype_name, damage, io_threads):
    rm = request.getfixturevalue(dtype_name)
    dtype = next(rm.model.parameters()).dtype
    prompt = tokens(45, seed=7)
    pc = PrefixCache.for_model(kv_dir, rm.model, rm.name, tokens_per_block=T, io_threads=io_threads)
    pc.store(prompt, prefill(rm.model, prompt).cache)
    paths = [pc.path(d) for d in pc.digests(prompt)]
    assert len(paths) == 5
    bad = paths[2]
    if damage == "payload":
        flip_bytes(bad, HEADER_LENGTH + 1000)
    elif damage == "header":
        flip_bytes(bad, 20)
    elif damage == "truncate":
        with open(bad, "rb") as f:
            rewrite(bad, f.read()[:-1])
    elif damage == "missing":
        os.unlink(bad)
    else:  # another block's bytes under this block's name
        os.replace(paths[4], bad)

    hit = pc.load(prompt, rm.model)
    assert (hit.tokens, hit.blocks, hit.wanted) == (16, 2, 5)
    assert hit.stop is (StopReason.MISSING if damage == "missing" else StopReason.CORRUPT)
    # The invalid file is removed so that the next store can write a good one.
    assert not os.path.exists(bad)

    ref = generate(rm.model, prompt, 4)
    got = generate(rm.model, prompt, 4, pc)
    assert got.cached_tokens == 16
    assert_same_generation(ref, got, dtype)
    # That run stored the block again: the whole prefix is back.
    assert pc.load(prompt, rm.model).blocks == 5


def test_a_block_of_another_layout_is_rejected(kv_dir, fp32, bf16):
    """A bf16 file where an fp32 block belongs never loads (its header says bf16)."""
    prompt = tokens(16)
    p32 = PrefixCache.for_model(kv_dir, fp32.model, fp32.name, tokens_per_block=T)
    p16 = PrefixCache.for_model(kv_dir, bf16.model, bf16.name, tokens_per_block=T)
    assert p32.namespace.dirname() != p16.namespace.dirname()
    p16.store(prompt, prefill(bf16.model, prompt).cache)
    d = p32.digests(prompt)[0]
    os.makedirs(os.path.dirname(p32.path(d)), exist_ok=True)
    os.replace(p16.path(p16.digests(prompt)[0]), p32.path(d))
    hit = p32.load(prompt, fp32.model)
    assert (hit.tokens, hit.stop) == (0, StopReason.CORRUPT)
    assert "size" in hit.detail or "layout" in hit.detail or "bytes" in hit.detail


def test_extra_keys_and_block_size_separate_caches(kv_dir, fp32):
    prompt = tokens(32)
    a = PrefixCache.for_model(kv_dir, fp32.model, fp32.name, tokens_per_block=T, extra_keys=("lora-a",))
    b = PrefixCache.for_model(kv_dir, fp32.model, fp32.name, tokens_per_block=T, extra_keys=("lora-b",))
    c = PrefixCache.for_model(kv_dir, fp32.model, fp32.name, tokens_per_block=16, extra_keys=("lora-a",))
    a.store(prompt, prefill(fp32.model, prompt).cache)
    assert a.lookup(prompt) == 32
    assert b.lookup(prompt) == 0
    assert c.lookup(prompt) == 0


def test_short_prompts_and_empty_directory(kv_dir, fp32):
    pc = PrefixCache.for_model(kv_dir / "not-yet", fp32.model, fp32.name, tokens_per_block=T)
    hit = pc.load(tokens(5), fp32.model)
    assert (hit.tokens, hit.wanted, hit.stop) == (0, 0, StopReason.COMPLETE)
    hit = pc.load(tokens(9), fp32.model)
    assert (hit.tokens, hit.wanted, hit.stop) == (0, 1, StopReason.MISSING)
    ref = generate(fp32.model, tokens(3), 2)
    assert generate(fp32.model, tokens(3), 2, pc).tokens == ref.tokens
    # A prompt of exactly one block: the block is stored; the next request loads it and
    # computes only the last token.
    one = tokens(T, seed=9)
    generate(fp32.model, one, 1, pc)
    again = prefill(fp32.model, one, pc)
    assert again.cached_tokens == T - 1
    torch.testing.assert_close(again.logits, prefill(fp32.model, one).logits, rtol=1e-5, atol=1e-5)


def test_unsupported_models_are_refused(kv_dir, fp32):
    with pytest.raises(UnsupportedModel, match="KV dtype"):
        namespace_for(fp32.model, fp32.name, dtype=torch.int8)
    pc = PrefixCache.for_model(kv_dir, fp32.model, fp32.name, tokens_per_block=T)
    batch = prefill(fp32.model, tokens(16)).cache
    for layer in batch.layers:
        layer.keys = layer.keys.repeat(2, 1, 1, 1)
        layer.values = layer.values.repeat(2, 1, 1, 1)
    with pytest.raises(UnsupportedModel, match="expected a \\[1, heads, tokens, dim\\] cache"):
        pc.store(tokens(16), batch)


def test_header_round_trip_and_checks():
    h = KVBlockHeader(
        dtype="bfloat16",
        num_layers=2,
        num_kv_heads=2,
        head_size=16,
        tokens=8,
        payload_length=KVBlockHeader.payload_length_of("bfloat16", 2, 2, 16, 8),
        checksum=123,
        digest=b"\x01" * 16,
    )
    raw = encode_header(h)
    assert len(raw) == HEADER_LENGTH
    assert decode_header(raw) == h
    with pytest.raises(BlockCorrupt, match="bad magic"):
        decode_header(b"x" * 100)
    bad = bytearray(raw)
    bad[17] ^= 1
    with pytest.raises(BlockCorrupt, match="header checksum mismatch"):
        decode_header(bad)


def test_the_load_buffer_is_reused_only_when_nothing_holds_it(kv_dir, fp32):
    a, b = tokens(32, seed=11), tokens(32, seed=12)
    pc = PrefixCache.for_model(kv_dir, fp32.model, fp32.name, tokens_per_block=T)
    ca, cb = prefill(fp32.model, a).cache, prefill(fp32.model, b).cache
    pc.store(a, ca)
    pc.store(b, cb)
    hit_a = pc.load(a, fp32.model)
    hit_b = pc.load(b, fp32.model)  # hit_a still holds the pooled buffer: a new one is used
    for layer_a, layer_b, held in zip(ca.layers, cb.layers, hit_a.cache.layers, strict=True):
        assert torch.equal(held.keys, layer_a.keys)
        assert not torch.equal(held.keys, layer_b.keys)
    ptr = hit_b.cache.layers[0].keys.data_ptr()
    del hit_a, hit_b, held
    again = pc.load(a, fp32.model)  # nothing holds the pool now: it is reused
    assert again.cache.layers[0].keys.data_ptr() == ptr
    assert torch.equal(again.cache.layers[0].keys, ca.layers[0].keys)
    # A forward pass extends the cache (new tensors), which releases the buffer.
    del again
    warm = prefill(fp32.model, a + [1, 2, 3], pc)
    assert warm.cached_tokens == 32
    assert pc.load(b, fp32.model).cache.layers[0].keys.data_ptr() == ptr


def test_the_block_format_and_the_core_do_not_import_torch():
    import subprocess
    import sys

    code = "import sys, kvfs, kvfs.gpu.kv_block_file; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_on_a_kvfs_mount_the_batch_client_carries_the_blocks(kvfs_mount, fp32):
    """On a mount the blocks go through the batch client: each carries its chain parent
    (prefix-aware eviction), which the file path cannot give; ``client=False`` forces the
    file path, and both read each other's blocks."""
    from kvfs.client import Client

    mp = kvfs_mount(dram="16MiB", disk="64MiB")
    prompt = tokens(32, seed=3)
    pc = PrefixCache.for_model(mp / "kv", fp32.model, fp32.name, tokens_per_block=T)
    files = PrefixCache.for_model(mp / "kv", fp32.model, fp32.name, tokens_per_block=T, client=False)
    assert pc.store(prompt, prefill(fp32.model, prompt).cache).written == 4
    names = [os.path.relpath(pc.path(d), mp) for d in pc.digests(prompt)]
    with Client(mp) as c:
        assert [c.stat(n).parent for n in names] == [None, *names[:-1]]
    assert files.lookup(prompt) == pc.lookup(prompt) == 32
    hit, hit_files = pc.load(prompt, fp32.model), files.load(prompt, fp32.model)
    assert (hit.tokens, hit.stop) == (hit_files.tokens, hit_files.stop) == (32, StopReason.COMPLETE)
    for a, b in zip(hit.cache.layers, hit_files.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    other = tokens(16, seed=4)
    files.store(other, prefill(fp32.model, other).cache)  # written as files, read by the client
    assert pc.load(other, fp32.model).tokens == 16
    # a program rewrote block 1 with bad KV (a valid kvfs block: its own checksum matches),
    # and it went down to the disk tier: the client reads it straight from its file
    flip_bytes(pc.path(pc.digests(prompt)[1]), HEADER_LENGTH + 64)
    with Client(mp) as c:
        c.evict([names[1]], tier="dram")
        assert c.stat(names[1]).tiers == ("disk",)
    hit = pc.load(prompt, fp32.model)
    assert (hit.tokens, hit.stop) == (8, StopReason.CORRUPT) and "payload checksum mismatch" in hit.detail
    pc.close()
    files.close()
    with pytest.raises(KvfsError, match="not on a kvfs mount"):
        PrefixCache.for_model("/tmp", fp32.model, fp32.name, tokens_per_block=T, client=True)


def test_a_daemon_that_dies_makes_blocks_unreadable_not_an_exception(kvfs_mount, fp32):
    import signal

    from kvfs.runtime import pid_path

    mp = kvfs_mount(dram="16MiB", disk="64MiB")
    prompt = tokens(24, seed=5)
    pc = PrefixCache.for_model(mp / "kv", fp32.model, fp32.name, tokens_per_block=T)
    pc.store(prompt, prefill(fp32.model, prompt).cache)
    assert pc.load(prompt, fp32.model).tokens == 24
    os.kill(int(pid_path(mp).read_text()), signal.SIGKILL)
    hit = pc.load(prompt, fp32.model)
    assert (hit.tokens, hit.stop) == (0, StopReason.UNREADABLE) and "not answering" in hit.detail
    assert pc.lookup(prompt) == 0
    pc.close()
