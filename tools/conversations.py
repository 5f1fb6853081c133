"""Generated conversation workloads with time: sessions, think times, shared prompts.

The untimed generators of :mod:`kvfs.tools.traces` say which prefixes come back; these
also say *when*, because what a KV cache can know about a conversation is mostly about
time: how long a session has been idle, whether it is likely to come back at all. The
model follows what the published production traces show:

- **Sessions and turns.** A session sends its whole conversation every turn: the system
  prompt, every earlier user message and answer, and the new user message. Tokens are
  cut into 512-token blocks; the full blocks get ids that the next turn reuses, the last
  partial block gets a fresh id every turn (the next turn fills it differently), as in
  the Mooncake traces.
- **Think times of seconds to minutes** between one turn's answer and the next turn
  (log-normal), plus the answer's own generation time. Alibaba's to-C trace (Wang et
  al., ATC'25) has 80 % of reuses within ten minutes; the Mooncake conversation trace
  (Qin et al., FAST'25) extends a chain minutes after it was written.
- **Many sessions never return**: a session has one turn with probability
  ``single_turn``; the others have a long-tailed number of turns (1 + a Pareto draw),
  as in LMSYS-Chat-1M and ShareGPT (mean about two turns, a long tail).
- **Shared system prompts**: each session belongs to an application, drawn by Zipf
  popularity; its system prompt is shared by every session of the application. The
  first block that mixes prompt and user text is the session's own.
- **Long-tailed lengths**: user messages, answers and first inputs (documents pasted into
  the first turn) are log-normal, capped.
- **API traffic** (``api``): programs that call an endpoint in bursts, each call a long
  client-specific system prompt and a unique user part, almost never a second turn; in
  Alibaba's to-B trace single-turn requests are 97 % of hits and reuse comes within
  seconds.

Every parameter is a field of :class:`SessionModel`, documented in docs/policies.md.
Sessions arrive as a Poisson process; requests come out in time order.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

__all__ = ["API", "BLOCK_TOKENS", "CONVERSATIONS", "LONG_CONTEXT", "MODELS", "SessionModel", "Turn", "sessions"]

BLOCK_TOKENS = 512


@dataclass(frozen=True, kw_only=True)
class SessionModel:
    """The parameters of one conversation workload. Times in seconds, sizes in tokens.

    Log-normal draws are given as (median, sigma of the log). ``turns_alpha`` is the
    Pareto tail of the number of turns of a session that returns at least once: the
    number of turns is ``2 + floor(Pareto(alpha) - 1)``, capped at ``max_turns``.
    """

    arrival_rate: float  # new sessions per second (Poisson)
    apps: int  # applications, each with its own shared system prompt
    app_zipf: float  # Zipf exponent of application popularity
    prompt: tuple[float, float]  # system prompt length (tokens): median, sigma
    first_input: tuple[float, float]  # the first user message (often a pasted document)
    user: tuple[float, float]  # later user messages
    answer: tuple[float, float]  # the model's answers
    max_input: int  # cap on any single message (tokens)
    single_turn: float  # share of sessions that never return after their first turn
    turns_alpha: float  # Pareto tail of the number of turns of returning sessions
    max_turns: int
    think: tuple[float, float]  # the user's think time between an answer and the next turn
    decode_tokens_per_s: float  # answer generation speed: its time is added to the gap
    burst: float = 1.0  # mean requests a client sends back to back (api: > 1)
    burst_gap: float = 1.0  # mean seconds between the requests of a burst


CONVERSATIONS = SessionModel(
    arrival_rate=1.0,
    apps=24,
    app_zipf=1.0,
    prompt=(1200.0, 0.8),
    first_input=(600.0, 1.5),
    user=(150.0, 1.2),
    answer=(400.0, 0.7),
    max_input=32_000,
    single_turn=0.55,
    turns_alpha=1.3,
    max_turns=60,
    think=(40.0, 1.3),
    decode_tokens_per_s=40.0,
)
"""A consumer chat service: short prompts, many one-shot sessions, a long tail of long chats."""

LONG_CONTEXT = replace(
    CONVERSATIONS,
    arrival_rate=0.5,
    apps=1,
    prompt=(600.0, 0.0),
    first_input=(6000.0, 1.1),
    max_input=120_000,
    single_turn=0.6,
    think=(90.0, 1.2),
)
"""Long documents pasted into the first turn behind one shared prompt (as in the Mooncake
conversation trace): few, large sessions, longer think times."""

API = SessionModel(
    arrival_rate=0.6,
    apps=300,
    app_zipf=1.2,
    prompt=(2500.0, 0.9),
    first_input=(500.0, 1.0),
    user=(150.0, 1.0),
    answer=(300.0, 0.8),
    max_input=16_000,
    single_turn=0.99,
    turns_alpha=1.3,
    max_turns=8,
    think=(5.0, 1.0),
    decode_tokens_per_s=60.0,
    burst=8.0,
    burst_gap=0.8,
)
"""Programs calling an API: client prompts, bursts of single-turn calls seconds apart."""

MODELS: dict[str, SessionModel] = {"conversations": CONVERSATIONS, "long-context": LONG_CONTEXT, "api": API}


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session: when it arrives, its blocks, and whether it is the last."""

    time: float
    session: int
    blocks: tuple[int, ...]
    last: bool


