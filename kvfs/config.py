"""Configuration: frozen, keyword-only classes parsed once from TOML (or built in code).

A config is a stack of tiers, hottest first, a policy table and a mount table::

    [policy]
    eviction = "session-arc"  # see kvfs.policies.POLICIES and docs/policies.md
    promote = "always"        # always | second-hit | never
    admit_threshold = 0.02    # colder tiers refuse kinds of blocks read less often than this
    hint_ttl = "30s"          # how long a "read soon" hint keeps blocks

    [[tiers]]
    kind = "dram"             # dram | disk | posix | s3
    name = "dram"
    capacity = "4GiB"

    [[tiers]]
    kind = "disk"
    name = "nvme"
    capacity = "200GiB"
    path = "/var/cache/kvfs"

    [[namespaces]]            # optional: tenants and models (docs/tenants.md)
    path = "tenant-a"
    quota = { dram = "1GiB", nvme = "20GiB" }
    owner = "alice"           # uid or user name; group likewise; mode "0750"
    retention = "7d"

Every error names the field (``tiers[1].capacity``) and says what is wrong.
``default_config()`` is the embedded default used when no file is given.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .access import AccessRule, parse_mode
from .configfields import (
    PromoteMode,
    TierKind,
    Transport,
    WriteMode,
    address,
    build,
    did_you_mean,
    parse_id,
    parsed,
    unknown_key,
)
from .errors import ConfigError, InvalidName
from .hashing import Namespace
from .names import TierName, is_under, normalize
from .policies import DEFAULT_POLICY, POLICIES, PolicyContext
from .units import format_size, parse_duration, parse_size

__all__ = [
    "ClientConfig",
    "ClusterConfig",
    "Config",
    "DiskConfig",
    "DramConfig",
    "EventsConfig",
    "MountConfig",
    "NamespaceConfig",
    "PeerConfig",
    "PolicyConfig",
    "PosixConfig",
    "PromoteMode",
    "S3Config",
    "TierConfig",
    "TierKind",
    "Transport",
    "WriteMode",
    "default_config",
    "load_config",
    "namespace_path",
    "parse_config",
]


@dataclass(frozen=True, kw_only=True)
class TierConfig:
    """Fields every tier has. ``capacity`` is bytes; ``None`` means unbounded (s3 only)."""

    name: TierName
    capacity: int | None
    write: WriteMode = WriteMode.BACK
    timeout: float = 30.0
    """Seconds an operation on this tier may take before the tier is marked unhealthy."""
    concurrency: int = 4
    """Operations on this tier that may run at once (its limiter)."""

    kind: TierKind = field(init=False)


@dataclass(frozen=True, kw_only=True)
class DramConfig(TierConfig):
    """A shared-memory arena. ``path`` is the arena file (under /dev/shm); ``None`` picks
    a private name per daemon. ``mlock`` pins the pages where the limit allows."""

    kind = TierKind.DRAM
    path: Path | None = None
    mlock: bool = True
    prefault: bool = True


@dataclass(frozen=True, kw_only=True)
class DiskConfig(TierConfig):
    """Local NVMe: one block file per block under ``path``. ``direct_io``: ``None`` uses
    O_DIRECT where the filesystem supports it. ``fsync``: flush each block file (and its
    directory) to stable storage before it is renamed into place; off by default, so a
    host crash can lose the blocks written in the last seconds (found truncated or bad at
    restart, counted and dropped: never returned). docs/config.md, "Durability"."""

    kind = TierKind.DISK
    path: Path
    direct_io: bool | None = None
    fsync: bool = False


@dataclass(frozen=True, kw_only=True)
class PosixConfig(TierConfig):
    """A directory every node mounts (Lustre, NFS): the way nodes share blocks.
    ``fsync`` is on by default: other nodes read what this one published, so a block is
    on the server's stable storage before its name appears."""

    kind = TierKind.POSIX
    path: Path
    write: WriteMode = WriteMode.THROUGH
    timeout: float = 10.0
    fsync: bool = True


