"""The GPU agent with ``device="cpu"`` against a real daemon (``kvfs mount``) and the real
client: the same code path as on a GPU but the CUDA copies.

- map / load_async / store byte-exact against the daemon's copies (arena and disk files,
  read by NIXL's POSIX backend and by ``preadv``), and across processes;
- the device cache's capacity, eviction order and pins, through the agent;
- a corrupt copy (a flipped byte in a block file, a scribbled arena extent): never wrong
  bytes in the cache; the load falls to the next copy or reports the block missing;
- coherence: a block replaced by another process is re-checked and reloaded;
- two agents in two processes at once.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kvfs.client import BatchError, Client
from kvfs.errors import BlockCorrupt, BlockNotFound, KvfsError
from kvfs.gpu import Agent, AgentConfig
from kvfs.gpu.transfer import TransferUnavailable

from support.configs import dram_over_disk
from support.deadlines import DEADLINE, ENGINE_DEADLINE

MiB = 1 << 20
DATA: dict[Path, Path] = {}  # mountpoint -> its data directory

CONFIG = dram_over_disk("32MiB", "256MiB", "{data}/disk")


def blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def as_bytes(t: torch.Tensor) -> bytes:
    assert t.device.type == "cpu" and t.dtype == torch.uint8
    return bytes(t.numpy())


@pytest.fixture
def mount(kvfs_mount, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    mp = kvfs_mount(CONFIG.format(data=data), data=data)
    DATA[mp] = data
    return mp


def _flip(data: Path, name: str, at: int) -> None:
    f = data / "disk" / "blocks" / name
    raw = bytearray(f.read_bytes())
    raw[4096 + at] ^= 0x10  # a bad byte in the payload, behind kvfs's back
    f.write_bytes(raw)


def _a_corrupt_file_is_never_cached(mount: Path, c: Client, ag: Agent, name: str, at: int) -> None:
    """A block only on disk, with a flipped byte at *at* of its payload: a failed map, not cached."""
    c.put([name], [blob(9, MiB)])
    c.evict([name], tier="dram")
    _flip(DATA[mount], name, at)
    with pytest.raises(BatchError) as exc:
        ag.map([name])
    assert isinstance(exc.value.errors[0], (BlockCorrupt, BlockNotFound)) and name not in ag.cache


@pytest.mark.parametrize("transfer", ["nixl", "posix"])
def test_map_is_byte_exact_from_the_arena_and_from_disk_files(mount, transfer):
    sizes = [0, 1, 4095, 4096, MiB + 3, 2 * MiB]
    names = [f"m/{i:02x}/b{i}" for i in range(len(sizes))]
    with Client(mount, write=True) as c:
        c.put(names, [blob(i, s) for i, s in enumerate(sizes)], parents=[None, *names[:-1]])
        c.evict(names[::2], tier="dram")  # every other block only in a disk file
        assert c.stat(names[0]).tiers == ("disk",) and c.stat(names[1]).tiers == ("dram",)
        with Agent(c, device="cpu", capacity="64MiB", transfer=transfer) as ag:
            assert ag.loader.name == ("nixl-posix" if transfer == "nixl" else "posix")
            got = ag.map(names)
            assert [as_bytes(t) for t in got] == [blob(i, s) for i, s in enumerate(sizes)]
            assert ag.loads["file"] == 3 and ag.loads["arena"] == 3
            assert all("dram" not in c.stat(n).tiers for n in names[::2])  # read straight from the files
            again = ag.map(names)  # hits: the same tensors, no round trip
            assert all(a is b for a, b in zip(got, again)) and ag.loads["hit"] == len(names)
        with pytest.raises(TransferUnavailable, match="kvikio"):
            Agent(c, device="cpu", transfer="kvikio")


def test_auto_picks_nixl_on_the_cpu_and_cuda_without_a_gpu_says_so(mount):
    with Client(mount) as c:
        with Agent(c, device="cpu", watch=False) as ag:
            assert ag.loader.name == "nixl-posix" and ag.passed_over == []
        if not torch.cuda.is_available():
            with pytest.raises(KvfsError, match="no CUDA device.*device='cpu'"):
                Agent(c, device="cuda")
    with pytest.raises(ValueError, match="transfer must be one of auto, kvikio, nixl, posix"):
        AgentConfig(transfer="gds")
    with pytest.raises(ValueError, match="policy must be one of"):
        AgentConfig(policy="nope")
    with pytest.raises(ValueError, match="device must be cpu or cuda"):
        AgentConfig(device="meta")


def test_store_writes_blocks_the_daemon_serves_to_everyone(mount):
    with Client(mount, write=True) as c, Agent(c, device="cpu", capacity="16MiB") as ag:
        kv = [torch.randn(4, 8, 128, dtype=torch.float16) for _ in range(3)]
        names = [f"s/{i}" for i in range(3)]
        ag.store(names, kv, parents=[None, *names[:-1]])
        assert c.stat(names[2]).parent == names[1]
        with Client(mount) as other:  # another session reads what the agent stored
            outs = [np.empty(t.numel() * 2, np.uint8) for t in kv]
            other.get_into(names, outs)
            assert [o.tobytes() for o in outs] == [as_bytes(t.view(torch.uint8).reshape(-1)) for t in kv]
        assert (mount / "s" / "1").read_bytes() == as_bytes(kv[1].view(torch.uint8).reshape(-1))  # and the mount
        back = ag.map(names)
        assert torch.equal(back[0].view(torch.float16).view(4, 8, 128), kv[0])
        kv[0].zero_()  # the caller's tensor is not the cache's
        assert not torch.equal(ag.map(names[:1])[0].view(torch.float16).view(4, 8, 128), kv[0])
    with Client(mount) as ro, Agent(ro, device="cpu", watch=False) as ag:  # a put that fails as a whole
        with pytest.raises(KvfsError, match="read-only"):
            ag.store(["s/ro"], [torch.zeros(16, dtype=torch.uint8)])
        assert "s/ro" not in ag.cache and not ro.lookup(["s/ro"]).present(0)


def test_the_cache_holds_its_capacity_evicts_in_policy_order_and_honours_pins(mount):
    names = [f"e/{i}" for i in range(8)]
    with Client(mount, write=True) as c:
        c.put(names, [blob(i, MiB) for i in range(8)])
        with Agent(c, device="cpu", capacity=3 * MiB, policy="lru") as ag:
            ag.map(names[:3])  # 0 1 2
            ag.map(names[:1])  # touch 0: 1 is the least recently used now
            ag.map(names[3:4])
            assert [n for n in names if n in ag.cache] == [names[0], names[2], names[3]]
            ag.pin([names[2]])
            ag.map(names[4:6])  # two more: 0 and 3 go, the pinned 2 stays
            assert [n for n in names if n in ag.cache] == [names[2], names[4], names[5]]
            assert ag.stats().used <= 3 * MiB and ag.stats().pinned == 1
            ag.pin([names[4], names[5]])  # all pinned: a new block is served but not cached
            [t] = ag.map(names[6:7])
            assert as_bytes(t) == blob(6, MiB) and names[6] not in ag.cache and ag.stats().refused == 1
            ag.unpin(names[4:6])
            ag.map(names[7:8])
            assert names[7] in ag.cache and names[2] in ag.cache and ag.stats().used <= 3 * MiB
        with Agent(c, device="cpu", capacity=MiB - 1) as small:  # larger than the whole cache
            [t] = small.map(names[:1])
            assert as_bytes(t) == blob(0, MiB) and len(small.cache) == 0


def test_load_async_fires_one_event_per_block_and_reports_misses(mount):
    names = [f"a/{i}" for i in range(10)]
    with Client(mount, write=True) as c:
        c.put(names, [blob(i, 2 * MiB) for i in range(10)])
        c.evict(names, tier="dram")
        with Agent(c, device="cpu", capacity="64MiB", batch=2) as ag:
            ag.map(names[:1])
            loading = ag.load_async([*names, "a/none", names[3]])
            assert loading.events[0].ready()  # the cached block is ready at once
            for i, ev in enumerate(loading.events[:10]):
                assert as_bytes(ev.wait(30)) == blob(i, 2 * MiB)
            with pytest.raises(BlockNotFound):
                loading.events[10].wait(30)
            assert loading.events[11].wait(30) is loading.events[3].wait(30)
            with pytest.raises(BatchError) as exc:
                loading.result(30)
            assert list(exc.value.errors) == [10] and isinstance(exc.value.results[2], torch.Tensor)
            with pytest.raises(BatchError) as exc:
                ag.map(["a/none"])
            assert isinstance(exc.value.errors[0], BlockNotFound)


def test_a_flipped_byte_in_a_disk_file_never_reaches_the_cache(mount):
    with Client(mount, write=True) as c:
        c.put(["d/a", "d/b"], [blob(1, MiB), blob(2, MiB)])
        c.evict(["d/a", "d/b"], tier="dram")
        _flip(DATA[mount], "d/a", 1234)
        with Agent(c, device="cpu", capacity="8MiB") as ag:
            with pytest.raises(BatchError) as exc:
                ag.map(["d/a", "d/b"])
            assert isinstance(exc.value.errors[0], (BlockCorrupt, BlockNotFound))
            assert as_bytes(exc.value.results[1]) == blob(2, MiB)  # the good one loaded
            assert "d/a" not in ag.cache and ag.loads["corrupt"] == 1
            assert not c.lookup(["d/a"]).present(0)  # the daemon dropped its only copy
        with Agent(c, device="cpu", transfer="posix") as ag:  # the same through preadv
            _a_corrupt_file_is_never_cached(mount, c, ag, "d/c", at=0)


def test_a_scribbled_arena_copy_falls_to_the_disk_copy(mount):
    with Client(mount, write=True) as c:
        c.put(["x/a"], [blob(7, MiB)])
        c.evict(["x/a"], tier="dram")
        c.prefetch(["x/a"], tier="dram")  # two copies now: DRAM and disk
        assert set(c.stat("x/a").tiers) == {"dram", "disk"}
        [h] = c.lease(["x/a"], promote="always")
        assert h.kind == "arena"
        c.arena[h.offset + 100] ^= 0xFF  # a writer scribbles on the committed extent
        h.release()
        with Agent(c, device="cpu") as ag:
            [t] = ag.map(["x/a"])
            assert as_bytes(t) == blob(7, MiB)  # the disk copy, checked
            assert ag.loads["corrupt"] == 1 and ag.loads["file"] == 1
        assert c.stat("x/a").tiers == ("disk",)  # the daemon dropped the bad DRAM copy


def test_a_block_replaced_by_another_process_is_reloaded(mount):
    with Client(mount, write=True) as c, Agent(c, device="cpu", capacity="16MiB") as ag:
        c.put(["r/a"], [blob(1, MiB)])
        assert as_bytes(ag.map(["r/a"])[0]) == blob(1, MiB)
        code = textwrap.dedent(f"""
            import random
            from kvfs.client import Client
            with Client({str(mount)!r}, write=True) as c:
                c.put(["r/a"], [random.Random(2).randbytes({MiB})])
        """)
        subprocess.run([sys.executable, "-c", code], check=True, timeout=DEADLINE)
        deadline = time.monotonic() + DEADLINE
        while True:  # the event arrives within milliseconds; never any bytes but old or new
            got = as_bytes(ag.map(["r/a"])[0])
            assert got in (blob(1, MiB), blob(2, MiB))
            if got == blob(2, MiB) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert got == blob(2, MiB)
        os.unlink(mount / "r" / "a")
        deadline = time.monotonic() + DEADLINE
        while "r/a" in ag.cache and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(BatchError):
            ag.map(["r/a"])


AGENT_PROC = """
import hashlib, json, random, sys, torch
from kvfs.client import Client
from kvfs.gpu.agent import Agent
mp, me, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = {{}}
with Client(mp, write=True, name=f"agent {{me}}") as c, Agent(c, device="cpu", capacity="{cap}") as ag:
    mine = [f"p{{me}}/{{i}}" for i in range(n)]
    ag.store(mine, [torch.frombuffer(bytearray(random.Random(me * 1000 + i).randbytes({size})), dtype=torch.uint8)
                    for i in range(n)])
    shared = [f"shared/{{i}}" for i in range(n)]
    for rnd in range(3):
        for t, i in zip(ag.map(shared), range(n)):
            assert bytes(t.numpy()) == random.Random(i).randbytes({size}), (rnd, i)
        ag.evict(shared[rnd::3])
    print(json.dumps({{"ok": True, "loads": ag.loads}}))
