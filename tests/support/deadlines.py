"""How long a test waits: the suite's deadlines and :func:`wait_for` (tests/README.md,
"Writing tests": wait on a condition, never for a time)."""

from __future__ import annotations

import os
import time

DEADLINE = float(os.environ.get("KVFS_TEST_DEADLINE", "180"))
"""Seconds a test waits for something that happens at once on an idle machine (a mount to
serve, a process to exit, a background copy to land) before it fails. Generous on
purpose: the suite must pass on a machine at load 10; waiting costs nothing when the
condition comes sooner. tests/README.md, "Writing tests"."""

ENGINE_DEADLINE = 10 * DEADLINE
"""Seconds a whole engine run or bench in a subprocess (vLLM, SGLang, LMCache loading a
model, generating, restarting) may take before it is taken for hung: they take minutes
on an idle machine, several times that at load 10."""

TIER_TIMEOUT = 60.0
"""The ``timeout`` of a tier in a test that does not test deadlines: a healthy call on a
loaded machine never reaches it. A test of a deadline gives the calls it stalls itself a
short one."""

HANG = 60.0
"""botocore's own connect and read timeouts (seconds): a call to a stopped or stalled S3
endpoint that kvfs's deadline (1-3 s in the tests) did not cut would wait at least this
long. "Bounded, not a hang" is asserted as ``elapsed < HANG``: it holds at any load a
test can pass at, and fails when the deadline is missing."""


def wait_for(cond, timeout: float = DEADLINE, interval: float = 0.02) -> None:
    """Poll *cond* until it is true; AssertionError after *timeout* seconds (default: the
    suite's :data:`DEADLINE`)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(interval)
