"""Request traces for the policy replayer: the Mooncake file and seeded generated workloads.

A trace is a list of requests; a request is the list of its prefix blocks' ids in order
(512 tokens per block), as in the Mooncake format. Equal ids are equal blocks, and every
id always follows the same parent id (ids come from a hash chain), which the generators
keep: a block id is made once, under one parent, and reused only as the same prefix.

As in the Mooncake trace, a request's last block is usually partial: when a
conversation or an agent goes on, the next request fills that block with more tokens,
which makes it a different block. The generators model this with a fresh last id on
every chat turn and agent step; only an exact repeat of a request repeats its last id.

A :class:`Request` is a sequence of block ids (iterate it, ``len`` it) that may also
carry its arrival time, its session and the namespace its blocks belong to. The
generated conversation workloads (:mod:`kvfs.tools.conversations`) and the Mooncake file
have times; the other generated workloads have none (the replayer then counts time in
requests).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from .conversations import MODELS, sessions

__all__ = [
    "MOONCAKE_FILE",
    "TIMED_WORKLOADS",
    "WORKLOADS",
    "Request",
    "Trace",
    "find_mooncake",
    "generate",
    "load_mooncake",
]

MOONCAKE_FILE = "mooncake_synthetic.jsonl"


@dataclass(frozen=True, slots=True)
class Request(Sequence[int]):
    """One request: its prefix blocks in order, and what else the trace knows about it.

    ``time``: arrival in seconds from the trace's start (``None``: untimed trace).
    ``session``: the session (conversation, client burst) it belongs to, ``last``: it is
    that session's last request; ``None``/``False`` where the trace does not say.
    ``namespace``: the namespace of its blocks (a model, a tenant), ``None`` for one.
    Compares equal to a plain tuple of the same ids only through ``blocks``.
    """

    blocks: tuple[int, ...]
    time: float | None = None
    session: int | None = None
    last: bool = False
    namespace: str | None = None

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[int]:
        return iter(self.blocks)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        return self.blocks[i]


@dataclass(frozen=True, kw_only=True)
class Trace:
    """A named list of requests."""

    name: str
    requests: tuple[Request, ...]

    @property
    def accesses(self) -> int:
        return sum(len(r) for r in self.requests)

    @property
    def distinct(self) -> int:
        return len({b for r in self.requests for b in r})

    @property
    def timed(self) -> bool:
        return bool(self.requests) and self.requests[0].time is not None


def find_mooncake() -> Path | None:
    """The shared Mooncake trace: ``shared/traces/`` in the repository or the nearest
    directory above it that has one (``../shared`` beside a checkout, ``../../shared``
    beside a worktree), if present."""
    root = Path(__file__).resolve().parent.parent
    for d in (root, *root.parents):
        candidate = d / "shared" / "traces" / MOONCAKE_FILE
        if candidate.is_file():
            return candidate
    return None


def load_mooncake(path: str | Path, *, limit: int | None = None) -> Trace:
    """Requests from a Mooncake jsonl file (one JSON object with ``hash_ids`` per line).

    ``limit`` keeps the first requests only. Raises ``ValueError`` naming the line when a
    line is not JSON or has no list of integer ``hash_ids``; ``OSError`` if unreadable.
    """
    path = Path(path)
    requests: list[Request] = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(requests) >= limit:
                break
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                ids = obj["hash_ids"]
                stamp = obj.get("timestamp")
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a Mooncake request ({exc})") from exc
            if not isinstance(ids, list) or not all(isinstance(b, int) for b in ids):
                raise ValueError(f"{path}:{lineno}: hash_ids must be a list of integers")
            if stamp is not None and (isinstance(stamp, bool) or not isinstance(stamp, int | float)):
                raise ValueError(f"{path}:{lineno}: timestamp must be a number of milliseconds")
            requests.append(Request(tuple(ids), None if stamp is None else stamp / 1000))
    if requests and any(r.time is None for r in requests):
        requests = [Request(r.blocks) for r in requests]  # all timed or none
    return Trace(name=path.stem, requests=tuple(requests))


# -- generated workloads -----------------------------------------------------------------


class _Ids:
    """Fresh block ids; one allocator per trace so workloads mixed together never collide."""

    def __init__(self) -> None:
        self._next = 0

    def new(self, n: int) -> list[int]:
        start = self._next
        self._next += n
        return list(range(start, start + n))


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


def _chat(rng: random.Random, ids: _Ids) -> Iterator[tuple[int, ...]]:
    """Multi-turn chat: each turn resends the whole conversation plus the new exchange.

    A few system prompts (Zipf-popular) start conversations; up to 48 conversations are
    open at once and a random one speaks next, so reuse distances vary; each turn adds the
    previous answer and the new question (1-3 full blocks) and ends in a partial block;
    a conversation ends with p=0.18.
    """
    prompts = [ids.new(rng.randint(2, 6)) for _ in range(4)]
    weights = _zipf_weights(len(prompts), 1.0)
    open_: list[list[int]] = []
    while True:
        if not open_ or (len(open_) < 48 and rng.random() < 0.3):
            conv = list(rng.choices(prompts, weights)[0]) + ids.new(rng.randint(1, 3))
            open_.append(conv)
        else:
            i = rng.randrange(len(open_))
            conv = open_[i]
            conv.extend(ids.new(rng.randint(1, 3)))
            if rng.random() < 0.18 or len(conv) > 120:
                open_.pop(i)
        yield (*conv, *ids.new(1))


def _system_prompts(rng: random.Random, ids: _Ids) -> Iterator[tuple[int, ...]]:
    """Many applications, each with its own long system prompt (4-32 blocks, Zipf 1.1).

    Each request is a prompt plus a user part of 1-6 blocks, new 80% of the time, else one
    of the last 50 user parts sent with that prompt (retries, popular questions).
    """
    prompts = [ids.new(rng.randint(4, 32)) for _ in range(60)]
    weights = _zipf_weights(len(prompts), 1.1)
    recent: dict[int, list[list[int]]] = {}
    while True:
        p = rng.choices(range(len(prompts)), weights)[0]
        seen = recent.setdefault(p, [])
        if seen and rng.random() < 0.2:
            user = rng.choice(seen)
        else:
            user = ids.new(rng.randint(1, 6))
            seen.append(user)
            del seen[:-50]
        yield tuple(prompts[p] + user)


def _doc_qa(rng: random.Random, ids: _Ids) -> Iterator[tuple[int, ...]]:
    """Long-document QA: sessions of several questions over one long document.

    300 documents of 16-160 blocks (Zipf 0.9 popularity) behind a 2-block instruction;
    up to 24 sessions open at once, each asks a geometric number of questions (mean 5),
    one new block per question.
    """
    head = ids.new(2)
    docs: dict[int, list[int]] = {}
    weights = _zipf_weights(300, 0.9)
    open_: list[list[int]] = []
    while True:
        if not open_ or (len(open_) < 24 and rng.random() < 0.25):
            d = rng.choices(range(300), weights)[0]
            if d not in docs:
                docs[d] = ids.new(int(min(160, 16 + rng.expovariate(1 / 40))))
            open_.append(head + docs[d])
        i = rng.randrange(len(open_))
        yield tuple(open_[i] + ids.new(1))
        if rng.random() < 0.2:
            open_.pop(i)


def _agents(rng: random.Random, ids: _Ids) -> Iterator[tuple[int, ...]]:
    """Agent loops: a tool-laden prompt per agent kind, then a trajectory that grows.

    6 agent kinds with 8-24 block prompts; up to 32 agents run at once, each step sends the
    whole trajectory plus 1-3 new full blocks (tool output, action) and a partial block;
    an agent stops after 5-40 steps. Steps of one agent come close together, unlike chat
    turns.
    """
    kinds = [ids.new(rng.randint(8, 24)) for _ in range(6)]
    running: list[list[Any]] = []  # [context, steps left]
    while True:
        if len(running) < 32 and (not running or rng.random() < 0.08):
            running.append([list(rng.choice(kinds)), rng.randint(5, 40)])
        # Recently started agents step more often: pick from the newest with more weight.
        i = min(len(running) - 1, int(rng.expovariate(1 / 6)))
        agent = running[-1 - i]
        agent[0].extend(ids.new(rng.randint(1, 3)))
        agent[1] -= 1
        yield (*agent[0], *ids.new(1))
        if agent[1] <= 0:
            running.remove(agent)


_GENERATORS = {
    "chat": _chat,
    "system-prompts": _system_prompts,
    "doc-qa": _doc_qa,
    "agents": _agents,
}

TIMED_WORKLOADS: tuple[str, ...] = tuple(MODELS)
WORKLOADS: tuple[str, ...] = (*_GENERATORS, "mixed", *TIMED_WORKLOADS)


def generate(name: str, *, requests: int = 4000, seed: int = 0) -> Trace:
    """A generated workload: same *name*, *requests* and *seed* give the same trace.

    ``mixed`` interleaves the four untimed ones (weights 3:3:2:2) with one id space,
    each request labelled with the namespace it came from. The timed workloads
    (``TIMED_WORKLOADS``) come from :mod:`kvfs.tools.conversations`.
    Raises ``ValueError`` naming the known workloads for an unknown *name*.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    rng = random.Random(f"kvfs-{name}-{seed}")
    ids = _Ids()
    if name in MODELS:
        turns = sessions(MODELS[name], rng, ids.new)
        out = []
        for _ in range(requests):
            t = next(turns)
            out.append(Request(t.blocks, t.time, t.session, t.last))
        return Trace(name=name, requests=tuple(out))
    if name == "mixed":
        names = list(_GENERATORS)
        streams = [_GENERATORS[n](random.Random(f"kvfs-{n}-{seed}"), ids) for n in names]
        pick = [rng.choices(range(4), (3, 3, 2, 2))[0] for _ in range(requests)]
        return Trace(name=name, requests=tuple(Request(next(streams[i]), namespace=names[i]) for i in pick))
    stream = _GENERATORS[name](rng, ids)
    return Trace(name=name, requests=tuple(Request(next(stream)) for _ in range(requests)))
