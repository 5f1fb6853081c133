"""The shared-tier view: what the shared tiers (posix, s3) hold, asked without stalling.

Shared tiers are what other nodes write too, so the catalog is never complete for them.
:class:`SharedView` asks them and remembers the answers:

- **stat** (:meth:`SharedView.stat`): one name on every usable shared tier, in the
  caller's thread, each call bounded by its tier's deadline. For a name the catalog does
  not know (discovery): the caller needs the answer.
- **stat in the background** (:meth:`SharedView.stat_later`): the same, run by the
  shared tiers' limiters (a few threads each), the answer handed to a callback when it
  arrives. For revalidation of a block this node already holds: the caller answers from
  its own copy at once and never waits on a shared tier. At most one per name and at
  most ``max_pending`` in all are in flight; beyond that revalidation waits for the next
  use of the block.
- **the negative cache**: a name no shared tier holds is believed missing for
  ``negative_ttl`` seconds.
- **listings** (:meth:`SharedView.listing`): a directory's entries on the shared tiers,
  merged, cached for ``listing_ttl`` seconds and refreshed in the background when stale
  (the stale listing answers meanwhile); only a directory never listed is listed in the
  caller's thread.

A tier that fails or does not answer is marked unhealthy on its slot and changes nothing:
no negative answer is cached from an incomplete answer. Thread-safe (its own lock); it
never touches the catalog: the store applies what it learns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .deadline import Job
from .errors import KvfsError, TierUnavailable
from .slot import TierSlot
from .tier import BlockInfo, Tier

__all__ = ["SharedAnswer", "SharedView"]

log = logging.getLogger("kvfs.store")

_MAX_NEGATIVE = 100_000
_MAX_LISTINGS = 10_000


@dataclass(frozen=True, slots=True)
class SharedAnswer:
    """What the shared tiers said of one name: the tiers holding it with what they hold,
    and whether every shared tier answered (only then is "nobody has it" known)."""

    found: tuple[tuple[TierSlot, BlockInfo], ...]
    complete: bool


class _Gather:
    """One question to every shared tier at once in their limiters; *on_done* gets the
    answers (``slot -> answer or None``) and whether all answered, once all are in."""

    def __init__(self, slots: Sequence[TierSlot], ask: Callable[[Tier], Any], on_done: Callable[..., None]) -> None:
        self._slots = list(slots)
        self._ask = ask
        self._lock = threading.Lock()
        self._left = len(slots)
        self._answers: dict[int, Any] = {}
        self._complete = True
        self._on_done = on_done
        self.done = threading.Event()

    def start(self) -> None:
        for slot in self._slots:
            assert slot.limiter is not None
            if slot.limiter.submit(_ask_tier, slot, self._ask, on_done=self._answered) is None:
                self._finish_one(None, complete=False)  # its pool is full of stuck calls
        if not self._slots:
            self._finish()

    def _answered(self, job: Job[tuple[TierSlot, Any, bool]]) -> None:
        if job.error is not None or job.result is None:  # pragma: no cover - _ask_tier catches
            self._finish_one(None, complete=False)
            return
        slot, answer, ok = job.result
        self._finish_one((slot, answer) if ok else None, complete=ok)

    def _finish_one(self, answer: tuple[TierSlot, Any] | None, *, complete: bool) -> None:
        with self._lock:
            if answer is not None:
                self._answers[answer[0].index] = answer
            self._complete &= complete
            self._left -= 1
            last = self._left == 0
        if last:
            self._finish()

    def _finish(self) -> None:
        try:
            self._on_done([self._answers[i] for i in sorted(self._answers)], self._complete)
        finally:
            self.done.set()


def _ask_tier(slot: TierSlot, ask: Callable[[Tier], Any]) -> tuple[TierSlot, Any, bool]:
    """``ask(tier)``; the slot's health follows the outcome."""
    try:
        answer = ask(slot.tier)
    except TierUnavailable as exc:
        slot.failed(exc)
        return slot, None, False
    except KvfsError as exc:
        log.warning("tier %s: %s", slot.name, exc)
        return slot, None, False
    slot.answered()
    return slot, answer, True


