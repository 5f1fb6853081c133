"""Namespaces and quotas in the store, on real DRAM (shared memory) and disk tiers.

A namespace over its quota in a tier evicts its own blocks there by policy, never
another's; ``used <= quota`` holds after every step of random workloads, counted from the
catalog and, on disk, from the files; all-pinned over quota is ENOSPC for that namespace
only. docs/tenants.md.
"""

from __future__ import annotations

import os
import random

import pytest

from kvfs.config import DiskConfig, DramConfig, NamespaceConfig, PolicyConfig, parse_config
from kvfs.errors import BlockNotFound, ConfigError, CrossNamespace, LastCopy, NamespaceRetired, NoSpace
from kvfs.events import EventKind
from kvfs.names import TierName
from kvfs.namespaces import fingerprint_warnings
from kvfs.store import Store
from kvfs.tiers.disk import DiskTier
from kvfs.tiers.dram import DramTier

from support.stores import Clock

BLOCK = 64 << 10
DISK_FP = BLOCK + 4096  # a disk copy: header + payload rounded to 4 KiB


@pytest.fixture
def make_store(tmp_path):
    stores: list[Store] = []

    def make(*, dram_blocks=8, disk_bytes=64 << 20, namespaces=(), eviction="lru", path=None) -> Store:
        built = [
            DramTier(DramConfig(name=TierName("dram"), capacity=dram_blocks * BLOCK, mlock=False, prefault=False)),
            DiskTier(DiskConfig(name=TierName("disk"), capacity=disk_bytes, path=path or tmp_path / "disk")),
        ]
        s = Store(built, policy=PolicyConfig(eviction=eviction), clock=Clock(), namespaces=namespaces)
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()


def blob(i: int, size: int = BLOCK) -> bytes:
    return random.Random(i).randbytes(size)


def ns(path: str, **quota: int) -> NamespaceConfig:
    return NamespaceConfig(path=path, quota=dict(quota))


def used(store: Store, path: str) -> dict[str, int]:
    [st] = store.namespace_statistics(path)
    return {t: u for t, u, _, _, _ in st.tiers}


def copies(store: Store, prefix: str) -> set[tuple[str, str]]:
    """``(block, tier)`` of every copy under *prefix*."""
    return {(b.name, t) for b in store.walk(prefix) for t in b.tiers}


