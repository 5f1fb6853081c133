"""Config texts the tests mount with: the DRAM-over-disk stack most of them use, and the
two-tenant one of the namespace tests."""

from __future__ import annotations


def dram_over_disk(dram: str, disk: str, path: str, *, names: bool = False) -> str:
    """A ``[[tiers]]`` text: a DRAM tier of *dram* (no prefault, no mlock: a test machine
    has neither the memory nor the limit) over a disk tier of *disk* at *path*. *path* may
    be a ``str.format`` field (``"{data}/disk"``) the caller fills in later; *names* names
    the tiers "dram" and "disk" (as metrics and ``kvfs`` output label them)."""
    dram_name = 'name = "dram"\n' if names else ""
    disk_name = 'name = "disk"\n' if names else ""
    return (
        f'[[tiers]]\nkind = "dram"\n{dram_name}capacity = "{dram}"\nprefault = false\nmlock = false\n\n'
        f'[[tiers]]\nkind = "disk"\n{disk_name}capacity = "{disk}"\npath = "{path}"\n'
    )


DEFAULT_CONFIG = (
    dram_over_disk("{dram}", "{disk}", "{data}/disk", names=True) + "\n[mount]\nallow_other = {allow_other}\n"
)
"""The ``kvfs_mount`` fixture's config: fields ``dram``, ``disk``, ``data``, ``allow_other``."""

TENANTS_CONFIG = (
    dram_over_disk("8MiB", "32MiB", "{data}/disk")
    + """
[mount]
allow_other = true

[[namespaces]]
path = "a"
owner = {a_uid}
group = {a_gid}
mode = "0750"

[[namespaces]]
path = "b"
owner = {b_uid}
group = {b_gid}
mode = "0700"
"""
)
"""Two namespaces, "a" (owner a, mode 0750) and "b" (owner b, 0700), on a mount every user
may reach: fields ``data``, ``a_uid``, ``a_gid``, ``b_uid``, ``b_gid``."""
