"""A cluster of kvfs nodes on one machine: network namespaces on a veth bridge.

For tests/cluster/test_cluster.py and ``kvfs bench cluster``. :class:`NetCluster` makes (as
root) a bridge and one network namespace per node with its own address (198.18.0.0/24,
the range set aside for network tests), a fourth namespace for a moto S3 server, and a
shared posix directory; every node runs its own daemon (``kvfs mount`` inside ``ip netns
exec``) with its own DRAM arena and disk tier, its peers being the other nodes. Names
carry a random suffix, so runs side by side never collide; :meth:`NetCluster.close`
removes everything (daemons, namespaces, bridge, files), also after a failure.

Faults, each a real one: :meth:`kill` (SIGKILL), :meth:`stop`/:meth:`cont`
(SIGSTOP/SIGCONT), :meth:`cut`/:meth:`mend` (``ip link set down``/``up``), and
:meth:`drop`/:meth:`undrop` (an nftables rule in the node's namespace that drops every
packet it receives, loopback aside). Traffic stays between these namespaces.

Readers use the batch client over each daemon's control socket (a path in the shared
runtime directory, reachable from any network namespace).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

__all__ = ["NetCluster", "Node", "missing_tools"]

SUBNET = "198.18.0"
CHANNEL_PORT = 7470
EVENTS_PORT = 5557
S3_PORT = 9000


def missing_tools() -> str | None:
    """Why a namespace cluster cannot be made here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install iproute2 nftables)"
    try:
        import nixl_cu12  # noqa: F401
    except ImportError:
        return "needs NIXL (pip install 'kvfs[cluster]')"
    return None


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {res.stderr.strip()}")
    return res


@dataclass
class Node:
    """One node: its name, namespace, address, veth, mountpoint and daemon."""

    name: str
    netns: str
    address: str
    veth: str
    root: Path
    pid: int | None = None
    config: Path = field(init=False)

    @property
    def mountpoint(self) -> Path:
        return self.root / "mp"

    @property
    def socket(self) -> Path:
        from kvfs.runtime import control_socket_path

        return control_socket_path(self.mountpoint)