class SharedView:
    """Questions to the shared *slots* and the caches of their answers (see the module
    doc). *clock* returns seconds."""

    def __init__(
        self,
        slots: Sequence[TierSlot],
        *,
        clock: Callable[[], float],
        negative_ttl: float = 2.0,
        listing_ttl: float = 5.0,
        max_pending: int = 1024,
    ) -> None:
        self.slots = [s for s in slots if s.shared]
        self.mask = sum(s.bit for s in self.slots)
        self.clock = clock
        self.negative_ttl = negative_ttl
        self.listing_ttl = listing_ttl
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._negative: dict[str, float] = {}  # name -> until when "no shared tier has it" holds
        self._listings: dict[str, tuple[float, dict[str, bool]]] = {}  # dir -> (until, listing)
        self._pending: dict[str, _Gather | None] = {}  # name or "/dir" -> background question in flight

    def __bool__(self) -> bool:
        return bool(self.slots)

    @property
    def in_flight(self) -> int:
        """Background questions not answered yet."""
        return len(self._pending)

    # -- the negative cache ---------------------------------------------------------

    def known_missing(self, name: str) -> bool:
        return self._negative.get(name, 0.0) > self.clock()

    def remember_missing(self, name: str) -> None:
        now = self.clock()
        with self._lock:
            self._negative[name] = now + self.negative_ttl
            if len(self._negative) > _MAX_NEGATIVE:  # bound the memory of misses
                self._negative = {k: t for k, t in self._negative.items() if t > now}

    def forget_missing(self, name: str) -> None:
        with self._lock:
            self._negative.pop(name, None)

    # -- stat ---------------------------------------------------------------------------

    def _ask_all(self, ask: Callable[[Tier], Any]) -> tuple[list[tuple[TierSlot, Any]], bool]:
        """``ask(tier)`` on every usable shared tier now, in this thread: the answers that
        are not None, and whether every shared tier answered."""
        answers: list[tuple[TierSlot, Any]] = []
        complete = True
        for slot in self.slots:
            if not slot.usable():
                complete = False
                continue
            _, answer, ok = _ask_tier(slot, ask)
            complete &= ok
            if answer is not None:
                answers.append((slot, answer))
        return answers, complete

    def stat(self, name: str) -> SharedAnswer:
        """Stat *name* on every usable shared tier now, in this thread."""
        found, complete = self._ask_all(_stat_of(name))
        return SharedAnswer(tuple(found), complete)

    def stat_later(self, name: str, on_answer: Callable[[str, SharedAnswer], None]) -> threading.Event | None:
        """Stat *name* in the background; ``on_answer(name, answer)`` runs in a limiter's
        thread. Returns an event set once it ran, or None when nothing was started (one
        is in flight for *name*, too many are, or no shared tier is usable)."""

        def done(answers: list[tuple[TierSlot, Any]], complete: bool) -> None:
            found = tuple((slot, info) for slot, info in answers if info is not None)
            on_answer(name, SharedAnswer(found, complete))

        return self._in_background(name, _stat_of(name), done)

    def _in_background(
        self, key: str, ask: Callable[[Tier], Any], on_done: Callable[[list[tuple[TierSlot, Any]], bool], None]
    ) -> threading.Event | None:
        """``ask(tier)`` on every usable shared tier in their limiters, at most one question
        per *key* and ``max_pending`` in all; ``on_done(answers, complete)`` once all are in
        (not complete either when a tier was skipped as unusable). None when nothing started.

        The tiers' health is asked only once the question will start: ``usable()`` makes the
        calling thread the probe of a tier that is half-open, and a probe that never calls
        the tier would keep every other thread off it for another ``retry_after``."""
        with self._lock:
            if key in self._pending or len(self._pending) >= self.max_pending:
                return None
            self._pending[key] = None  # taken: nobody else starts this question meanwhile
        slots = [s for s in self.slots if s.usable()]
        if not slots:
            with self._lock:
                self._pending.pop(key, None)
            return None
        everyone = len(slots) == len(self.slots)

        def done(answers: list[tuple[TierSlot, Any]], complete: bool) -> None:
            with self._lock:
                self._pending.pop(key, None)
            on_done(answers, complete and everyone)

        gather = _Gather(slots, ask, done)
        with self._lock:
            if key in self._pending:  # not cleared by close() meanwhile
                self._pending[key] = gather
        gather.start()
        return gather.done

    # -- listings ------------------------------------------------------------------------

    def listing(self, directory: str, *, block: bool = True, wait: float = 0.0) -> dict[str, bool] | None:
        """What the shared tiers hold directly in *directory*, merged (``{basename:
        is_dir}``, shared: do not modify). A stale cached listing answers while a fresh
        one is fetched in the background (waited for at most *wait* seconds); with none
        cached the tiers are listed now, or, with ``block=False``, None is returned (the
        caller lists from a worker thread)."""
        now = self.clock()
        hit = self._listings.get(directory)
        if hit is not None:
            if hit[0] <= now:
                done = self._refresh_listing(directory)
                if done is not None and wait > 0 and done.wait(wait):
                    hit = self._listings.get(directory, hit)
            return hit[1]
        if not block:
            return None
        merged: dict[str, bool] = {}
        listings, complete = self._ask_all(_listing_of(directory))
        for _, listing in listings:
            _merge(merged, listing)
        self._cache_listing(directory, merged, complete, now)
        return merged

    def _refresh_listing(self, directory: str) -> threading.Event | None:
        key = "/" + directory  # block names never start with "/": no clash with stat_later
        started = self.clock()

        def done(answers: list[tuple[TierSlot, Any]], complete: bool) -> None:
            merged: dict[str, bool] = {}
            for _, listing in answers:
                _merge(merged, listing)
            if complete:
                self._cache_listing(directory, merged, True, started)
            # an incomplete answer keeps the old listing (a tier down says nothing new)

        return self._in_background(key, _listing_of(directory), done)

    def _cache_listing(self, directory: str, merged: dict[str, bool], complete: bool, now: float) -> None:
        # a partial answer (a tier down) is cached briefly, so it is retried soon
        ttl = self.listing_ttl if complete else min(1.0, self.listing_ttl)
        with self._lock:
            self._listings[directory] = (now + ttl, merged)
            if len(self._listings) > _MAX_LISTINGS:
                self._listings = {k: v for k, v in self._listings.items() if v[0] > now}

    def forget_listing(self, directory: str) -> None:
        with self._lock:
            self._listings.pop(directory, None)

    def close(self) -> None:
        with self._lock:
            self._pending.clear()


def _stat_of(name: str) -> Callable[[Tier], BlockInfo | None]:
    def stat(tier: Tier) -> BlockInfo | None:
        return tier.stat(name)

    return stat


def _listing_of(directory: str) -> Callable[[Tier], dict[str, bool]]:
    def listdir(tier: Tier) -> dict[str, bool]:
        return tier.listdir(directory)

    return listdir


def _merge(into: dict[str, bool], listing: dict[str, bool] | None) -> None:
    for base, is_dir in (listing or {}).items():
        into[base] = into.get(base, False) or is_dir