"""


def test_two_agents_in_two_processes_at_once(mount, tmp_path):
    n, size = 12, MiB
    with Client(mount, write=True) as c:
        shared = [f"shared/{i}" for i in range(n)]
        c.put(shared, [blob(i, size) for i in range(n)])
        c.evict(shared[::2], tier="dram")
    script = tmp_path / "agent_proc.py"
    script.write_text(AGENT_PROC.format(cap=f"{6 * size}", size=size))
    procs = [
        subprocess.Popen([sys.executable, str(script), str(mount), str(me), str(n)], stdout=subprocess.PIPE, text=True)
        for me in (1, 2)
    ]
    outs = [p.communicate(timeout=ENGINE_DEADLINE)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for o in outs:
        res = json.loads(o.strip().splitlines()[-1])
        assert res["ok"] and res["loads"]["file"] + res["loads"]["arena"] >= n
    with Client(mount) as c:  # each one's stores, read back by a third session
        for me in (1, 2):
            outs_ = [np.empty(size, np.uint8) for _ in range(n)]
            c.get_into([f"p{me}/{i}" for i in range(n)], outs_)
            assert [o.tobytes() for o in outs_] == [blob(me * 1000 + i, size) for i in range(n)]


NO_CUDA = None if torch.cuda.is_available() else "no CUDA device"


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA is not None, reason=f"skipped: {NO_CUDA}")
@pytest.mark.parametrize("transfer", ["auto", "kvikio", "nixl", "posix"])
def test_on_a_gpu_map_store_and_a_corrupt_file_are_right_in_device_memory(mount, transfer):
    sizes = [1, 4096, 2 * MiB + 3, 2 * MiB]
    names = [f"g/{i}" for i in range(len(sizes))]
    with Client(mount, write=True) as c:
        c.put(names, [blob(i, s) for i, s in enumerate(sizes)])
        c.evict(names[::2], tier="dram")
        try:
            ag = Agent(c, device="cuda", capacity="64MiB", transfer=transfer)
        except TransferUnavailable as exc:
            pytest.skip(f"skipped: {exc}")
        with ag:
            got = ag.map(names)
            assert all(t.device.type == "cuda" for t in got)
            assert [bytes(t.cpu().numpy()) for t in got] == [blob(i, s) for i, s in enumerate(sizes)]
            kv = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
            ag.store(["g/kv"], [kv])
            out = np.empty(kv.numel() * 2, np.uint8)
            c.get_into(["g/kv"], [out])
            assert out.tobytes() == bytes(kv.view(torch.uint8).reshape(-1).cpu().numpy())
            _a_corrupt_file_is_never_cached(mount, c, ag, "g/bad", at=4321)