@dataclass(frozen=True, kw_only=True)
class S3Config(TierConfig):
    """A bucket and prefix on any S3-compatible endpoint; credentials from boto3's chain."""

    kind = TierKind.S3
    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    write: WriteMode = WriteMode.THROUGH
    timeout: float = 10.0
    max_attempts: int = 5
    multipart_threshold: int = 64 << 20
    concurrency: int = 8


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """``[policy]``. ``admit_threshold`` and ``hint_ttl`` tune the policies that use them
    (``session-arc``): :meth:`context` builds the :class:`~kvfs.policies.PolicyContext`
    to pass to :func:`~kvfs.policies.make_policy`."""

    eviction: str = DEFAULT_POLICY
    promote: PromoteMode = PromoteMode.ALWAYS
    admit_threshold: float = PolicyContext().admit_threshold
    hint_ttl: float = PolicyContext().hint_ttl

    def context(self, clock: Callable[[], float] = time.monotonic) -> PolicyContext:
        """The policy context for this config with the store's *clock*."""
        return PolicyContext(clock=clock, admit_threshold=self.admit_threshold, hint_ttl=self.hint_ttl)


@dataclass(frozen=True, kw_only=True)
class MountConfig:
    """Mount options. ``negative_ttl``: how long a miss on the shared tiers is remembered;
    ``listing_ttl``: how long a directory listing of the shared tiers is reused;
    ``write_buffer``: bytes of daemon memory for files being written (``None``: a quarter
    of physical memory); no file may grow past it. ``transport``: how FUSE requests reach
    the daemon (:class:`Transport`; docs/mount-internals.md, "Transports")."""

    allow_other: bool = False
    metrics_port: int | None = None
    negative_ttl: float = 2.0
    listing_ttl: float = 5.0
    write_buffer: int | None = None
    transport: Transport = Transport.AUTO
    open_copies: int | None = None
    """Bytes of daemon memory for copies of blocks read whole from persistent tiers
    while they are open (one per version, shared by its readers; ``None``: a quarter of
    physical memory); an open past it is ``ENOMEM``."""


@dataclass(frozen=True, kw_only=True)
class NamespaceConfig:
    """``[[namespaces]]``: a tenant's or a model's subtree (docs/tenants.md).

    ``path``: a top-level directory or a deeper subtree (namespaces do not nest; derived
    from ``model`` when not given). ``quota``: tier name -> bytes this namespace may use
    there (a tier not named: only the tier's capacity bounds it). ``owner``/``group``/
    ``mode``: who may list, read, write, evict and pin its blocks (:mod:`kvfs.access`;
    none set: the mount's defaults). ``retention``: seconds since a block's last access
    after which it is removed from every tier this node writes to. ``retired``: no new
    blocks; its local copies are dropped and ``kvfs gc`` removes it from shared tiers.
    ``model``: the hash-chain namespace it holds, with the model's fingerprint.
    """

    path: str
    quota: dict[str, int] = field(default_factory=dict)
    owner: int | None = None
    group: int | None = None
    mode: int | None = None
    retention: float | None = None
    retired: bool = False
    model: Namespace | None = None

    def access(self, uid: int, gid: int) -> AccessRule | None:
        """The access rule, with the mounting user's *uid*/*gid* for an owner or group not
        given (and mode 0750 when none is); ``None`` when none of the three is set."""
        if self.owner is None and self.group is None and self.mode is None:
            return None
        return AccessRule(
            uid=uid if self.owner is None else self.owner,
            gid=gid if self.group is None else self.group,
            mode=0o750 if self.mode is None else self.mode,
        )


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """The batch client's socket (docs/client.md). The daemon always serves its owner on
    the mount's control socket (owner-only). ``socket`` adds a socket for clients of other
    users, given to ``group`` (a group name or number; mode 0660); they may read and, with
    ``group_writes``, put under names whose access rule lets them write (never outside
    every namespace with a rule, as on the mount), but not run operator commands.
    ``lease_ttl``: a lease's default lifetime (seconds, at most 600); ``max_reserved``:
    bytes of the arena one session may hold reserved for puts at once (default: half the
    DRAM tier); ``copy_buffer``: bytes of the private buffer a session gets instead of the
    arena when a namespace's rule keeps it from mapping the arena (default:
    ``max_reserved``). ``max_connections`` (in all) and ``max_connections_per_user``:
    connections open at once (capped lower when the descriptor limit is low);
    ``max_inflight`` (in all) and ``max_inflight_per_user``: bytes of frames received and
    not yet answered, and of replies being sent (docs/SEMANTICS.md, "Limits")."""

    socket: Path | None = None
    group: str | None = None
    group_writes: bool = False
    lease_ttl: float = 60.0
    max_reserved: int | None = None
    copy_buffer: int | None = None
    max_connections: int = 1024
    max_connections_per_user: int = 64
    max_inflight: int = 256 << 20
    max_inflight_per_user: int = 64 << 20


