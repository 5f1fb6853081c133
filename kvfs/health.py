"""Whether a tier answers: a circuit breaker per tier.

A tier whose call raised :class:`~kvfs.errors.TierUnavailable` (a timeout, a backend
error) is *unhealthy*: it is skipped for ``retry_after`` seconds; then one thread may try
it again (half-open: the first to ask becomes the probe, everyone else keeps skipping it
until the probe's call answers or another ``retry_after`` passes), and a call that
succeeds marks it healthy. So a long outage costs one waiting call per ``retry_after``,
not one per caller. What the tools and metrics show as a tier's health and error count
lives here.

Thread-safe on its own (a small lock), so calls that finish in background threads report
without the store's lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .errors import DescriptorsExhausted

__all__ = ["HealthBreaker"]

log = logging.getLogger("kvfs.store")

RETRY_AFTER = 5.0  # seconds an unhealthy tier is skipped before it is tried again


class HealthBreaker:
    """The health of the tier named *name*; *clock* returns seconds."""

    def __init__(self, name: str, *, clock: Callable[[], float], retry_after: float = RETRY_AFTER) -> None:
        self.name = name
        self.retry_after = retry_after
        self._clock = clock
        self._lock = threading.Lock()
        self.healthy = True
        self.errors = 0
        """Calls that failed (timeouts, backend errors) since the start."""
        self._until = 0.0
        self._probe: int | None = None  # the thread trying an unhealthy tier again

    def usable(self) -> bool:
        """True when the tier may be called now: healthy, or unhealthy for long enough
        that it is worth trying again and this thread is the one that does."""
        if self.healthy:
            return True
        now = self._clock()
        me = threading.get_ident()
        with self._lock:
            if self._answering():  # marked healthy by another thread meanwhile
                return True
            if now < self._until:
                return self._probe == me
            self._probe = me
            self._until = now + self.retry_after
            return True

    def _answering(self) -> bool:
        return self.healthy

    def failed(self, exc: BaseException) -> None:
        """A call raised *exc* (a TierUnavailable): count it, mark the tier unhealthy --
        unless the daemon was out of file descriptors, which says nothing of the tier."""
        if isinstance(exc, DescriptorsExhausted):
            return
        with self._lock:
            self.errors += 1
            was = self.healthy
            self.healthy = False
            self._probe = None
            self._until = self._clock() + self.retry_after
        if was:
            log.warning("tier %s is unhealthy: %s", self.name, exc)

    def answered(self) -> None:
        """A call succeeded: the tier is healthy (again)."""
        if self.healthy:
            return
        with self._lock:
            was, self.healthy = self.healthy, True
            self._probe = None
        if not was:
            log.warning("tier %s answers again", self.name)