def check_quotas(store: Store, tmp_path, step) -> None:
    """Every namespace within every quota, by the catalog, by the records and on disk;
    nothing left reserved."""
    for nst in store.namespace_statistics():
        for tier, u, quota, _, _ in nst.tiers:
            if quota is not None:
                assert u <= quota, (step, nst.path, tier, u, quota)
        records = {t: 0 for t, *_ in nst.tiers}
        for b in store.walk(nst.path):
            for t in b.tiers:
                records[t] += store.tiers[store.tier_index(t)].footprint(b.name, b.size)
        assert records == used(store, nst.path), step
        d = tmp_path / "disk" / "blocks" / nst.path
        # a file of block format 3 is the payload alone, counted in whole 4 KiB pages
        on_disk = sum(-(-os.path.getsize(os.path.join(r, f)) // 4096) * 4096 for r, _, fs in os.walk(d) for f in fs)
        assert on_disk == used(store, nst.path)["disk"], (step, nst.path)
    for state in store.namespaces:
        assert state.reserved == [0, 0], step


def test_quota_held_after_every_step_of_random_workloads(make_store, tmp_path):
    """Tight tiers and tight quotas: puts, reads, deletes, pins, soft pins, renames within a
    namespace, evictions; after every step every namespace is within every quota."""
    s = make_store(
        dram_blocks=8,
        disk_bytes=30 * DISK_FP,
        namespaces=(ns("a", dram=3 * BLOCK, disk=10 * DISK_FP), ns("b", dram=2 * BLOCK), ns("c", disk=4 * DISK_FP)),
    )
    rng = random.Random(15)
    spaces = ["a", "b", "c", "free"]
    for step in range(500):
        space = rng.choice(spaces)
        name = f"{space}/{rng.randrange(4):02x}/{rng.randrange(12)}"
        op = rng.random()
        try:
            if op < 0.45:
                s.put(name, blob(step, rng.choice([BLOCK, BLOCK // 2, 5000])))
            elif op < 0.7:
                s.read(name)
            elif op < 0.78:
                s.delete(name)
            elif op < 0.86:
                s.pin(name, rng.random() < 0.4, ttl=rng.choice([None, 3.0]))
            elif op < 0.92:
                s.rename(name, f"{space}/{rng.randrange(4):02x}/{rng.randrange(12)}")
            elif op < 0.96:
                s.evict(name, force=True)
            else:
                s.sweep()
        except (BlockNotFound, NoSpace, LastCopy):
            pass
        check_quotas(s, tmp_path, step)
    stats = {st.path: st for st in s.namespace_statistics()}
    assert all(sum(ev for *_, ev in stats[p].tiers) > 0 for p in ("a", "b", "c"))  # the quotas were reached


@pytest.mark.parametrize("eviction", ["lru", "session-arc", "s3fifo"])
def test_eviction_is_confined_to_the_namespace_over_its_quota(make_store, eviction):
    """Roomy tiers, tight quotas: every put into one namespace leaves every copy of every
    other namespace where it was."""
    s = make_store(
        dram_blocks=64,
        namespaces=(ns("a", dram=3 * BLOCK, disk=5 * DISK_FP), ns("b", dram=2 * BLOCK, disk=3 * DISK_FP)),
        eviction=eviction,
    )
    rng = random.Random(3)
    for step in range(300):
        space = rng.choice(["a", "b", "free"])
        others = {o: copies(s, o) for o in ("a", "b", "free") if o != space}
        name = f"{space}/{rng.randrange(30)}"
        if rng.random() < 0.7:
            s.put(name, blob(step))
        else:
            try:
                s.read(name)
            except BlockNotFound:
                pass
        for o, before in others.items():
            assert copies(s, o) == before, (step, space, o)
    evicted = [e for e in s.events.drain() if e.kind is EventKind.EVICTED and e.detail == "quota"]
    assert evicted  # the quotas did make room, and only within their namespaces
    stats = {st.path: st for st in s.namespace_statistics()}
    assert sum(ev for *_, ev in stats["a"].tiers) + sum(ev for *_, ev in stats["b"].tiers) == len(evicted)


def test_a_namespace_over_its_quota_evicts_its_own_least_recent_block(make_store):
    s = make_store(dram_blocks=16, namespaces=(ns("a", dram=2 * BLOCK),))
    s.put("b/1", blob(1))
    s.put("a/1", blob(2))
    s.put("a/2", blob(3))
    s.read("a/1")  # a/2 is now a's least recent
    s.put("a/3", blob(4))
    assert s.stat("a/2").tiers == ("disk",)  # demoted (its last copy), not lost
    assert s.stat("a/1").tiers == ("dram",) and s.stat("a/3").tiers == ("dram",)
    assert s.stat("b/1").tiers == ("dram",)
    assert used(s, "a")["dram"] == 2 * BLOCK


def test_all_pinned_over_quota_is_enospc_for_that_namespace_only(make_store):
    s = make_store(dram_blocks=16, namespaces=(ns("a", dram=2 * BLOCK, disk=2 * DISK_FP), ns("b", dram=BLOCK)))
    for i in range(4):
        s.put(f"a/{i}", blob(i))
        s.pin(f"a/{i}")
    assert {s.stat(f"a/{i}").tiers for i in range(4)} == {("dram",), ("disk",)}
    with pytest.raises(NoSpace, match=r"within namespace 'a''s quotas: dram holds namespace 'a' at its quota"):
        s.put("a/4", blob(4))
    with pytest.raises(BlockNotFound):
        s.stat("a/4")
    for i in range(6):  # b and blocks of no namespace go on (b over its dram quota lands on disk)
        s.put(f"b/{i}", blob(10 + i))
        s.put(f"free/{i}", blob(20 + i))
    assert s.read("b/0") == blob(10)
    [a] = s.namespace_statistics("a")
    assert a.refused == 1
    s.pin("a/0", False)
    s.put("a/4", blob(4))  # room again: a/0 made way
    assert s.read("a/4") == blob(4)


def test_old_versions_held_by_readers_count_against_the_quota_and_the_tier(make_store):
    """Issue 20, item 3: a namespace writes new versions of one block while a reader holds
    every old one. Their DRAM keeps its room until released, so it counts: against the
    namespace's quota (its next versions go to disk, its own blocks make way) and the
    tier's used bytes (statistics and df tell the truth) — never another's blocks pushed
    out of DRAM for it."""
    s = make_store(dram_blocks=8, namespaces=(ns("a", dram=4 * BLOCK), ns("b")))
    for i in range(4):
        s.put(f"b/{i}", blob(100 + i))
    held = []
    for v in range(12):
        s.put("a/x", blob(v))
        held.append(s.open("a/x"))  # a reader keeps this version, whole
        assert {b.name: b.tiers for b in s.walk("b")} == {f"b/{i}": ("dram",) for i in range(4)}, v
        [a] = s.namespace_statistics("a")
        assert {t: u for t, u, *_ in a.tiers}["dram"] <= 4 * BLOCK, v
    dram = s.statistics().tiers[0]
    assert dram.used == dram.capacity - s.tiers[0].free_bytes, "used counts every byte the arena gives out"
    assert dram.used == 8 * BLOCK  # b's 4 blocks and a's 4 blocks' worth: its held versions (a/x went to disk)
    assert s.stat("a/x").tiers == ("disk",)
    for v, ref in enumerate(held):
        assert bytes(ref.data) == blob(v)  # every reader kept its version
        ref.release()
    s.put("a/y", blob(50))  # released: the room is a's again
    assert s.stat("a/y").tiers == ("dram",)
    dram = s.statistics().tiers[0]
    assert dram.used == dram.capacity - s.tiers[0].free_bytes
    [a] = s.namespace_statistics("a")
    assert {t: u for t, u, *_ in a.tiers}["dram"] == sum(
        s.tiers[0].footprint(b.name, b.size) for b in s.walk("a") if "dram" in b.tiers
    )


def test_the_dram_tier_reports_each_held_copy_it_drops_and_frees():
    """What the store counts held (Tier.held_changes): a copy dropped while a reader
    holds it, then its release; one dropped and released between two drains is never
    reported; an idle copy's room is free at once."""
    t = DramTier(DramConfig(name=TierName("dram"), capacity=8 * BLOCK, mlock=False, prefault=False))
    try:
        t.put("a/x", blob(1), 1)
        ref = t.open("a/x")
        t.put("a/x", blob(2), 2)  # replaced while held
        [c] = t.held_changes()
        assert (c.name, c.size) == ("a/x", BLOCK) and t.held_changes() == []
        ref.release()
        [d] = t.held_changes()
        assert (d.token, d.size) == (c.token, -BLOCK)
        ref = t.open("a/x")
        t.delete("a/x")  # dropped while held, released before the next drain
        ref.release()
        assert t.held_changes() == []
        t.put("a/y", blob(3), 3)
        t.delete("a/y")  # nobody held it
        assert t.held_changes() == [] and t.free_bytes == 8 * BLOCK
    finally:
        t.close()


def test_a_block_larger_than_the_quota_goes_to_a_tier_without_one(make_store, tmp_path):
    s = make_store(namespaces=(ns("a", dram=BLOCK),))
    s.put("a/big", blob(1, 2 * BLOCK))
    assert s.stat("a/big").tiers == ("disk",)
    s = make_store(path=tmp_path / "disk2", namespaces=(ns("z", dram=0),))
    s.put("z/x", blob(2))  # a quota of 0: the namespace does not use that tier
    assert s.stat("z/x").tiers == ("disk",)


def test_lowering_a_quota_evicts_down_to_it_now(make_store):
    s = make_store(dram_blocks=16)
    for i in range(6):
        s.put(f"a/{i}", blob(i))
    s.put("b/0", blob(9))
    st = s.set_quota("a", "dram", 2 * BLOCK)
    assert {t: (u, q) for t, u, q, _, _ in st.tiers}["dram"] == (2 * BLOCK, 2 * BLOCK)
    assert sorted(b.name for b in s.walk("a") if "dram" in b.tiers) == ["a/4", "a/5"]  # the most recent
    assert all(s.read(f"a/{i}") == blob(i) for i in range(6))  # demoted, not lost
    assert s.stat("b/0").tiers == ("dram",)
    s.set_quota("a", "dram", None)
    for i in range(6):
        s.prefetch(f"a/{i}")
    assert used(s, "a")["dram"] == 6 * BLOCK


def test_a_quota_set_at_runtime_on_a_new_path_makes_a_namespace(make_store):
    s = make_store()
    s.put("t/x/1", blob(1))
    st = s.set_quota("t/x", "disk", 3 * DISK_FP)
    assert st.path == "t/x" and not st.configured and st.blocks == 1
    with pytest.raises(ConfigError, match="lies inside namespace .t.; namespaces do not nest"):
        s.set_quota("t", "disk", DISK_FP)
    with pytest.raises(KeyError, match="no tier named 'ssd'"):
        s.set_quota("t/x", "ssd", DISK_FP)


def test_rename_between_namespaces_is_refused_within_one_it_works(make_store):
    s = make_store(namespaces=(ns("a", dram=4 * BLOCK), ns("b")))
    s.put("a/x.tmp", blob(1))
    s.rename("a/x.tmp", "a/x")
    assert s.read("a/x") == blob(1)
    with pytest.raises(CrossNamespace, match="'a/x' is in namespace 'a' and 'b/x' in namespace 'b'"):
        s.rename("a/x", "b/x")
    with pytest.raises(CrossNamespace, match="in no namespace"):
        s.rename("a/x", "free/x")
    assert s.read("a/x") == blob(1)


def test_a_retired_namespace_takes_no_new_blocks(make_store):
    s = make_store(namespaces=(NamespaceConfig(path="old", retired=True),))
    with pytest.raises(NamespaceRetired, match="namespace 'old' is retired"):
        s.put("old/1", blob(1))


def test_a_restart_with_a_smaller_quota_trims_the_namespace(make_store, tmp_path):
    s = make_store()
    for i in range(6):
        s.put(f"a/{i}", blob(i))
    s.flush()
    s.close()
    s = make_store(namespaces=(ns("a", disk=3 * DISK_FP),))
    assert used(s, "a")["disk"] <= 3 * DISK_FP
    assert len(os.listdir(tmp_path / "disk" / "blocks" / "a")) == 3


def test_namespace_directories_exist_from_the_start(make_store):
    s = make_store(namespaces=(ns("tenant-a"), ns("models/llama")))
    assert s.is_dir("tenant-a") and s.is_dir("models/llama")
    assert s.listdir("") == {"tenant-a": True, "models": True}


def test_usage_of_a_namespace_is_its_catalog_total(make_store):
    s = make_store(namespaces=(ns("a", dram=3 * BLOCK),))
    for i in range(5):
        s.put(f"a/{i % 2}/{i}", blob(i))
    u = s.usage("a")
    [st] = s.namespace_statistics("a")
    assert [(t, used) for t, used, _ in u.tiers] == [(t, used) for t, used, *_ in st.tiers]
    assert (u.blocks, u.size) == (st.blocks, st.size) == (5, 5 * BLOCK)


# -- config ---------------------------------------------------------------------------------

TIERS = {"tiers": [{"kind": "dram", "capacity": "1GiB"}, {"kind": "disk", "capacity": "2GiB", "path": "/x"}]}


def test_namespaces_config():
    cfg = parse_config(
        {
            **TIERS,
            "namespaces": [
                {"path": "tenant-a", "quota": {"dram": "256MiB"}, "owner": 1001, "mode": "0750", "retention": "7d"},
                {"path": "/models//llama/", "group": "root", "retired": True},
                {
                    "model": {
                        "model": "meta/llama",
                        "dtype": "bfloat16",
                        "num_layers": 2,
                        "num_kv_heads": 2,
                        "head_size": 64,
                        "tokens_per_block": 4,
                    }
                },
            ],
        }
    )
    a, m, chain = cfg.namespaces
    assert a.quota == {"dram": 256 << 20} and a.retention == 7 * 86400 and a.owner == 1001 and a.mode == 0o750
    assert a.access(0, 0).uid == 1001 and a.access(0, 0).gid == 0
    assert m.path == "models/llama" and m.retired and m.group == 0 and m.access(5, 6).mode == 0o750
    assert chain.path == "meta-llama-547f89b7f1eb"  # the chain's own directory (docs/naming.md)
    assert ns("x").access(5, 6) is None


@pytest.mark.parametrize(
    ("entry", "field", "reason"),
    [
        (
            {"path": "a", "quota": {"nvme": "1GiB"}},
            "namespaces[0].quota.nvme",
            "no tier named 'nvme'; tiers: dram, disk",
        ),
        ({"path": "a", "quota": {"dram": "lots"}}, "namespaces[0].quota.dram", None),
        ({"path": "a", "mode": "rwx"}, "namespaces[0].mode", "'rwx' is not an octal permission mode like \"0750\""),
        ({"path": "a", "owner": "no-such-user-kvfs"}, "namespaces[0].owner", None),
        ({"path": "a", "retention": "0s"}, "namespaces[0].retention", None),
        ({"path": "a", "colour": "red"}, "namespaces[0].colour", None),
        ({"path": ""}, "namespaces[0].path", "the mount's root cannot be a namespace; name a directory in it"),
        ({"quota": {}}, "namespaces[0].path", None),
        ({"path": "a/../b"}, "namespaces[0].path", None),
    ],
)
def test_namespace_config_errors(entry, field, reason):
    with pytest.raises(ConfigError) as info:
        parse_config({**TIERS, "namespaces": [entry]})
    assert info.value.field == field
    if reason is not None:
        assert info.value.reason == reason


def test_namespaces_do_not_nest_or_repeat():
    with pytest.raises(ConfigError, match=r"namespaces\[1\].path: 'a/b' lies inside namespace 'a'"):
        parse_config({**TIERS, "namespaces": [{"path": "a"}, {"path": "a/b"}]})
    with pytest.raises(ConfigError, match=r"'a' is namespaces\[0\] already"):
        parse_config({**TIERS, "namespaces": [{"path": "a"}, {"path": "a/"}]})


def test_two_namespaces_differing_only_by_weights_are_warned_about():
    model = {"model": "meta/llama", "dtype": "bfloat16", "num_layers": 2, "num_kv_heads": 2, "head_size": 64}
    model["tokens_per_block"] = 4
    old = {"model": {**model, "weights": "rev:1111"}}
    new = {"model": {**model, "weights": "rev:2222"}}
    other_tp = {"model": {**model, "weights": "rev:2222", "tp_rank": 1}}
    cfg = parse_config({**TIERS, "namespaces": [old, new, other_tp]})
    [warning] = fingerprint_warnings(cfg.namespaces)
    assert "namespaces[0]" in warning and "namespaces[1]" in warning and "rev:1111 vs rev:2222" in warning
    assert "retired = true and run kvfs gc" in warning
    cfg = parse_config({**TIERS, "namespaces": [{**old, "retired": True}, new, other_tp]})
    assert fingerprint_warnings(cfg.namespaces) == []


def test_mount_warnings_for_namespaces():
    from kvfs.mount.assembly import capacity_warnings

    cfg = parse_config(
        {
            **TIERS,
            "namespaces": [
                {"path": "small-below", "quota": {"dram": "4MiB", "disk": "1MiB"}},
                {"path": "fine", "quota": {"dram": "4MiB"}},
                {"path": "theirs", "owner": os.getuid() + 12345},
            ],
        }
    )
    warnings = capacity_warnings(cfg)
    assert any(w.startswith("namespace small-below's quotas in the persistent tiers (1 MiB)") for w in warnings)
    assert not any("namespace fine" in w for w in warnings)
    assert any("namespaces theirs belong to other users, but [mount] allow_other is false" in w for w in warnings)
    cfg = parse_config({**TIERS, "mount": {"allow_other": True}, "namespaces": [{"path": "theirs", "owner": 99999}]})
    assert capacity_warnings(cfg) == []