@dataclass(frozen=True, kw_only=True)
class EventsConfig:
    """KV events for routers (docs/engines.md): with ``zmq`` (a ZMQ address, e.g.
    ``"tcp://127.0.0.1:5557"``) the daemon publishes its blocks' events there in vLLM's
    format; ``topic``: the messages' topic frame; ``block_size``: the engine's tokens per
    block, reported in ``BlockStored`` (kvfs does not know it; 0: unknown)."""

    zmq: str | None = None
    topic: str = ""
    block_size: int = 0
    audience: str = "everyone"
    """Who may subscribe, and so which block names are sent: ``everyone`` (names every
    local user may read), ``group:NAME`` (an ``ipc://`` socket of that group: what it may
    read), ``owner`` (an ``ipc://`` socket of the daemon's user: every name), ``all``
    (every name, to whoever can connect)."""


@dataclass(frozen=True, kw_only=True)
class PeerConfig:
    """``[[cluster.peers]]``: one other node whose DRAM this node reads (docs/cluster.md).

    ``name``: the node's name (its own ``[cluster] node``); ``address``: ``host:port`` of
    its peer channel (its ``[cluster] listen``); ``events``: the ZMQ address of its KV
    events (its ``[events] zmq``), how this node learns what it holds. ``uid``/``gid``:
    who this node takes that node's requests to be when it serves them: only namespaces
    that user may read are served (none given: the mounting user, a node trusted as much
    as this one)."""

    name: str
    address: str
    events: str | None = None
    uid: int | None = None
    gid: int | None = None

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """``[cluster]``: this node's peers and how it serves them (docs/cluster.md).

    ``node``: this node's name; ``listen``: ``host:port`` its peer channel listens on (for
    descriptors; the bytes move over NIXL/UCX); ``peers``: the other nodes. ``timeout``:
    the most one read from a peer may take (a slower or dead peer is skipped for a while
    afterwards); ``max_connections``: peer connections served at once (each holds at
    most one block for its asker at a time); ``ucx_tls``: UCX transports (``UCX_TLS``),
    e.g. ``"tcp"`` or ``"rc,tcp"``; none: UCX picks. ``landing``: the size of each
    landing buffer a peer writes blocks into (a larger block comes in chunks of it)."""

    node: str
    listen: str
    peers: tuple[PeerConfig, ...] = ()
    timeout: float = 2.0
    max_connections: int = 16
    ucx_tls: str | None = None
    landing: int = 4 << 20

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


@dataclass(frozen=True, kw_only=True)
class Config:
    tiers: tuple[TierConfig, ...]
    policy: PolicyConfig = PolicyConfig()
    mount: MountConfig = MountConfig()
    namespaces: tuple[NamespaceConfig, ...] = ()
    client: ClientConfig = ClientConfig()
    events: EventsConfig = EventsConfig()
    origin: str = ""
    """Where it came from, for people (the daemon's log, ``kvfs df``): the file
    :func:`load_config` read, or the embedded default and how its sizes were chosen."""
    cluster: ClusterConfig | None = None

    def tier(self, name: str) -> TierConfig:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)


_MIN_INFLIGHT = 40 << 20  # the largest frame (kvfs.protocol.MAX_FRAME, 32 MiB) and a read's chunk, with room

_KIND_CLASSES: dict[str, type[TierConfig]] = {
    "dram": DramConfig,
    "disk": DiskConfig,
    "posix": PosixConfig,
    "s3": S3Config,
}


