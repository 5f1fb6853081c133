"""The socket protocol fuzzed (issue 20): hypothesis over ``kvfs.protocol``'s codec, and
over a real daemon's request handling (frames sent to a real mount's socket), for a
bounded time -- the same properties ``kvfs bench fuzz`` runs for longer
(tools/bench_fuzz.py)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings

from kvfs.runtime import pid_path
from kvfs.tools.bench_fuzz import codec_property, fuzz_daemon, strategies

STRATEGIES = strategies()


@settings(max_examples=1500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(STRATEGIES["frame"])
def test_the_codec_decodes_any_frame_or_says_what_is_wrong(frame):
    codec_property(frame)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(STRATEGIES["message"])
def test_every_valid_request_decodes_or_is_refused_by_a_bound(body):
    from kvfs.protocol import ProtocolError, decode

    line = json.dumps(body, allow_nan=True).encode()
    try:
        msg = decode(line)
    except ProtocolError as exc:
        assert str(exc)  # a refusal says what is wrong
        return
    assert msg.kind == body["kind"]


def test_a_real_daemon_survives_a_minute_of_fuzzing(kvfs_mount):
    """Sessions of random, mutated, truncated and valid frames on the daemon's socket for
    ~30 s, then a frame past the size limit, one nested 200,000 deep and one of 2M
    values: no answer is an InternalError, the daemon answers after, and once the fuzzing
    connections are gone it holds no lease and no reservation."""
    mp = kvfs_mount(dram="64MiB", disk="256MiB")
    pid = int(pid_path(mp).read_text())
    r = fuzz_daemon(mp, pid, seconds=30)
    assert r["crashes"] == [] and r["alive"], r["crashes"]
    assert r["daemon_inputs"] > 0 and r["codec_inputs"] > 0
    assert r["held_after"] == {"leases": 0, "reserved": 0}
    assert r["errors"].get("ProtocolError", 0) > 0  # the fuzzer did reach the decoder's refusals
    assert os.path.exists(f"/proc/{pid}")
