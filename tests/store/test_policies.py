"""Eviction policies: one conformance suite over every registered policy, and each
policy's exact eviction order on small hand-made traces."""

from __future__ import annotations

import math
import random

import pytest

from kvfs.config import PolicyConfig, parse_config
from kvfs.errors import ConfigError
from kvfs.policies import _REGISTRY, DEFAULT_POLICY, POLICIES, Hint, PolicyContext, make_policy, namespace_of_name
from kvfs.policies.admission import Admission
from kvfs.policies.chains import ChainIndex
from kvfs.policies.session_arc import SessionARC
from kvfs.tools.replay import Belady


def drain(policy) -> list:
    """Evict everything, the way the store does: victim(), then remove(victim)."""
    out = []
    while (v := policy.victim()) is not None:
        out.append(v)
        policy.remove(v)
    return out


# -- conformance: every registered policy -------------------------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_registry_builds_fresh_instances_with_their_name(name):
    a, b = make_policy(name), make_policy(name)
    assert a is not b
    assert a.name == name
    assert _REGISTRY[name].split(":")[1] == type(a).__name__


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(KeyError) as info:
        make_policy("mru")
    assert info.value.args[0] == f"unknown eviction policy 'mru'; known: {', '.join(POLICIES)}"


def test_default_policy_is_registered():
    assert DEFAULT_POLICY in POLICIES


@pytest.mark.parametrize("name", POLICIES)
def test_empty_policy(name):
    p = make_policy(name)
    assert len(p) == 0
    assert p.victim() is None
    assert 1 not in p


@pytest.mark.parametrize("name", POLICIES)
def test_insert_contains_len_and_drain_every_key_once(name):
    p = make_policy(name)
    for k in range(10):
        p.insert(k, 4096, None)
    assert len(p) == 10
    assert all(k in p for k in range(10))
    assert 10 not in p
    order = drain(p)
    assert sorted(order) == list(range(10))
    assert len(p) == 0 and p.victim() is None


@pytest.mark.parametrize("name", POLICIES)
def test_unknown_keys_are_ignored(name):
    p = make_policy(name)
    p.insert("a")
    p.touch("zz")
    p.remove("zz")
    assert len(p) == 1 and "zz" not in p
    assert drain(p) == ["a"]


@pytest.mark.parametrize("name", POLICIES)
def test_victim_is_stable_until_removed(name):
    p = make_policy(name)
    for k in range(6):
        p.insert(k, 0, k - 1 if k else None)
    p.touch(2)
    first = p.victim()
    assert p.victim() == first
    assert first in p
    p.remove(first)
    assert first not in p and len(p) == 5


@pytest.mark.parametrize("name", POLICIES)
def test_reinsert_counts_as_touch(name):
    """Two replicas, one told ``insert`` again and one ``touch``, evict in the same order."""
    a, b = make_policy(name), make_policy(name)
    for p in (a, b):
        for k in range(8):
            p.insert(k, 0, k - 1 if k % 4 else None)
        p.victim()  # let a capacity estimate form where the policy keeps one
    a.insert(1, 0, 0)
    a.insert(5, 0, 4)
    b.touch(1)
    b.touch(5)
    assert len(a) == len(b) == 8
    assert drain(a) == drain(b)