def _check_room_below_dram(tiers: list[TierConfig]) -> None:
    """Refuse persistent tiers that together cannot hold the DRAM tier: DRAM is exclusive
    (a block's only copy may be there), so a clean unmount could not write every block
    only in DRAM down and would lose some. A DRAM-only stack (no persistent tier) is a
    cache that keeps nothing by choice: ``kvfs mount`` warns of it."""
    dram = sum(t.capacity or 0 for t in tiers if isinstance(t, DramConfig))
    below = [t for t in tiers if not isinstance(t, DramConfig)]
    if not dram or not below or any(t.capacity is None for t in below):
        return
    room = sum(t.capacity or 0 for t in below)
    if room < dram:
        names = ", ".join(f"{t.name}: {format_size(t.capacity or 0)}" for t in below)
        raise ConfigError(
            "tiers",
            f"the persistent tiers ({names}) are smaller than the DRAM tier ({format_size(dram)}): a clean unmount "
            f"could not write every block only in DRAM down; give them at least {format_size(dram)} together, "
            "or make the DRAM tier smaller",
        )


def parse_config(data: dict[str, Any]) -> Config:
    """Build a :class:`Config` from a parsed TOML document; raises :class:`ConfigError`."""
    tables = ("tiers", "policy", "mount", "client", "events", "namespaces", "cluster")
    unknown = sorted(set(data) - set(tables))
    if unknown:
        raise ConfigError(
            unknown[0],
            f"unknown top-level key{did_you_mean(unknown[0], tables)}; "
            "expected [[tiers]], [policy], [mount], [client], [events], [[namespaces]] and [cluster]",
        )
    raw_tiers = data.get("tiers")
    if not raw_tiers:
        raise ConfigError("tiers", "at least one [[tiers]] entry is required")
    if not isinstance(raw_tiers, list):
        raise ConfigError("tiers", "write tiers as [[tiers]] entries (an array of tables)")
    tiers: list[TierConfig] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_tiers):
        where = f"tiers[{i}]"
        if not isinstance(raw, dict):
            raise ConfigError(where, "expected a table")
        kind = raw.get("kind")
        if kind is None:
            every = {f.name for c in _KIND_CLASSES.values() for f in dataclasses.fields(c) if f.init} | {"kind"}
            unknown = sorted(set(raw) - every)
            if unknown:  # `knd = "dram"`: name what was written
                raise ConfigError(
                    f"{where}.{unknown[0]}",
                    f"unknown key{did_you_mean(unknown[0], every)}; every tier needs kind = one of "
                    f"{', '.join(_KIND_CLASSES)}",
                )
            raise ConfigError(f"{where}.kind", f"missing; one of {', '.join(_KIND_CLASSES)}")
        if kind not in _KIND_CLASSES:
            raise ConfigError(
                f"{where}.kind",
                f"{kind!r} is not one of {', '.join(_KIND_CLASSES)}{did_you_mean(kind, _KIND_CLASSES)}",
            )
        raw = dict(raw)
        raw.setdefault("name", kind)
        cls = _KIND_CLASSES[kind]
        keys = [f.name for f in dataclasses.fields(cls) if f.init]
        unknown = sorted(set(raw) - set(keys) - {"kind"})
        if unknown:  # before "missing": a misspelled key is named, not the key it misspells
            raise unknown_key(where, unknown[0], [*keys, "kind"], keys)
        if cls is not S3Config and "capacity" not in raw:
            raise ConfigError(f"{where}.capacity", 'missing required key (e.g. capacity = "4GiB")')
        raw.setdefault("capacity", "unlimited")
        tier = build(cls, where, raw, skip=("kind",))
        if tier.capacity is None and cls is not S3Config:
            raise ConfigError(f"{where}.capacity", 'only s3 tiers may be unlimited; give a size like "100GiB"')
        if tier.capacity == 0:
            raise ConfigError(f"{where}.capacity", "must be larger than zero")
        if not tier.name or "/" in tier.name or not tier.name.isprintable():
            raise ConfigError(f"{where}.name", f"{tier.name!r} is not a usable tier name (letters, digits, - and _)")
        if tier.name in seen:
            raise ConfigError(f"{where}.name", f"tier name {tier.name!r} is used twice")
        seen.add(tier.name)
        if isinstance(tier, S3Config) and len(tier.bucket) < 3:
            raise ConfigError(f"{where}.bucket", "S3 bucket names are at least 3 characters long")
        tiers.append(tier)
    for i, tier in enumerate(tiers):
        if isinstance(tier, DramConfig) and i != 0:
            raise ConfigError(f"tiers[{i}].kind", "a dram tier must be the first (hottest) tier")
    _check_room_below_dram(tiers)
    policy = build(PolicyConfig, "policy", data.get("policy", {}))
    if policy.eviction not in POLICIES:
        raise ConfigError(
            "policy.eviction",
            f"{policy.eviction!r} is not one of {', '.join(POLICIES)}{did_you_mean(policy.eviction, POLICIES)}",
        )
    mount = build(MountConfig, "mount", data.get("mount", {}))
    if mount.metrics_port is not None and not 0 <= mount.metrics_port <= 65535:
        raise ConfigError("mount.metrics_port", "must be a TCP port number (0-65535)")
    client = build(ClientConfig, "client", data.get("client", {}))
    if client.group is not None and client.socket is None:
        raise ConfigError("client.group", "a group needs client.socket: the path of the socket to give it")
    if not 0 < client.lease_ttl <= 600:
        raise ConfigError("client.lease_ttl", "must be more than 0 and at most 600 seconds")
    for key in ("max_inflight", "max_inflight_per_user"):
        if getattr(client, key) < _MIN_INFLIGHT:
            raise ConfigError(
                f"client.{key}", f"must be at least {_MIN_INFLIGHT >> 20}MiB: one frame of the largest size"
            )
    events = build(EventsConfig, "events", data.get("events", {}))
    if events.zmq is not None and "://" not in events.zmq:
        raise ConfigError("events.zmq", f'{events.zmq!r} is not a ZMQ address; e.g. "tcp://127.0.0.1:5557"')
    if events.audience not in ("everyone", "owner", "all") and not events.audience.startswith("group:"):
        raise ConfigError("events.audience", f"{events.audience!r} is not one of everyone, owner, all, group:NAME")
    if events.audience.startswith(("owner", "group:")) and not (events.zmq or "").startswith("ipc://"):
        raise ConfigError(
            "events.audience",
            f"{events.audience!r} needs an ipc:// address (a socket file kvfs gives that audience): any local user "
            f"can connect to {events.zmq!r}",
        )
    namespaces = _parse_namespaces(data.get("namespaces", []), [t.name for t in tiers])
    cluster = None if "cluster" not in data else _parse_cluster(data["cluster"], tiers)
    return Config(
        tiers=tuple(tiers),
        policy=policy,
        mount=mount,
        client=client,
        events=events,
        namespaces=namespaces,
        cluster=cluster,
    )


