"""The closed sets of the core are str enums whose values are the strings the config, the
wire and the callers always used: a plain string still compares equal and still crosses the
socket as itself."""

from __future__ import annotations

import pytest

from kvfs.ingest import ReservationState
from kvfs.promises import PromiseState
from kvfs.promotion import Promote
from kvfs.protocol import Lease
from kvfs.protocol.codec import decode, encode


def test_promote_keeps_its_wire_strings():
    assert [str(p) for p in Promote] == ["policy", "always", "never"]
    assert Promote.ALL == ("policy", "always", "never")
    assert Promote.ALWAYS == "always" and "never" in Promote.ALL


@pytest.mark.parametrize("promote", [Promote.ALWAYS, "always"])
def test_a_lease_sends_the_same_bytes_for_the_enum_and_the_string(promote):
    line = encode(Lease(names=["a/b"], promote=promote))
    assert b'"promote":"always"' in line
    assert decode(line) == Lease(names=["a/b"], promote="always")


def test_states_compare_equal_to_their_old_strings():
    assert [str(s) for s in ReservationState] == ["open", "committing", "committed", "aborted"]
    assert [str(s) for s in PromiseState] == ["held", "kept", "broken"]
    assert ReservationState.ABORTED == "aborted" and PromiseState.HELD == "held"
