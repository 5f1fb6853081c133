"""The trace replayer, Belady's bound, the traces and ``kvfs bench policy``."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

from kvfs.policies import POLICIES, EvictionPolicy, Hint, PolicyContext, make_policy
from kvfs.tools.cli import main
from kvfs.tools.conversations import MODELS
from kvfs.tools.replay import BELADY, HintModel, TierSpec, parse_stack, replay
from kvfs.tools.traces import TIMED_WORKLOADS, WORKLOADS, Request, Trace, find_mooncake, generate, load_mooncake

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
    # dram=1, disk=2, LRU. [1,2]: 2 pushes 1 down to disk (its last copy: a demotion).
    # [1,2]: 1 hits on disk and is promoted (copied up; the disk copy stays), which pushes
    # 2 down (a demotion); 2 hits on disk and is promoted, which pushes 1 out of DRAM:
    # 1 still has its disk copy, so nothing is written.
    tiers = parse_stack("dram=1,disk=2")
    s = replay([[1, 2], [1, 2]], tiers, "lru", block_bytes=ONE)
    assert s.hits == 2 and s.tier_hits == (0, 2)
    assert (s.promotions, s.demotions, s.dropped, s.written_blocks, s.refused) == (2, 2, 0, 2, 0)
    assert s.tier_written == (4, 2)  # dram: 2 engine writes + 2 promotions; disk: 2 demotions
    assert s.bytes_moved == 4 * ONE
    assert s.written_per_hit(1) == 2 * ONE / 2


def test_a_block_found_after_the_first_miss_is_not_written_again():
    # dram=1, disk=4. [1,2,3] leaves 3 in DRAM, 1 and 2 on disk. [9,1,2]: 9 misses, so 1
    # and 2 are not hits; the engine finds them cached (on disk) and does not write them.
    tiers = parse_stack("dram=1,disk=4")
    s = replay([[1, 2, 3], [9, 1, 2]], tiers, "lru", block_bytes=ONE)
    assert s.hits == 0
    assert s.written_blocks == 4 and s.tier_written[0] == 4  # 1, 2, 3 and 9, nothing twice


class _LRUSpy(EvictionPolicy):
    """LRU that records what the replayer asks beyond the four calls (admit, hint)."""

    name = "spy"

    def __init__(self, ctx, *, admit: bool = True) -> None:
        self._lru = make_policy("lru")
        self._clock = ctx.clock
        self._admit = admit
        self.offers = []
        self.hints = []

    def insert(self, key, size=0, parent=None):
        self._lru.insert(key, size, parent)

    def touch(self, key):
        self._lru.touch(key)

    def remove(self, key):
        self._lru.remove(key)

    def victim(self):
        return self._lru.victim()

    def __len__(self):
        return len(self._lru)

    def __contains__(self, key):
        return key in self._lru

    def admit(self, key, parent=None, *, hits=0, idle=None):
        self.offers.append((key, parent, hits, idle))
        return self._admit

    def hint(self, keys, when):
        self.hints.append((self._clock(), when, list(keys)))


def test_a_refused_demotion_is_dropped_and_counted():
    made = []

    def factory(ctx):
        made.append(_LRUSpy(ctx, admit=False))
        return made[-1]

    # dram=1, disk=4: [1,2] pushes 1 out of DRAM; the disk refuses it. [1]: a miss.
    s = replay([Request((1, 2), 0.0), Request((1,), 5.0)], parse_stack("dram=1,disk=4"), "spy", factory=factory)
    assert (s.hits, s.demotions, s.refused, s.dropped) == (0, 0, 2, 2)
    assert s.tier_written == (3, 0)
    # the disk's policy was asked, with the parent, the hits so far and the idle time
    assert made[1].offers == [(1, None, 0, 0.0), (2, 1, 0, 5.0)]


def test_bottom_tier_drops():
    s = replay([[1], [2], [3], [1]], parse_stack("a=1,b=1"), "fifo", block_bytes=ONE)
    # 1 → a; 2 pushes 1 to b; 3 pushes 2 to b, b drops 1; 1 misses and pushes 3 to b,
    # which drops 2.
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
    for hints in (HintModel(soon=4), HintModel(ended=1.0, ended_delay=0.0), HintModel(soon=2, ended=0.5)):
        assert replay(requests, one_tier(capacity), "session-arc", hints=hints).hits <= best, hints


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
    assert t == Trace(name="t", requests=(Request((0, 1), 0.0), Request((0, 2), 0.009)))
    assert t.timed and list(t.requests[1]) == [0, 2] and len(t.requests[1]) == 2
    assert load_mooncake(f, limit=1).requests == (Request((0, 1), 0.0),)
    f.write_text('{"hash_ids": [0, 1]}\n{"timestamp": 4, "hash_ids": [0]}\n')
    assert not load_mooncake(f).timed  # all requests timed, or none


def test_load_mooncake_names_the_bad_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"hash_ids": [0]}\n{"hash_ids": ["x"]}\n')
    with pytest.raises(ValueError) as info:
        load_mooncake(f)
    assert str(info.value) == f"{f}:2: hash_ids must be a list of integers"
    f.write_text('{"hash_ids": [0], "timestamp": "noon"}\n')
    with pytest.raises(ValueError) as info:
        load_mooncake(f)
    assert str(info.value) == f"{f}:1: timestamp must be a number of milliseconds"


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
    assert [(s["policy"], s["stacks"]) for s in out["summary"]] == [
        *((p, False) for p in (BELADY, *POLICIES)),
        *((p, True) for p in (BELADY, *POLICIES)),
    ]
    stack = next(r for r in rows if r["capacity"] == "dram=20,disk=60" and r["policy"] == "lru")
    assert stack["tiers"] == [{"name": "dram", "capacity": 20}, {"name": "disk", "capacity": 60}]
    assert stack["bytes_moved"] == (stack["promotions"] + stack["demotions"]) * out["block_bytes"]
    assert stack["written_per_hit"] == [w * out["block_bytes"] / stack["hits"] for w in stack["tier_written"]]
    assert stack["tier_written"][1] == stack["demotions"]
    ref = next(r for r in rows if r["capacity"] == "dram=20,disk=60" and r["policy"] == "prefix-arc")
    assert ref["vs_reference_written"] == 1.0 and out["reference"] == "prefix-arc"


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


def test_bench_policy_hints_rows_and_threshold(capsys):
    rc = main(
        [
            "bench",
            "policy",
            "--workload",
            "conversations",
            "--requests",
            "200",
            "--capacity",
            "5%",
            "--policies",
            "prefix-arc,session-arc",
            "--hints",
            "soon=4,ended=0.5,delay=5",
            "--admit-threshold",
            "0",
            "--json",
            "--quiet",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in out["results"]] == [BELADY, "lru", "prefix-arc", "session-arc", "session-arc +hints"]
    hinted = out["results"][-1]
    assert hinted["hints"] > 0 and out["results"][-2]["hints"] == 0
    assert out["hints"] == {"soon": 4, "ended": 0.5, "ended_delay": 5.0, "seed": 0}
    assert out["admit_threshold"] == 0


@pytest.mark.parametrize(
    "spec,message",
    [
        ("soon", "--hints: 'soon': write soon=N, ended=SHARE or delay=SECONDS, comma-separated"),
        ("soon=x", "--hints: 'soon=x': 'x' is not a number"),
        ("ended=2", "--hints: ended=2.0: a share of sessions, between 0 and 1"),
        ("delay=5", "--hints: nothing to send; give soon=N (N > 0) or ended=SHARE (> 0)"),
    ],
)
def test_bench_policy_bad_hints(capsys, spec, message):
    assert main(["bench", "policy", "--workload", "chat", "--requests", "10", "--hints", spec]) == 1
    assert f"kvfs: {message}" in capsys.readouterr().err


# -- hints in the replay ----------------------------------------------------------------------


def test_replay_sends_soon_and_ended_hints_in_time():
    reqs = [
        Request((1, 2), 0.0, session=7, last=False),
        Request((5,), 1.0, session=8, last=True),
        Request((1, 2, 3), 4.0, session=7, last=True),
        Request((9,), 30.0, session=9, last=False),
    ]
    made = []

    def factory(ctx):
        made.append(_LRUSpy(ctx))
        return made[-1]

    s = replay(reqs, one_tier(10), "spy", factory=factory, hints=HintModel(soon=1, ended=1.0, ended_delay=2.0))
    # SOON for the next request when one arrives; ENDED for a session's last request,
    # ended_delay later, sent before the first request that arrives after it.
    assert made[0].hints == [
        (0.0, Hint.SOON, [5]),
        (1.0, Hint.SOON, [1, 2, 3]),
        (3.0, Hint.ENDED, [5]),
        (4.0, Hint.SOON, [9]),
        (6.0, Hint.ENDED, [1, 2, 3]),
    ]
    assert s.hints == 5


def test_hint_model_checks_its_fields():
    with pytest.raises(ValueError, match="soon=-1: the lookahead"):
        HintModel(soon=-1)
    with pytest.raises(ValueError, match="between 0 and 1"):
        HintModel(ended=1.5)
    with pytest.raises(ValueError, match="ended_delay=-1"):
        HintModel(ended_delay=-1)
    assert not HintModel().active and HintModel(soon=1).active


def test_replay_passes_the_context_and_namespaces():
    seen = []

    def factory(ctx):
        seen.append(ctx)
        return make_policy("lru")

    reqs = [Request((1, 2), 0.0, namespace="a"), Request((3,), 1.0, namespace="b")]
    replay(reqs, one_tier(4), "x", factory=factory, context=PolicyContext(admit_threshold=0.3, hint_ttl=7.0))
    ctx = seen[0]
    assert (ctx.admit_threshold, ctx.hint_ttl) == (0.3, 7.0)
    assert (ctx.namespace_of(1), ctx.namespace_of(3), ctx.namespace_of(99)) == ("a", "b", None)


# -- the conversation workloads ---------------------------------------------------------------


@pytest.mark.parametrize("name", TIMED_WORKLOADS)
def test_conversation_workloads_have_time_sessions_and_turns(name):
    t = generate(name, requests=1500, seed=3)
    times = [r.time for r in t.requests]
    assert times == sorted(times) and t.timed
    turns: dict = {}
    for r in t.requests:
        turns.setdefault(r.session, []).append(r)
    model = MODELS[name]
    for reqs in turns.values():
        assert [r.last for r in reqs[:-1]] == [False] * (len(reqs) - 1)
    finished = [reqs for reqs in turns.values() if reqs[-1].last]
    one_turn = sum(1 for reqs in finished if len(reqs) == 1) / len(finished)
    if model.burst > 1.0:
        # a client sends bursts seconds apart: each request its prompt and a new user part
        # (a prompt shorter than a block shares nothing)
        pairs = [(a, b) for reqs in turns.values() for a, b in itertools.pairwise(reqs)]
        assert all(b.time - a.time < 60 for a, b in pairs)
        assert sum(a.blocks[0] == b.blocks[0] for a, b in pairs) > 0.8 * len(pairs)
        assert all(a.blocks[-1] != b.blocks[-1] for a, b in pairs)
    else:
        assert abs(one_turn - model.single_turn) < 0.08, one_turn
        assert max(len(reqs) for reqs in turns.values()) >= 8  # a long tail of long chats
        gaps = []
        for reqs in turns.values():
            for a, b in itertools.pairwise(reqs):
                # the next turn resends the previous one's full blocks and extends them
                assert b.blocks[: len(a.blocks) - 1] == a.blocks[:-1]
                assert len(b.blocks) >= len(a.blocks)
                gaps.append(b.time - a.time)
        gaps.sort()
        assert gaps[len(gaps) // 10] >= 1.0 and gaps[len(gaps) * 9 // 10] >= 60.0  # seconds to minutes
    # shared system prompts: many sessions start with the same block
    firsts = [reqs[0].blocks[0] for reqs in turns.values() if len(reqs[0].blocks) > 1]
    assert max(firsts.count(b) for b in set(firsts)) >= 20


def test_conversation_workload_parameters_are_documented_fields():
    m = MODELS["conversations"]
    assert (m.think, m.single_turn, m.apps) == ((40.0, 1.3), 0.55, 24)