_CLUSTER_KEYS = ("node", "listen", "peers", "timeout", "max_connections", "ucx_tls", "landing")
_PEER_KEYS = ("name", "address", "events", "uid", "gid")


def _parse_cluster(raw: Any, tiers: list[TierConfig]) -> ClusterConfig:
    """``[cluster]`` with its ``[[cluster.peers]]``; ConfigError naming the field."""
    if not isinstance(raw, dict):
        raise ConfigError("cluster", "expected a table")
    unknown = sorted(set(raw) - set(_CLUSTER_KEYS))
    if unknown:
        raise ConfigError(f"cluster.{unknown[0]}", f"unknown key; known keys are {', '.join(sorted(_CLUSTER_KEYS))}")
    for key in ("node", "listen"):
        if key not in raw:
            raise ConfigError(f"cluster.{key}", "missing required key")
    node = raw["node"]
    if not isinstance(node, str) or not node or not node.replace("-", "").replace("_", "").isalnum():
        raise ConfigError("cluster.node", f"{node!r} is not a usable node name (letters, digits, - and _)")
    kwargs: dict[str, Any] = {"node": node, "listen": address("cluster.listen", raw["listen"])}
    if "timeout" in raw:
        kwargs["timeout"] = parsed("cluster.timeout", parse_duration, raw["timeout"])
        if not 0 < kwargs["timeout"] <= 60:
            raise ConfigError("cluster.timeout", "must be more than 0 and at most 60 seconds")
    if "max_connections" in raw:
        n = raw["max_connections"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024:
            raise ConfigError("cluster.max_connections", "expected a whole number from 1 to 1024")
        kwargs["max_connections"] = n
    if "landing" in raw:
        kwargs["landing"] = parsed("cluster.landing", parse_size, raw["landing"])
        if not 64 << 10 <= kwargs["landing"] <= 1 << 30:
            raise ConfigError(
                "cluster.landing", "must be from 64KiB to 1GiB (each peer has up to 4 landing buffers this size)"
            )
    if "ucx_tls" in raw:
        if not isinstance(raw["ucx_tls"], str) or not raw["ucx_tls"]:
            raise ConfigError("cluster.ucx_tls", 'expected UCX transports, e.g. "tcp" or "rc,tcp"')
        kwargs["ucx_tls"] = raw["ucx_tls"]
    peers = raw.get("peers", [])
    if not isinstance(peers, list):
        raise ConfigError("cluster.peers", "write peers as [[cluster.peers]] entries (an array of tables)")
    seen = {node}
    out: list[PeerConfig] = []
    for i, table in enumerate(peers):
        where = f"cluster.peers[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(where, "expected a table")
        unknown = sorted(set(table) - set(_PEER_KEYS))
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}", f"unknown key; known keys are {', '.join(sorted(_PEER_KEYS))}")
        for key in ("name", "address"):
            if key not in table:
                raise ConfigError(f"{where}.{key}", "missing required key")
        name = table["name"]
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name", "expected a node name")
        if name in seen:
            what = "this node's own name" if name == node else "used twice"
            raise ConfigError(f"{where}.name", f"{name!r} is {what}; every peer is another node, named once")
        seen.add(name)
        events = table.get("events")
        if events is not None and (not isinstance(events, str) or "://" not in events):
            raise ConfigError(f"{where}.events", f'{events!r} is not a ZMQ address; e.g. "tcp://10.0.0.2:5557"')
        peer = PeerConfig(
            name=name,
            address=address(f"{where}.address", table["address"]),
            events=events,
            uid=parse_id(f"{where}.uid", table.get("uid"), "user"),
            gid=parse_id(f"{where}.gid", table.get("gid"), "group"),
        )
        out.append(peer)
    if not tiers or tiers[0].kind is not TierKind.DRAM:
        raise ConfigError("cluster", "peers read into and serve from the DRAM arena: the first tier must be dram")
    kwargs["peers"] = tuple(out)
    return ClusterConfig(**kwargs)