@pytest.mark.parametrize("name", POLICIES)
def test_remove_of_an_inner_block_and_reinsert(name):
    """Pinning removes a block wherever it sits in a chain; unpinning inserts it again."""
    p = make_policy(name)
    for k in range(5):
        p.insert(k, 0, k - 1 if k else None)
    p.remove(2)  # pinned
    assert len(p) == 4 and 2 not in p
    p.insert(2, 0, 1)  # unpinned
    assert len(p) == 5
    assert sorted(drain(p)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("name", POLICIES)
def test_hints_and_admission_keep_every_policy_consistent(name):
    """Hints and admission questions never break the bookkeeping, whatever they name."""
    now = [0.0]
    p = make_policy(name, context=PolicyContext(clock=lambda: now[0], hint_ttl=5.0))
    rng = random.Random(name)
    resident = set()
    for k in range(400):
        now[0] += rng.random()
        parent = k - 1 if k % 5 else None
        assert p.admit(k, parent, hits=rng.randrange(3), idle=rng.random() * 100) in (True, False)
        p.insert(k, 0, parent)
        resident.add(k)
        if k % 3 == 0:
            p.touch(rng.randrange(k + 1))
        if k % 7 == 0:
            chain = list(range(max(0, k - rng.randrange(8)), k + 1)) + [10_000 + k]  # one key never seen
            p.hint(chain, Hint.SOON if rng.random() < 0.5 else Hint.ENDED)
        while len(p) > 30:
            v = p.victim()
            assert v in resident and v in p
            p.remove(v)
            resident.discard(v)
        assert len(p) == len(resident)
    now[0] += 100.0  # every SOON hint has run out
    assert sorted(drain(p)) == sorted(resident)


@pytest.mark.parametrize("name", POLICIES)
def test_interleaved_store_traffic_keeps_len_consistent(name):
    p = make_policy(name)
    resident = set()
    for k in range(200):
        p.insert(k, 0, k - 1 if k % 7 else None)
        resident.add(k)
        if k % 3 == 0:
            p.touch(k // 2)
        if len(p) > 20:
            v = p.victim()
            assert v in resident
            p.remove(v)
            resident.discard(v)
        assert len(p) == len(resident)
    assert sorted(drain(p)) == sorted(resident)


# -- exact eviction orders ------------------------------------------------------------------


def test_lru_order():
    p = make_policy("lru")
    for k in (1, 2, 3):
        p.insert(k)
    p.touch(1)
    assert drain(p) == [2, 3, 1]


def test_lfu_order_ties_broken_by_recency():
    p = make_policy("lfu")
    for k in (1, 2, 3, 4):
        p.insert(k)
    p.touch(3)
    p.touch(3)
    p.touch(1)
    p.insert(4)  # a touch: freq 2, more recent than 1
    assert drain(p) == [2, 1, 4, 3]


def test_fifo_order_ignores_hits_and_reinserts():
    p = make_policy("fifo")
    for k in (1, 2, 3):
        p.insert(k)
    p.touch(1)
    p.insert(1)
    assert drain(p) == [1, 2, 3]


def test_sieve_order():
    p = make_policy("sieve")
    for k in (1, 2, 3, 4):
        p.insert(k)
    p.touch(1)
    p.touch(3)
    # The hand clears 1 and stops at 2.
    assert p.victim() == 2
    p.remove(2)
    p.insert(5)
    p.touch(4)
    # From 3 on: 3 and 4 are cleared, 5 is new and unvisited; then wrap to 1, 3, 4.
    assert drain(p) == [5, 1, 3, 4]


def test_s3fifo_order():
    p = make_policy("s3fifo")
    for k in (1, 2, 3, 4, 5):
        p.insert(k)  # capacity estimate 5: the small FIFO's share is 0.5 block
    p.touch(2)
    assert p.victim() == 1  # small FIFO, never hit
    p.remove(1)
    assert p.victim() == 3  # 2 was hit: it moves to main; 3 goes (and into the ghost)
    p.remove(3)
    p.insert(3)  # ghost hit: straight into main, behind 2
    p.touch(2)
    # Small FIFO 4, 5 first; then main: 2 was hit, so it goes round once and 3 leaves first.
    assert drain(p) == [4, 5, 3, 2]


def test_arc_order_adapts_to_ghost_hits():
    p = make_policy("arc")
    for k in (1, 2, 3):
        p.insert(k)  # c = 3, all in T1
    p.touch(2)  # T2 = [2]
    assert p.victim() == 1  # T1 longer than p = 0
    p.remove(1)  # ghost B1 = [1]
    p.insert(1)  # B1 hit: p = 1, and 1 joins T2 = [2, 1]
    assert p.victim() == 2  # T1 = [3] is not longer than p: evict T2's LRU
    p.remove(2)
    p.insert(4)  # T1 = [3, 4]
    assert drain(p) == [3, 1, 4]


def test_prefix_lru_evicts_chains_from_the_leaf():
    p = make_policy("prefix-lru")
    p.insert(1)
    p.insert(2, 0, 1)
    p.insert(3, 0, 2)
    p.insert(10)
    p.insert(11, 0, 10)
    # Plain LRU would evict 1 first and leave 2 and 3 useless.
    assert drain(p) == [3, 2, 1, 11, 10]


def test_prefix_lru_keeps_a_shared_root_while_a_child_lives():
    p = make_policy("prefix-lru")
    p.insert(1)  # a system prompt
    p.insert(2, 0, 1)
    p.insert(3, 0, 1)
    p.insert(4)
    p.touch(1)
    p.touch(2)
    assert drain(p) == [3, 4, 2, 1]


def test_lru_evicts_the_root_first_for_contrast():
    p = make_policy("lru")
    p.insert(1)
    p.insert(2, 0, 1)
    p.insert(3, 0, 1)
    p.insert(4)
    p.touch(1)
    p.touch(2)
    assert drain(p) == [3, 4, 1, 2]


def test_prefix_s3fifo_order():
    p = make_policy("prefix-s3fifo")
    p.insert(1)
    p.insert(2, 0, 1)
    p.insert(3, 0, 2)
    p.insert(4)
    p.touch(4)
    p.touch(2)  # an inner block's hit is remembered
    # Small FIFO holds the leaves 3, 4. 3 goes; 2 comes back at the old end of small,
    # was hit, so it moves to main; 4 was hit too and moves to main; main then
    # evicts 2 (its hit was spent on the move), which frees 1, then 4.
    assert drain(p) == [3, 2, 1, 4]


def test_belady_evicts_the_farthest_next_use():
    next_use = {}
    p = Belady(next_use)
    for key, nxt in ((1, 5), (2, 9), (3, math.inf), (4, 7)):
        next_use[key] = nxt
        p.insert(key)
    assert p.victim() == 3
    p.remove(3)
    next_use[1] = 20  # 1 was read again; its next use moved out
    p.touch(1)
    assert drain(p) == [1, 2, 4]


def test_chain_index_reports_leaf_changes():
    c = ChainIndex()
    assert c.add(1, None) is None
    assert c.add(2, 1) == 1  # 1 stopped being a leaf
    assert c.add(3, 1) is None
    assert not c.is_leaf(1) and c.is_leaf(2)
    assert c.drop(2) is None
    assert c.drop(3) == 1  # 1 is a leaf again
    assert c.is_leaf(1)
    assert c.add(5, 5) is None  # own parent: ignored
    assert c.is_leaf(5)


def test_prefix_arc_keeps_chains_leaf_first_in_each_list():
    p = make_policy("prefix-arc")
    p.insert(1)
    p.insert(2, 0, 1)
    p.insert(3, 0, 2)
    p.insert(10)
    p.insert(11, 0, 10)
    # T1 = [3, 2, 1, 11, 10]: each block sits just older than its parent.
    assert drain(p) == [3, 2, 1, 11, 10]


def test_prefix_arc_order_and_ghost_adaptation():
    p = make_policy("prefix-arc")
    p.insert(1)
    p.insert(2, 0, 1)
    p.insert(3, 0, 2)
    p.insert(4)
    p.touch(1)
    p.touch(2)  # T2 = [2, 1], T1 = [3, 4]; plain ARC would have T2 = [1, 2]
    assert p.victim() == 3
    p.remove(3)  # B1 = [3]
    p.insert(3, 0, 2)  # ghost hit: p = 1, 3 joins T2 before its parent: [3, 2, 1]
    # T1 = [4] is not longer than p, so T2 gives up the chain from its leaf first.
    assert drain(p) == [3, 2, 1, 4]


def test_arc_for_contrast_evicts_the_chain_root_first():
    p = make_policy("arc")
    p.insert(1)
    p.insert(2, 0, 1)
    p.insert(3, 0, 2)
    p.insert(4)
    p.touch(1)
    p.touch(2)
    assert drain(p) == [3, 4, 1, 2]


def test_recency_list_anchors():
    from kvfs.policies.recency import RecencyList

    r = RecencyList()
    r.add("a")
    r.add("b", "a")  # older side of a
    r.add("c", "zz")  # unknown anchor: newest
    assert list(r) == ["b", "a", "c"]
    assert r.discard("a") and not r.discard("a")
    assert list(r) == ["b", "c"] and r.oldest() == "b" and len(r) == 2


# -- session-arc ------------------------------------------------------------------------------


def _session_arc(now=None, **kw) -> SessionARC:
    clock = (lambda: now[0]) if now is not None else (lambda: 0.0)
    return make_policy("session-arc", context=PolicyContext(clock=clock, **kw))


def test_session_arc_evicts_the_previous_turns_partial_block_first():
    p = _session_arc()
    p.insert(1)  # a shared prompt
    p.insert(10, 0, 1)  # session B: a full block and a partial one
    p.insert(11, 0, 10)
    p.insert(2, 0, 1)  # session A
    p.insert(3, 0, 2)  # A's partial last block
    p.touch(1)
    p.touch(2)  # A's next turn reads 1, 2 and extends 2: 3 will never be read again
    p.insert(4, 0, 2)
    # T1 = [11, 10, 4], T2 = [2, 1]; 3 is dead and goes first (prefix-arc: 11, 10, 3, ...)
    assert drain(p) == [3, 11, 10, 4, 2, 1]


def test_prefix_arc_for_contrast_keeps_the_dead_partial_block():
    p = make_policy("prefix-arc")
    for k, parent in ((1, None), (10, 1), (11, 10), (2, 1), (3, 2)):
        p.insert(k, 0, parent)
    p.touch(1)
    p.touch(2)
    p.insert(4, 0, 2)
    assert drain(p) == [11, 10, 3, 4, 2, 1]


def test_session_arc_a_dead_block_that_is_read_lives_again():
    p = _session_arc()
    for k, parent in ((1, None), (10, 1), (11, 10), (2, 1), (3, 2)):
        p.insert(k, 0, parent)
    p.touch(1)
    p.touch(2)
    p.insert(4, 0, 2)  # 3 dead
    p.touch(3)  # read after all (an edit of the last turn): T2 = [3, 2, 1]
    assert drain(p) == [11, 10, 4, 3, 2, 1]


def test_session_arc_a_block_written_again_does_not_supersede_itself():
    p = _session_arc()
    p.insert(1)
    p.insert(2, 0, 1)
    p.touch(1)
    p.remove(2)  # evicted (not through victim: no ghost)
    p.insert(2, 0, 1)  # the engine writes it again under the same parent
    assert drain(p) == [2, 1]


def test_session_arc_soon_hint_holds_blocks_until_read_or_ttl():
    now = [0.0]
    p = _session_arc(now, hint_ttl=10.0)
    for k in (1, 2, 3):
        p.insert(k)
    p.hint([1, 99], Hint.SOON)  # 99 is not here: ignored
    assert p.victim() == 2  # 1 is held
    now[0] = 11.0  # the hint ran out: 1 goes back into T1 as if read at the hint: [2, 3, 1]
    assert p.victim() == 2
    p.hint([2], Hint.SOON)
    assert p.victim() == 3
    p.touch(2)  # read as announced: 2 leaves the hold for T2
    now[0] = 100.0
    assert drain(p) == [3, 1, 2]


def test_session_arc_soon_hint_with_no_ttl_only_refreshes():
    p = _session_arc(hint_ttl=0.0)
    for k in (1, 2, 3):
        p.insert(k)
    p.hint([1], Hint.SOON)
    assert drain(p) == [2, 3, 1]


def test_session_arc_ended_hint_frees_the_session_but_not_the_shared_prompt():
    p = _session_arc()
    for k, parent in ((1, None), (10, 1), (11, 10), (2, 1), (3, 2)):
        p.insert(k, 0, parent)  # two sessions under prompt 1: it is a branch point
    p.hint([1, 2, 3], Hint.ENDED)  # session A is over: 3 and 2 die, the walk stops at 1
    assert drain(p) == [3, 2, 11, 10, 1]


def test_session_arc_ended_hint_of_a_lone_session_frees_the_whole_chain():
    p = _session_arc()
    for k, parent in ((1, None), (2, 1), (3, 2), (7, None)):
        p.insert(k, 0, parent)
    p.touch(7)
    p.hint([1, 2, 3], Hint.ENDED)
    assert drain(p) == [3, 2, 1, 7]


def test_session_arc_soon_wins_over_ended():
    p = _session_arc(hint_ttl=10.0)
    for k, parent in ((1, None), (2, 1), (3, 2), (7, None)):
        p.insert(k, 0, parent)
    p.hint([1, 2, 3], Hint.SOON)
    p.hint([1, 2, 3], Hint.ENDED)  # a new request of the session is already queued
    assert p.victim() == 7


def test_session_arc_stops_calling_blocks_dead_when_they_come_back():
    p = _session_arc()
    p.insert(0)
    p.touch(0)
    p.insert(1, 0, 0)
    for i in range(2, 2000):
        p.insert(i, 0, 0)  # a new leaf under 0: the previous one, never read, is dead
        v = p.victim()
        if v != i - 1:
            break
        p.remove(v)
        p.insert(v, 0, 0)  # ... and is written again at once: this workload re-reads old branches
        p.remove(v)
    assert not p._supersede and i > 256
    for k in range(10_000, 10_000 + p._off_until):  # after a while it tries again
        p.insert(k)
        p.remove(p.victim())
    assert p._supersede


def test_session_arc_is_prefix_arc_without_dead_blocks_and_hints():
    """The same order as prefix-arc on a trace without partial blocks being superseded."""
    a, b = make_policy("prefix-arc"), _session_arc()
    rng = random.Random(3)
    for k in range(300):
        for p in (a, b):
            p.insert(k, 0, k - 1 if k % 6 else None)
        t = rng.randrange(k + 1)
        for p in (a, b):
            p.touch(t)
            if len(p) > 40:
                p.remove(p.victim())
    assert drain(a) == drain(b)


def test_session_arc_admission_learns_to_refuse_unread_kinds():
    p = _session_arc(admit_threshold=0.5)
    for k in range(32):  # blocks offered with no read so far and no child, never read here
        assert p.admit(k, None, hits=0, idle=1.0)
        p.insert(k)
        p.remove(p.victim())
    assert not p.admit(100, None, hits=0, idle=1.0)  # the kind is refused now
    assert p.admit(101, None, hits=2, idle=1.0)  # a block read twice is another kind
    assert p._admission.refused == 1


def test_admission_refuses_below_threshold_and_explores():
    a = Admission(threshold=0.5, capacity=lambda: 100, min_samples=4, explore=3)
    for k in range(4):
        assert a.offer(k, None, 0, 0.0)
        a.left(k)  # left unread
    assert [a.offer(10 + i, None, 0, 0.0) for i in range(6)] == [False, False, True, False, False, True]
    assert (a.offered, a.refused) == (10, 4)
    assert a.offer(20, None, 1, 0.0)  # read before: another kind, nothing known yet
    a.hit(20)
    assert a.estimate(a.kind(20, 1, 0.0)) is None  # one outcome is below min_samples


def test_admission_kinds():
    a = Admission(threshold=0.1, capacity=lambda: 10, namespace_of=namespace_of_name)
    assert a.kind("llama/ab/abc", 0, None) == ("llama", False, False, False, 0, False)
    a.offer("llama/ab/def", "llama/ab/abc", 3, 5.0)  # abc is a parent now
    assert a.kind("llama/ab/abc", 1, 5000.0) == ("llama", True, True, False, 5, False)
    a.left("llama/ab/def")
    assert a.kind("llama/ab/def", 0, 20.0)[3:5] == (True, 2)  # left unread; idle 16..64
    a.ended(["llama/ab/xyz"], lambda k: False)
    assert a.kind("llama/ab/xyz", 0, 0.0)[5]


def test_admission_with_threshold_zero_admits_everything():
    a = Admission(threshold=0.0, capacity=lambda: 10)
    for k in range(100):
        assert a.offer(k, None, 0, 0.0)
        a.left(k)
    assert a.offered == 0  # nothing recorded


def test_default_policies_admit_everything_and_ignore_hints():
    p = make_policy("lru")
    p.insert(1)
    p.insert(2)
    assert p.admit(3, None, hits=0) and p.hint([1], Hint.ENDED) is None
    assert drain(p) == [1, 2]


def test_policy_context_checks_its_tuning():
    with pytest.raises(ValueError, match="admit_threshold=1.0: a share"):
        PolicyContext(admit_threshold=1.0)
    with pytest.raises(ValueError, match="hint_ttl=-1"):
        PolicyContext(hint_ttl=-1)
    assert namespace_of_name("ns/ab/abcd") == "ns" and namespace_of_name(7) is None


def test_policy_config_keys():
    tiers = [{"kind": "dram", "capacity": "1GiB"}]
    cfg = parse_config({"tiers": tiers, "policy": {"admit_threshold": 0.1, "hint_ttl": "5s"}})
    assert (cfg.policy.admit_threshold, cfg.policy.hint_ttl) == (0.1, 5.0)
    ctx = cfg.policy.context(clock=lambda: 42.0)
    assert (ctx.clock(), ctx.admit_threshold, ctx.hint_ttl) == (42.0, 0.1, 5.0)
    assert PolicyConfig().eviction == DEFAULT_POLICY == "session-arc"
    with pytest.raises(ConfigError) as info:
        parse_config({"tiers": tiers, "policy": {"admit_threshold": 2}})
    assert str(info.value) == (
        "config error in policy.admit_threshold: expected a share from 0 (admit every block) up to, not including, 1"
    )
    with pytest.raises(ConfigError, match="policy.hint_ttl"):
        parse_config({"tiers": tiers, "policy": {"hint_ttl": "soon"}})
