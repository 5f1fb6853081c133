"""How a lease treats a block whose hottest local copy is in a persistent tier.

:class:`Promote` is the closed set a lease's ``promote`` takes, the same strings on the wire
(``kvfs.protocol``'s ``lease`` and ``checkout`` requests), in the client's API and in
``Store.lease_many``: a ``str`` enum, so ``"always"`` and ``Promote.ALWAYS`` are equal. The
store's own ``[policy] promote`` is :class:`kvfs.config.PromoteMode`.
"""

from __future__ import annotations

import enum

__all__ = ["Promote"]


class Promote(enum.StrEnum):
    """``POLICY`` follows the store's ``[policy] promote`` (copy the block into DRAM first
    when the policy would promote on this read, else lease the file); ``ALWAYS`` copies it
    into DRAM first; ``NEVER`` leases the file (the client reads and verifies it).
    ``Promote.ALL`` is every value, as plain strings (to check a string against)."""

    POLICY = "policy"
    ALWAYS = "always"
    NEVER = "never"
    ALL = enum.nonmember(("policy", "always", "never"))