_NAMESPACE_KEYS = ("path", "quota", "owner", "group", "mode", "retention", "retired", "model")
_MODEL_KEYS = tuple(f.name for f in dataclasses.fields(Namespace))


def _parse_namespaces(raw: Any, tier_names: list[str]) -> tuple[NamespaceConfig, ...]:
    if not isinstance(raw, list):
        raise ConfigError("namespaces", "write namespaces as [[namespaces]] entries (an array of tables)")
    out: list[NamespaceConfig] = []
    for i, table in enumerate(raw):
        ns = _parse_namespace(f"namespaces[{i}]", table, tier_names)
        for j, other in enumerate(out):
            if ns.path == other.path:
                raise ConfigError(f"namespaces[{i}].path", f"{ns.path!r} is namespaces[{j}] already")
        namespace_path(f"namespaces[{i}].path", ns.path, [o.path for o in out])
        out.append(ns)
    return tuple(out)


def namespace_path(where: str, raw: Any, others: Iterable[str] = ()) -> str:
    """*raw* as a namespace's path: normalized, not the root, nesting none of *others*
    (the paths of the other namespaces, which it may equal). Raises :class:`ConfigError`
    naming *where*."""
    if not isinstance(raw, str):
        raise ConfigError(where, 'expected a path string inside the mount, like "tenant-a"')
    try:
        path = normalize(raw)
    except InvalidName as exc:
        raise ConfigError(where, str(exc)) from None
    if not path:
        raise ConfigError(where, "the mount's root cannot be a namespace; name a directory in it")
    for other in others:
        if other != path and (is_under(path, other) or is_under(other, path)):
            inner, outer = (path, other) if is_under(path, other) else (other, path)
            raise ConfigError(where, f"{inner!r} lies inside namespace {outer!r}; namespaces do not nest")
    return path


