"""``kvfs bench fuzz``: the socket protocol fuzzed, the codec alone and a real daemon.

Inputs are drawn by hypothesis (``pip install 'kvfs[test]'``) from strategies of frames a
careless or hostile client could send:

- **valid** messages of every kind, their fields drawn from their types (names, huge and
  negative numbers, NaN and infinities, long lists);
- the same frames **mutated**: bytes flipped, inserted, deleted, the frame cut short;
- random **JSON** (objects with a real kind and random fields, nested values) and random
  **bytes**;
- **sessions**: a few frames on one connection (a hello, then reserves, commits, leases
  and releases of ids from replies or made up), the connection then half-closed or cut.

Two properties:

- **codec**: :func:`kvfs.protocol.decode` of any input returns a message (which encodes
  and decodes back to itself) or raises :class:`~kvfs.protocol.ProtocolError`, never
  anything else.
- **daemon**: every frame sent to the daemon's socket is answered with frames that decode,
  none an ``InternalError``; the daemon stays alive and answers; and once the fuzzing
  connections are gone it holds no lease and no reservation.

``kvfs bench fuzz --seconds 600`` mounts kvfs in a temporary directory, runs both for that
long (the codec a tenth of it), plus one frame past the size limit and one nested 200,000
deep, and prints the inputs tried, the crashes (0), whether the daemon is alive, and its
RSS and descriptors before and after. ``tests/protocol/test_fuzz_protocol.py`` runs the same for
about a minute in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvfs.protocol import VERSION

from .render import table
from .scratch import dram_disk_config, mount, umount
from .soak_parts import rss_fds

_V = b'{"v":%d,' % VERSION  # a raw frame's start, in this release's protocol version

MiB = 1 << 20
_SKIP = frozenset({"shutdown"})  # a fuzzer that unmounts its daemon tests nothing more
_REPLY_TIMEOUT = 60.0  # seconds to wait for the daemon's answers to one input


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=300.0, help="how long to fuzz the daemon (default 300)")
    parser.add_argument("--dir", default=None, help="where to mount (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _need_hypothesis() -> Any:
    try:
        import hypothesis
    except ImportError:
        raise SystemExit("kvfs bench fuzz needs hypothesis: pip install 'kvfs[test]'") from None
    return hypothesis


# -- strategies -------------------------------------------------------------------------


def strategies() -> dict[str, Any]:
    """The hypothesis strategies: ``message`` (a valid request), ``frame`` (bytes of one
    input, without its newline), ``session`` (a list of frames for one connection)."""
    from hypothesis import strategies as st

    from kvfs.protocol import Request, encode
    from kvfs.protocol.codec import kinds

    names = st.one_of(
        st.sampled_from(["fz/ab/x", "fz", "", "/", "fz/../x", "a" * 300, "fz\x00x", "ns/00/0011223344556677"]),
        st.text(max_size=40),
    )
    ints = st.one_of(st.integers(-5, 70_000), st.sampled_from([-(2**63), 2**63 - 1, 2**64 - 1, 2**64, 2**80]))
    floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1e-9, 1e300, -1.0]))

    def of(tp: Any, depth: int = 0) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is int:
            return ints
        if tp is float:
            return floats
        if tp is str:
            return names
        if tp is bool:
            return st.booleans()
        if tp is type(None):
            return st.none()
        if tp is Any:
            return st.none()
        if origin in (typing.Union, __import__("types").UnionType):
            return st.one_of(*[of(a, depth) for a in args])
        if origin in (list, tuple):
            return st.lists(of(args[0], depth + 1), max_size=8 if depth else 20)
        if origin is dict:
            return st.dictionaries(names, of(args[1], depth + 1), max_size=4)
        if isinstance(tp, type) and hasattr(tp, "__dataclass_fields__"):
            hints = typing.get_type_hints(tp)
            fields = {n: of(hints[n], depth + 1) for n, f in tp.__dataclass_fields__.items() if f.init}
            return st.fixed_dictionaries({}, optional=fields)
        return st.none()

    requests = sorted(
        (c for k, c in kinds().items() if issubclass(c, Request) and k not in _SKIP), key=lambda c: c.kind
    )

    def body(cls: type) -> Any:
        return of(cls).map(lambda d, c=cls: {"v": VERSION, "kind": c.kind, **d})

    bodies = st.one_of(*[body(c) for c in requests])
    valid = bodies.map(lambda b: json.dumps(b, allow_nan=True).encode())

    def mutate(frame: bytes, edits: list[tuple[int, int, int]]) -> bytes:
        out = bytearray(frame)
        for kind, at, byte in edits:
            if not out:
                break
            i = at % len(out)
            if kind == 0:
                out[i] = byte
            elif kind == 1:
                out.insert(i, byte)
            elif kind == 2:
                del out[i]
            else:
                del out[i:]
        return bytes(out).replace(b"\n", b" ")

    edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)
    mutated = st.builds(mutate, valid, edits)
    json_values = st.recursive(
        st.none() | st.booleans() | ints | floats | names,
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(names, inner, max_size=5),
        max_leaves=30,
    )
    kinds_ = st.sampled_from([c.kind for c in requests] + ["error", "pong", "nope", ""])
    random_json = st.builds(
        lambda k, d, v: json.dumps({"v": v, "kind": k, **d}, allow_nan=True).encode(),
        kinds_,
        st.dictionaries(names, json_values, max_size=5),
        st.sampled_from([2, 2, 2, 1, 3, "2", None]),
    )
    raw = st.binary(max_size=300).map(lambda b: b.replace(b"\n", b" "))
    frame = st.one_of(valid, valid, mutated, mutated, random_json, raw)
    session = st.tuples(st.lists(frame, min_size=1, max_size=5), st.sampled_from(["close", "cut"]))
    return {"message": bodies, "frame": frame, "session": session, "encode": encode}


# -- the properties -----------------------------------------------------------------------


def codec_property(frame: bytes) -> None:
    """Decoding *frame* gives a message that survives the wire, or a ProtocolError."""
    from kvfs.protocol import ProtocolError, decode, encode

    try:
        msg = decode(frame)
    except ProtocolError:
        return
    assert decode(encode(msg)) == msg, f"{frame[:200]!r} does not survive the wire"


class DaemonGone(AssertionError):
    """The daemon stopped answering its socket."""


@dataclass
class DaemonFuzz:
    """Fuzz sessions against the daemon socket at *path* (see the module doc)."""

    path: Path
    inputs: int = 0
    frames: int = 0
    replies: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(_REPLY_TIMEOUT)
        try:
            s.connect(str(self.path))
        except OSError as exc:
            s.close()
            raise DaemonGone(f"the daemon's socket refuses connections: {exc}") from None
        return s

    def session(self, frames: list[bytes], end: str) -> None:
        """Send *frames* on one connection, then half-close it (``close``: every answer is
        read) or cut it mid-frame (``cut``); check every answer."""
        from kvfs.protocol import Error, decode

        self.inputs += 1
        self.frames += len(frames)
        s = self.connect()
        try:
            data = b"".join(f + b"\n" for f in frames)
            if end == "cut":
                data += _V + b' "kind": "lookup", "names": ["half'
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed on us (a frame over a limit): its answer is read below
            buf = bytearray()
            while True:
                try:
                    chunk = s.recv(1 << 20)
                except ConnectionResetError:
                    break
                except TimeoutError:
                    raise DaemonGone(f"no answer within {_REPLY_TIMEOUT:.0f}s to {frames[:3]!r}") from None
                if not chunk:
                    break
                buf += chunk
        finally:
            s.close()
        for line in bytes(buf).splitlines():
            reply = decode(line)  # the daemon only ever sends frames of its protocol
            self.replies += 1
            if isinstance(reply, Error):
                self.errors[reply.type] = self.errors.get(reply.type, 0) + 1
                assert reply.type != "InternalError", f"{reply.message} (after {frames[:3]!r})"

    def ping(self) -> None:
        s = self.connect()
        try:
            s.sendall(_V + b' "kind": "ping"}\n')
            reply = s.makefile("rb").readline()
        except OSError as exc:
            raise DaemonGone(f"the daemon does not answer a ping: {exc}") from None
        finally:
            s.close()
        if b'"pong"' not in reply:
            raise DaemonGone(f"the daemon answered a ping with {reply[:200]!r}")

    def extremes(self) -> None:
        """One frame past the size limit, one nested 200,000 deep, one of 2M values."""
        from kvfs.protocol import MAX_FRAME

        self.session([_V + b'"kind":"lookup","names":["' + b"x" * (MAX_FRAME + 10) + b'"]}'], "close")
        self.session([b"[" * 200_000 + b"]" * 200_000], "close")
        self.session([_V + b'"kind":"renew","ids":[' + b"1," * 2_000_000 + b"1]}"], "close")


def run_for(seconds: float, prop: Any, strategy: Any, *, batch: int = 200) -> tuple[int, list[str]]:
    """Run hypothesis on *prop* over *strategy* in batches until *seconds* pass; returns
    the examples tried and the crashes (each with its falsifying input)."""
    hypothesis = _need_hypothesis()
    from hypothesis import HealthCheck, given, settings

    tried = 0
    crashes: list[str] = []

    def counted(x: Any) -> None:
        nonlocal tried
        tried += 1
        prop(*x) if isinstance(x, tuple) else prop(x)

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not crashes:
        test = settings(
            max_examples=batch,
            deadline=None,
            database=None,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
            phases=[hypothesis.Phase.generate, hypothesis.Phase.shrink],
        )(given(strategy)(counted))  # type: ignore[no-untyped-call, unused-ignore]  # hypothesis (when installed) types given()'s result as unannotated
        try:
            test()
        except DaemonGone:
            raise
        except Exception as exc:  # noqa: BLE001 - a falsified property, whatever it raised: its input is in the message
            crashes.append(f"{type(exc).__name__}: {str(exc)[:2000]}")
    return tried, crashes


# -- the bench --------------------------------------------------------------------------


def fuzz_daemon(mp: Path, pid: int, seconds: float) -> dict[str, Any]:
    """Fuzz the daemon of *mp* (pid *pid*) for *seconds*; the figures."""
    from kvfs.client import Client
    from kvfs.mount.paths import control_socket_path
    from kvfs.protocol import Statistics

    with Client(mp, write=True) as c:  # something to name: blocks the fuzzer may hit
        c.put([f"fz/ab/{i}" for i in range(16)], [bytes([i]) * 8192 for i in range(16)])
    strat = strategies()
    fuzz = DaemonFuzz(control_socket_path(mp))
    fuzz.ping()
    rss0, fds0 = rss_fds(pid)
    t0 = time.monotonic()
    codec_tried, crashes = run_for(max(2.0, seconds / 10), codec_property, strat["frame"], batch=500)
    try:
        _, daemon_crashes = run_for(seconds, fuzz.session, strat["session"])
        crashes += daemon_crashes
        fuzz.extremes()
        fuzz.ping()
        alive = True
    except DaemonGone as exc:
        crashes.append(str(exc))
        alive = False
    took = time.monotonic() - t0
    held = None
    rss1, fds1 = rss_fds(pid) if alive else (0, 0)
    if alive:
        with Client(mp) as c:
            st = c._request(Statistics()).statistics
        held = {"leases": st.leases, "reserved": st.reserved}
        if st.leases or st.reserved:
            crashes.append(f"the daemon still holds {held} after every fuzzing connection ended")
    return {
        "seconds": took,
        "codec_inputs": codec_tried,
        "daemon_inputs": fuzz.inputs,
        "frames": fuzz.frames,
        "replies": fuzz.replies,
        "errors": dict(sorted(fuzz.errors.items(), key=lambda kv: -kv[1])),
        "crashes": crashes,
        "alive": alive,
        "held_after": held,
        "rss_before": rss0,
        "rss_after": rss1,
        "fds_before": fds0,
        "fds_after": fds1,
    }


def run(args: argparse.Namespace) -> int:
    _need_hypothesis()
    base = Path(tempfile.mkdtemp(prefix="kvfs-bench-fuzz-", dir=args.dir))
    mp = base / "mnt"
    load = os.getloadavg()[0]
    try:
        pid = mount(mp, dram_disk_config(base, "64MiB", "256MiB", "fuzz.toml"))
        try:
            if not args.json:
                print(f"kvfs bench fuzz: {args.seconds:.0f} s on {mp} (load average {load:.2f})", file=sys.stderr)
            r = fuzz_daemon(mp, pid, args.seconds)
        finally:
            umount(mp)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    r["load"] = load
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        rows = [
            ("inputs tried (codec)", f"{r['codec_inputs']:,}", "decode of random, mutated and valid frames"),
            ("inputs tried (daemon)", f"{r['daemon_inputs']:,}", f"{r['frames']:,} frames, {r['replies']:,} replies"),
            ("crashes", f"{len(r['crashes'])}", "an exception other than ProtocolError, an InternalError, no answer"),
            ("daemon alive", "yes" if r["alive"] else "NO", "answers a ping after the run"),
            ("held after", json.dumps(r["held_after"]), "leases and reservations once every connection ended"),
            ("RSS", f"{r['rss_before'] / MiB:.1f} -> {r['rss_after'] / MiB:.1f} MiB", ""),
            ("descriptors", f"{r['fds_before']} -> {r['fds_after']}", ""),
        ]
        print(f"kvfs bench fuzz: {r['seconds']:.0f} s, load average {load:.2f} at the start")
        print(table(["", "", ""], rows, right=[1]))
        print("errors answered: " + ", ".join(f"{k} {v}" for k, v in r["errors"].items()))
        for c in r["crashes"]:
            print(f"  ! {c}")
        print("OK" if not r["crashes"] and r["alive"] else "FAILED")
    return 0 if not r["crashes"] and r["alive"] else 1