class _Session:
    __slots__ = ("blocks", "left", "pending", "prompt", "sid", "tokens")

    def __init__(self, sid: int, prompt: tuple[list[int], int], turns: int) -> None:
        self.sid = sid
        self.prompt = prompt  # (the application's full prompt blocks, its length in tokens)
        self.blocks = list(prompt[0])  # the context's full blocks so far
        self.tokens = prompt[1]  # tokens in the context so far, prompt included
        self.left = turns
        self.pending = -1  # the last answer's tokens, added to the context next turn (-1: none yet)

    def request(self, added: int, new_ids: Callable[[int], list[int]], *, keep: bool) -> tuple[int, ...]:
        """The blocks of a request that adds *added* tokens to the context (kept if *keep*)."""
        tokens = self.tokens + added
        full = tokens // BLOCK_TOKENS
        blocks = self.blocks if keep else list(self.prompt[0])
        if full > len(blocks):
            blocks.extend(new_ids(full - len(blocks)))
        if keep:
            self.tokens = tokens
        partial = new_ids(1) if tokens % BLOCK_TOKENS else []
        return (*blocks, *partial)


def _lognormal(rng: random.Random, spec: tuple[float, float], cap: int) -> int:
    median, sigma = spec
    return max(1, min(cap, round(median * math.exp(rng.gauss(0.0, sigma)))))


def _turns(rng: random.Random, m: SessionModel) -> int:
    if m.burst > 1.0:
        return 1 + int(rng.expovariate(1.0 / (m.burst - 1.0)))
    if rng.random() < m.single_turn:
        return 1
    return min(m.max_turns, 1 + int(rng.paretovariate(m.turns_alpha)))


def sessions(model: SessionModel, rng: random.Random, new_ids: Callable[[int], list[int]]) -> Iterator[Turn]:
    """Requests of *model* in time order, forever; *new_ids(n)* allocates fresh block ids.

    A conversation's turn adds the previous answer and a new user message to its context
    and sends all of it. A bursty client (``burst > 1``) sends, ``burst_gap`` apart, its
    prompt and a new user part each time; nothing but the prompt is kept between them.
    """
    m = model
    weights = [1.0 / (i + 1) ** m.app_zipf for i in range(m.apps)]
    apps: dict[int, tuple[list[int], int]] = {}  # app -> (full prompt blocks, prompt tokens)
    queue: list[tuple[float, int, _Session]] = []  # (time of its next turn, seq, session)
    seq = 0
    arrival = rng.expovariate(m.arrival_rate)
    bursty = m.burst > 1.0
    while True:
        if not queue or arrival <= queue[0][0]:
            a = rng.choices(range(m.apps), weights)[0]
            if a not in apps:
                tokens = _lognormal(rng, m.prompt, m.max_input)
                apps[a] = (new_ids(tokens // BLOCK_TOKENS), tokens)
            seq += 1
            heapq.heappush(queue, (arrival, seq, _Session(seq, apps[a], _turns(rng, m))))
            arrival += rng.expovariate(m.arrival_rate)
            continue
        now, _, s = heapq.heappop(queue)
        if bursty or s.pending < 0:  # a burst's request, or a conversation's first turn
            added = _lognormal(rng, m.first_input, m.max_input)
        else:
            added = s.pending + _lognormal(rng, m.user, m.max_input)
        s.left -= 1
        yield Turn(time=now, session=s.sid, blocks=s.request(added, new_ids, keep=not bursty), last=s.left == 0)
        if s.left == 0:
            continue
        if bursty:
            gap = rng.expovariate(1.0 / m.burst_gap)
        else:
            s.pending = _lognormal(rng, m.answer, m.max_input)
            gap = s.pending / m.decode_tokens_per_s + _lognormal(rng, m.think, 10**9)
        seq += 1
        heapq.heappush(queue, (now + gap, seq, s))