def _parse_namespace(where: str, table: Any, tier_names: list[str]) -> NamespaceConfig:
    if not isinstance(table, dict):
        raise ConfigError(where, "expected a table")
    unknown = sorted(set(table) - set(_NAMESPACE_KEYS))
    if unknown:
        raise unknown_key(where, unknown[0], _NAMESPACE_KEYS)
    model = _parse_model(f"{where}.model", table["model"]) if "model" in table else None
    path: str
    if "path" in table:
        path = namespace_path(f"{where}.path", table["path"])
    elif model is not None:
        path = model.dirname()
    else:
        raise ConfigError(f"{where}.path", "missing required key (or give model = {...} to derive it)")
    raw_quota = table.get("quota", {})
    if not isinstance(raw_quota, dict):
        raise ConfigError(f"{where}.quota", 'expected a table of tier = size, like { dram = "1GiB" }')
    quota: dict[str, int] = {}
    for tier, size in raw_quota.items():
        if tier not in tier_names:
            raise ConfigError(
                f"{where}.quota.{tier}",
                f"no tier named {tier!r}{did_you_mean(tier, tier_names)}; tiers: {', '.join(tier_names)}",
            )
        quota[tier] = parsed(f"{where}.quota.{tier}", parse_size, size)
    retention = None
    if "retention" in table:
        retention = parsed(f"{where}.retention", parse_duration, table["retention"])
        if retention <= 0:
            raise ConfigError(f"{where}.retention", "must be longer than zero (leave it out to keep blocks)")
    retired = table.get("retired", False)
    if not isinstance(retired, bool):
        raise ConfigError(f"{where}.retired", "expected true or false")
    return NamespaceConfig(
        path=path,
        quota=quota,
        owner=parse_id(f"{where}.owner", table.get("owner"), "user"),
        group=parse_id(f"{where}.group", table.get("group"), "group"),
        mode=parsed(f"{where}.mode", parse_mode, table["mode"]) if "mode" in table else None,
        retention=retention,
        retired=retired,
        model=model,
    )


def _parse_model(where: str, table: Any) -> Namespace:
    if not isinstance(table, dict):
        raise ConfigError(where, "expected a table: { model, dtype, num_layers, num_kv_heads, head_size, ... }")
    unknown = sorted(set(table) - set(_MODEL_KEYS))
    if unknown:
        raise unknown_key(where, unknown[0], _MODEL_KEYS)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(Namespace):
        if f.name not in table:
            if f.default is dataclasses.MISSING:
                raise ConfigError(f"{where}.{f.name}", "missing required key")
            continue
        value = table[f.name]
        want = int if f.type in ("int", int) else str
        if isinstance(value, bool) or not isinstance(value, want):
            raise ConfigError(f"{where}.{f.name}", f"expected {'a whole number' if want is int else 'a string'}")
        kwargs[f.name] = value
    return Namespace(**kwargs)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and parse a TOML config file; every failure is a :class:`ConfigError`."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), f"cannot read the config file: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(p), f"not valid TOML: {exc}") from exc
    return dataclasses.replace(parse_config(data), origin=str(p.absolute()))


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - every Linux has these
        return 8 << 30


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/kvfs`` or ``~/.cache/kvfs``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "kvfs"


def default_config() -> Config:
    """The embedded default: a DRAM tier of 1/16 of memory (256 MiB to 8 GiB) over a
    disk tier in the user's cache directory of a quarter of its free space (up to 64 GiB),
    but at least the DRAM tier's size where half the free space allows, so a clean
    unmount can write everything in DRAM down.
    """
    dram = min(max(_memory_bytes() // 16, 256 << 20), 8 << 30)
    disk_dir = default_cache_dir() / "disk"
    probe = disk_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    disk = max(min(free // 4, 64 << 30), min(dram, free // 2), 256 << 20)
    dram, disk = dram & ~0xFFFFF, disk & ~0xFFFFF
    return Config(
        tiers=(
            DramConfig(name=TierName("dram"), capacity=dram),
            DiskConfig(name=TierName("disk"), capacity=disk, path=disk_dir),
        ),
        origin=(
            f"the embedded default: dram {format_size(dram)} (1/16 of memory, 256 MiB to 8 GiB; "
            f"reserved as it is used), disk {format_size(disk)} in {disk_dir} "
            "(a quarter of its filesystem's free space, up to 64 GiB)"
        ),
    )