class NetCluster:
    """*nodes* kvfs nodes (``a``, ``b``, ``c``...) and an S3 server, each in its own
    network namespace (see the module doc). *dram*/*disk*: each node's tier sizes;
    *timeout*: the peers' deadline; *landing*: ``[cluster] landing`` (None: its default);
    *extra*: more TOML for every node's config."""

    def __init__(
        self,
        nodes: int = 3,
        *,
        dram: str = "64MiB",
        disk: str = "256MiB",
        timeout: str = "2s",
        landing: str | None = None,
        s3: bool = True,
        posix: bool = True,
        extra: str = "",
    ) -> None:
        self.suffix = secrets.token_hex(3)
        self.bridge = f"kvbr{self.suffix}"
        self.base = Path(tempfile.mkdtemp(prefix=f"kvfs-cluster-{self.suffix}-"))
        self.nodes: list[Node] = []
        self._made: list[tuple[str, ...]] = []
        self.s3_proc: subprocess.Popen[bytes] | None = None
        self.s3_ns = f"kvfs-{self.suffix}-s3"
        self.s3_url = f"http://{SUBNET}.{nodes + 1}:{S3_PORT}" if s3 else None
        self.posix = self.base / "shared" if posix else None
        try:
            self._network(nodes)
            if s3:
                self._start_s3()
            for node in self.nodes:
                self._write_config(node, dram=dram, disk=disk, timeout=timeout, landing=landing, extra=extra)
            for node in self.nodes:
                self.start(node)
        except BaseException:
            self.close()
            raise

    # -- the network -------------------------------------------------------------------

    def _netns(self, ns: str, index: int) -> str:
        host, inner = f"kv{self.suffix}{index}h", f"kv{self.suffix}{index}n"
        _run("ip", "netns", "add", ns)
        self._made.append(("ip", "netns", "del", ns))
        _run("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
        self._made.append(("ip", "link", "del", host))
        _run("ip", "link", "set", inner, "netns", ns)
        _run("ip", "link", "set", host, "master", self.bridge, "up")
        _run("ip", "-n", ns, "addr", "add", f"{SUBNET}.{index}/24", "dev", inner)
        _run("ip", "-n", ns, "link", "set", inner, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        return inner

    def _network(self, count: int) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._made.append(("ip", "link", "del", self.bridge))
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(count):
            name = chr(ord("a") + i)
            ns = f"kvfs-{self.suffix}-{name}"
            veth = self._netns(ns, i + 1)
            root = self.base / name
            root.mkdir()
            self.nodes.append(Node(name, ns, f"{SUBNET}.{i + 1}", veth, root))
        if self.s3_url is not None:
            self._netns(self.s3_ns, count + 1)

    def _start_s3(self) -> None:
        assert self.s3_url is not None
        host = self.s3_url.split("//")[1].split(":")[0]
        self.s3_proc = subprocess.Popen(
            ["ip", "netns", "exec", self.s3_ns, sys.executable, "-m", "moto.server", "-H", host, "-p", str(S3_PORT)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        probe = f"import socket; socket.create_connection(('{host}', {S3_PORT}), timeout=1).close()"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if _run("ip", "netns", "exec", self.s3_ns, sys.executable, "-c", probe, check=False).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("moto's S3 server did not start in 60 s")
        # the host has no address on the bridge: the bucket is made from inside
        code = (
            f"import boto3; boto3.client('s3', endpoint_url='{self.s3_url}', region_name='us-east-1', "
            "aws_access_key_id='testing', aws_secret_access_key='testing').create_bucket(Bucket='kvfs-cluster')"
        )
        _run("ip", "netns", "exec", self.s3_ns, sys.executable, "-c", code)

    # -- the nodes ---------------------------------------------------------------------

    def _write_config(self, node: Node, *, dram: str, disk: str, timeout: str, landing: str | None, extra: str) -> None:
        lines = [
            f'[[tiers]]\nkind = "dram"\nname = "dram"\ncapacity = "{dram}"\nmlock = false\nprefault = false\n',
            f'[[tiers]]\nkind = "disk"\nname = "disk"\ncapacity = "{disk}"\npath = "{node.root}/disk"\n',
        ]
        if self.posix is not None:
            lines.append(f'[[tiers]]\nkind = "posix"\nname = "shared"\ncapacity = "1GiB"\npath = "{self.posix}"\n')
        if self.s3_url is not None:
            lines.append(
                f'[[tiers]]\nkind = "s3"\nname = "s3"\nbucket = "kvfs-cluster"\nendpoint_url = "{self.s3_url}"\n'
                'region = "us-east-1"\ntimeout = "2s"\nmax_attempts = 2\n'
            )
        lines.append(f'[events]\nzmq = "tcp://{node.address}:{EVENTS_PORT}"\n')
        lines.append(
            f'[cluster]\nnode = "{node.name}"\nlisten = "{node.address}:{CHANNEL_PORT}"\n'
            f'ucx_tls = "tcp"\ntimeout = "{timeout}"\n' + (f'landing = "{landing}"\n' if landing else "")
        )
        for other in self.nodes:
            if other is not node:
                lines.append(
                    f'[[cluster.peers]]\nname = "{other.name}"\naddress = "{other.address}:{CHANNEL_PORT}"\n'
                    f'events = "tcp://{other.address}:{EVENTS_PORT}"\n'
                )
        if extra:
            lines.append(extra)
        node.config = node.root / "kvfs.toml"
        node.config.write_text("\n".join(lines))

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self, node: Node) -> None:
        """Start *node*'s daemon (again), in its namespace; waits until it serves."""
        from kvfs.runtime import pid_path

        node.mountpoint.mkdir(exist_ok=True)
        res = subprocess.run(
            ["ip", "netns", "exec", node.netns, sys.executable, "-m", "kvfs.tools.cli", "mount", str(node.mountpoint)]
            + ["--config", str(node.config)],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=120,
            check=False,
        )
        if res.returncode != 0:
            raise RuntimeError(f"node {node.name}: kvfs mount failed: {res.stderr.strip()}")
        node.pid = int(pid_path(node.mountpoint).read_text())

    def shutdown(self, node: Node, timeout: float = 60) -> None:
        """End *node*'s daemon cleanly (SIGTERM: it unmounts and flushes)."""
        if node.pid is None:
            return
        self._signal(node, signal.SIGCONT)
        self._signal(node, signal.SIGTERM)
        self._reap(node, timeout)

    def _reap(self, node: Node, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while node.pid is not None and time.monotonic() < deadline:
            try:
                os.kill(node.pid, 0)
            except ProcessLookupError:
                node.pid = None
                return
            time.sleep(0.05)
        if node.pid is not None:
            self._signal(node, signal.SIGKILL)
            node.pid = None

    def _signal(self, node: Node, sig: int) -> None:
        if node.pid is not None:
            try:
                os.kill(node.pid, sig)
            except ProcessLookupError:
                pass

    # -- faults ------------------------------------------------------------------------

    def kill(self, node: Node) -> None:
        self._signal(node, signal.SIGKILL)
        self._reap(node, 30)

    def stop(self, node: Node) -> None:
        self._signal(node, signal.SIGSTOP)

    def cont(self, node: Node) -> None:
        self._signal(node, signal.SIGCONT)

    def cut(self, node: Node) -> None:
        _run("ip", "-n", node.netns, "link", "set", node.veth, "down")

    def mend(self, node: Node) -> None:
        _run("ip", "-n", node.netns, "link", "set", node.veth, "up")

    def drop(self, node: Node) -> None:
        rules = (
            "table inet kvfsfault {\n chain input {\n  type filter hook input priority 0; policy accept;\n"
            '  iifname != "lo" drop\n }\n}\n'
        )
        subprocess.run(
            ["ip", "netns", "exec", node.netns, "nft", "-f", "-"], input=rules, text=True, check=True, timeout=30
        )

    def undrop(self, node: Node) -> None:
        _run("ip", "netns", "exec", node.netns, "nft", "delete", "table", "inet", "kvfsfault", check=False)

    # -- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        for node in self.nodes:
            try:
                self.shutdown(node, timeout=30)
            except (OSError, subprocess.SubprocessError) as exc:  # teardown goes on whatever one node did
                print(f"netcluster: node {node.name}: {exc}", file=sys.stderr)
        if self.s3_proc is not None:
            try:
                os.killpg(self.s3_proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.s3_proc.wait(timeout=30)
        for cmd in reversed(self._made):
            _run(*cmd, check=False)
        self._made.clear()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def checked_get(client: object, name: str, expected: bytes) -> str:
    """Read *name* through *client* (a :class:`kvfs.client.Client`) and compare every byte:
    ``"ok"`` when they are *expected*'s, ``"miss"`` when the block is not readable now
    (not found, or its tiers unavailable); raises ``AssertionError`` on wrong bytes."""
    from kvfs.client import BatchError
    from kvfs.errors import KvfsError

    out = bytearray(len(expected) + 1)
    try:
        [n] = client.get_into([name], [out])  # type: ignore[attr-defined]
    except BatchError:
        return "miss"
    except KvfsError:
        return "miss"
    if n != len(expected) or out[:n] != expected:
        raise AssertionError(f"{name}: wrong bytes ({n} bytes read, {len(expected)} expected)")
    return "ok"


def block_name(i: int, tag: str = "m") -> str:
    """A hashed block name, as engines lay them out (``<namespace>/<ab>/<hex>``)."""
    h = secrets.token_hex(16)
    return f"{tag}/{h[:2]}/{h}"
