"""The trace replayer, Belady's bound, the traces and ``kvfs bench policy``."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kvfs.policies import POLICIES
from kvfs.tools.cli import main
from kvfs.tools.replay import BELADY, TierSpec, parse_stack, replay
from kvfs.tools.traces import WORKLOADS, Trace, find_mooncake, generate, load_mooncake

ONE = 1000  # bytes per block in these tests


def one_tier(n: int) -> tuple[TierSpec, ...]:
    return (TierSpec(name="t", capacity=n),)


# -- hit accounting -------------------------------------------------------------------------


def test_prefix_hits_counted_by_hand():
    # capacity 3, LRU:
    # [1,2,3]: three misses, written.             cache 1,2,3
    # [1,2,4]: 1, 2 hit; 4 written, evicts 3.     LRU order 1,2,4
    # [1,2,3]: 1, 2 hit; 3 written, evicts 4.
    s = replay([[1, 2, 3], [1, 2, 4], [1, 2, 3]], one_tier(3), "lru", block_bytes=ONE)
    assert (s.hits, s.accesses, s.written_blocks) == (4, 9, 5)
    assert s.hit_ratio == 4 / 9
    assert s.bytes_written == 5 * ONE and s.bytes_moved == 0


def test_blocks_after_the_first_miss_are_not_hits():
    # [1,2,3] fills the tier; [8] evicts 1; then [1,2,3] misses at 1, so the engine
    # recomputes 2 and 3 although they were still cached: no hit at all, and writing
    # 1 evicts 2, writing 2 evicts 3, writing 3 evicts 8.
    s = replay([[1, 2, 3], [8], [1, 2, 3]], one_tier(3), "lru", block_bytes=ONE)
    assert (s.hits, s.written_blocks, s.dropped) == (0, 7, 4)


def test_tier_stack_demotes_promotes_and_counts_bytes():
    # dram=1, disk=2, LRU. [1,2]: 2 pushes 1 down to disk.
    # [1,2]: 1 hits on disk, is promoted and pushes 2 down; 2 hits on disk, is promoted
    # and pushes 1 down.
    tiers = parse_stack("dram=1,disk=2")
    s = replay([[1, 2], [1, 2]], tiers, "lru", block_bytes=ONE)
    assert s.hits == 2 and s.tier_hits == (0, 2)
    assert (s.promotions, s.demotions, s.dropped, s.written_blocks) == (2, 3, 0, 2)
    assert s.bytes_moved == 5 * ONE


def test_bottom_tier_drops():
    s = replay([[1], [2], [3], [1]], parse_stack("a=1,b=1"), "fifo", block_bytes=ONE)
    # 1 → a; 2 pushes 1 to b; 3 pushes 2 to b, b drops 1; 1 misses.
    assert (s.hits, s.demotions, s.dropped, s.written_blocks) == (0, 3, 2, 4)


def test_belady_beats_lru_by_hand():
    # Single-block requests 1 2 3 1 3 2, capacity 2.
    # Belady: at 3 evicts 2 (next use farthest), then hits 1 and 3: 2 hits.
    # LRU: 3 evicts 1, 1 evicts 2, 3 hits, 2 evicts 1: 1 hit.
    reqs = [[1], [2], [3], [1], [3], [2]]
    assert replay(reqs, one_tier(2), BELADY).hits == 2
    assert replay(reqs, one_tier(2), "lru").hits == 1


def test_prefix_lru_keeps_the_useful_part_of_a_chain():
    # Capacity 4; the chain 1-2-3 and 7 fill it, 8 pushes one block out. LRU evicts the
    # root 1, so the next read of the chain gets nothing although 2 and 3 are cached;
    # prefix-lru evicts the leaf 3 and the next read hits 1 and 2.
    reqs = [[1, 2, 3], [7], [8], [1, 2, 3]]
    assert replay(reqs, one_tier(4), "lru").hits == 0
    assert replay(reqs, one_tier(4), "prefix-lru").hits == 2


# -- Belady is never beaten ----------------------------------------------------------------

HAND_TRACES = {
    "chains": [[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3], [5, 6, 7], [1, 2, 4], [8], [5, 6, 7]],
    "shared-root": [[1, 2], [1, 3], [1, 4], [1, 2], [9], [1, 3], [1, 4, 5], [1, 2]],
    "scan": [[i] for i in range(12)] + [[0], [1], [2]] + [[i] for i in range(12)],
}


def _traces_for_bound():
    out = [(name, reqs, cap) for name, reqs in HAND_TRACES.items() for cap in (2, 3, 5)]
    for w in WORKLOADS:
        t = generate(w, requests=250, seed=7)
        out += [(w, t.requests, max(4, t.distinct * pct // 100)) for pct in (5, 20)]
    found = find_mooncake()
    if found is not None:
        t = load_mooncake(found, limit=250)
        out += [("mooncake", t.requests, max(4, t.distinct * pct // 100)) for pct in (5, 20)]
    return out


@pytest.mark.parametrize(
    "name,requests,capacity",
    _traces_for_bound(),
    ids=lambda v: v if isinstance(v, str) else str(v) if isinstance(v, int) else "",
)
def test_belady_is_never_beaten(name, requests, capacity):
    best = replay(requests, one_tier(capacity), BELADY).hits
    for policy in POLICIES:
        assert replay(requests, one_tier(capacity), policy).hits <= best, policy


def test_with_room_for_everything_only_first_reads_miss():
    t = generate("mixed", requests=300, seed=2)
    for policy in (BELADY, *POLICIES):
        assert replay(t.requests, one_tier(t.distinct), policy).hits == t.accesses - t.distinct


# -- traces ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", WORKLOADS)
def test_generated_workloads_are_reproducible(name):
    a = generate(name, requests=300, seed=11)
    b = generate(name, requests=300, seed=11)
    c = generate(name, requests=300, seed=12)
    assert a == b
    assert a.requests != c.requests
    assert len(a.requests) == 300 and a.name == name


@pytest.mark.parametrize("name", WORKLOADS)
def test_generated_workloads_are_hash_chains(name):
    """Every id always follows the same parent and appears once per request."""
    parent = {}
    for r in generate(name, requests=500, seed=1).requests:
        assert len(set(r)) == len(r)
        prev = None
        for b in r:
            assert parent.setdefault(b, prev) == prev
            prev = b


def test_generated_workloads_reuse_prefixes():
    for name in WORKLOADS:
        t = generate(name, requests=500, seed=0)
        reused = sum(n - 1 for n in Counter(b for r in t.requests for b in r).values())
        assert reused / t.accesses > 0.3, name


def test_unknown_workload():
    with pytest.raises(ValueError) as info:
        generate("batch")
    assert str(info.value) == f"unknown workload 'batch'; known: {', '.join(WORKLOADS)}"


def test_load_mooncake_file(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1]}\n'
        "\n"
        '{"timestamp": 9, "input_length": 600, "output_length": 4, "hash_ids": [0, 2]}\n'
    )
    t = load_mooncake(f)
    assert t == Trace(name="t", requests=((0, 1), (0, 2)))
    assert load_mooncake(f, limit=1).requests == ((0, 1),)


def test_load_mooncake_names_the_bad_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"hash_ids": [0]}\n{"hash_ids": ["x"]}\n')
    with pytest.raises(ValueError) as info:
        load_mooncake(f)
    assert str(info.value) == f"{f}:2: hash_ids must be a list of integers"


def test_shared_mooncake_trace():
    found = find_mooncake()
    if found is None:
        pytest.skip("the shared traces directory (../shared/traces) is not beside the repository")
    t = load_mooncake(found)
    assert (len(t.requests), t.accesses, t.distinct) == (3993, 121877, 43924)


# -- capacities -----------------------------------------------------------------------------


def test_parse_stack():
    assert parse_stack("2000") == (TierSpec(name="tier0", capacity=2000),)
    assert parse_stack("dram=1000, disk=8000") == (
        TierSpec(name="dram", capacity=1000),
        TierSpec(name="disk", capacity=8000),
    )
    assert parse_stack("dram=1%,disk=10%", distinct=2000) == (
        TierSpec(name="dram", capacity=20),
        TierSpec(name="disk", capacity=200),
    )


@pytest.mark.parametrize(
    "text,message",
    [
        ("0", "'0': a tier holds at least one block (got 0)"),
        ("lots", "'lots' in 'lots' is not a whole number of blocks or a percentage"),
        ("dram=1,=2", "'=2' in 'dram=1,=2': write NAME=BLOCKS, e.g. dram=1000,disk=8000"),
        ("a=1,a=2", "'a=1,a=2': tier names repeat"),
        ("5%", "'5%': a percentage needs the trace's block count"),
    ],
)
def test_parse_stack_errors(text, message):
    with pytest.raises(ValueError) as info:
        parse_stack(text)
    assert str(info.value) == message


# -- the bench command ----------------------------------------------------------------------


def test_bench_policy_json(capsys):
    rc = main(
        [
            "bench",
            "policy",
            "--workload",
            "chat",
            "--requests",
            "150",
            "--capacity",
            "40,5%",
            "dram=20,disk=60",
            "--json",
            "--quiet",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["results"]
    assert {r["capacity"] for r in rows} == {"40", "5%", "dram=20,disk=60"}
    assert [r["policy"] for r in rows if r["capacity"] == "40"] == [BELADY, *POLICIES]
    for r in rows:
        if len(r["tiers"]) == 1:
            assert r["vs_belady"] <= 1.0
    assert [s["policy"] for s in out["summary"]] == [BELADY, *POLICIES]
    stack = next(r for r in rows if r["capacity"] == "dram=20,disk=60" and r["policy"] == "lru")
    assert stack["tiers"] == [{"name": "dram", "capacity": 20}, {"name": "disk", "capacity": 60}]
    assert stack["bytes_moved"] == (stack["promotions"] + stack["demotions"]) * out["block_bytes"]


def test_bench_policy_table_and_cost(capsys):
    rc = main(
        [
            "bench",
            "policy",
            "--workload",
            "agents",
            "--requests",
            "100",
            "--capacity",
            "50",
            "--policies",
            "lru,prefix-lru",
            "--cost",
            "--cost-blocks",
            "2000",
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()
    assert "agents  capacity 50 (50 blocks)" in captured.out
    assert "policy cost at 2,000 blocks" in captured.out
    assert "agents: 100 requests" in captured.err


def test_bench_policy_bad_arguments(capsys):
    assert main(["bench", "policy", "--workload", "nope", "--capacity", "5"]) == 1
    assert "--workload 'nope': known workloads are" in capsys.readouterr().err
    assert main(["bench", "policy", "--workload", "chat", "--capacity", "x", "--requests", "10"]) == 1
    assert "kvfs: --capacity: 'x' in 'x' is not a whole number" in capsys.readouterr().err
