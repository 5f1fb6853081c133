"""The hash chain is stable across processes and machines: known values are pinned."""

import subprocess
import sys

import pytest

from kvfs.hashing import Namespace, block_hash, block_hash_of, block_path, chain_hashes

NS = Namespace(model="meta/llama", dtype="bfloat16", num_layers=2, num_kv_heads=2, head_size=64, tokens_per_block=4)


def test_known_values():
    assert NS.dirname() == "meta-llama-547f89b7f1eb"
    hs = chain_hashes(NS, list(range(10)))
    assert [h.hex() for h in hs] == ["80025a27ace98dce6f0c725bb0560cd8", "5563c43ada759afd9414bb73cf013ce8"]
    assert block_path(NS, hs[0]) == "meta-llama-547f89b7f1eb/80/80025a27ace98dce6f0c725bb0560cd8"


def test_block_hash_of_reads_back_what_block_path_wrote():
    for digest in chain_hashes(NS, list(range(40))):
        assert block_hash_of(block_path(NS, digest)) == digest
    assert block_hash_of(NS.dirname()) is None


def test_stable_across_processes():
    code = (
        "from kvfs.hashing import Namespace, chain_hashes;"
        "ns=Namespace(model='meta/llama',dtype='bfloat16',num_layers=2,num_kv_heads=2,head_size=64,tokens_per_block=4);"
        "print(chain_hashes(ns, list(range(10)))[1].hex())"
    )
    for seed in ("0", "1", "random"):
        out = subprocess.run(
            [sys.executable, "-c", code], env={"PYTHONHASHSEED": seed}, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == "5563c43ada759afd9414bb73cf013ce8"


def test_chain_depends_on_parent_tokens_extra_and_namespace():
    a = chain_hashes(NS, [1, 2, 3, 4, 5, 6, 7, 8])
    b = chain_hashes(NS, [9, 2, 3, 4, 5, 6, 7, 8])
    assert a[1] != b[1]  # the second block differs because its parent differs
    assert chain_hashes(NS, [1, 2, 3, 4], extra_keys=["lora-a"])[0] != a[0]
    other = Namespace(
        model="meta/llama", dtype="float16", num_layers=2, num_kv_heads=2, head_size=64, tokens_per_block=4
    )
    assert chain_hashes(other, [1, 2, 3, 4])[0] != a[0]
    assert chain_hashes(NS, [1, 2, 3, 4], extra_keys=["ab", "c"]) != chain_hashes(
        NS, [1, 2, 3, 4], extra_keys=["a", "bc"]
    )


def test_partial_blocks():
    assert len(chain_hashes(NS, list(range(7)))) == 1
    assert len(chain_hashes(NS, list(range(7)), partial=True)) == 2


def test_bad_input():
    with pytest.raises(OverflowError):
        block_hash(b"", [2**32])
    with pytest.raises(TypeError):
        block_hash(b"", [1], extra_keys=[1.5])
