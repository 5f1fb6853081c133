"""Blocking calls in a helper process, with a deadline: a call that hangs in the kernel
holds the helper, never the daemon.

A thread blocked in a call into a filesystem that stopped answering cannot be interrupted,
and on some filesystems cannot even be killed: a request a FUSE server (a FUSE-based
shared filesystem, tools/stallfs.py in the tests) has taken is waited for uninterruptibly,
so the process that made it cannot end -- its main thread exits, but the process, with
everything it holds, stays until the filesystem answers. A tier whose filesystem may do
that (``posix``) makes its calls here instead: in a helper process of its own, started
with the tier (``python -m kvfs.helper``), one per tier, which serves each call in a thread
of its own. The caller waits at most ``timeout`` seconds for an answer and gets
:class:`~kvfs.errors.TierUnavailable` after it (the call is abandoned; its answer, when it
comes, is dropped). At most ``2 * workers`` calls are in the helper at once, so a hung
filesystem ties up a fixed number of its threads. When the tier closes, the helper is told
by the end of its socket and exits -- or, with a call stuck in the kernel, stays until that
call returns: the helper, not the daemon, which exits at once.

Calls and answers cross a socket pair as pickles (a call names a method of the object the
helper builds from ``target``, ``"module:factory"``, with *args*); block bytes go over it
too, so a call costs a copy of its bytes. A helper that dies is started again at the next
call.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
from typing import Any

from .errors import KvfsError, TierUnavailable

__all__ = ["HelperProcess"]

log = logging.getLogger("kvfs.helper")

_HEADER = struct.Struct("!Q")
_STARTUP = 60.0  # seconds a helper may take to start (import kvfs, open its directory object)


def _send(sock: socket.socket, lock: threading.Lock, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    with lock:
        sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def _recv(sock: socket.socket) -> Any:
    head = _recv_exact(sock, _HEADER.size)
    if head is None:
        return None
    body = _recv_exact(sock, _HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


class _Pending:
    __slots__ = ("done", "ok", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None


class HelperProcess:
    """Calls of the methods of ``target(*args)`` in a helper process (see the module doc).
    *what* names the backend in error messages."""

    def __init__(self, what: str, target: str, args: tuple[Any, ...], *, timeout: float, workers: int) -> None:
        self.what = what
        self.target = target
        self.args = args
        self.timeout = timeout
        self.workers = max(1, workers)
        self._admitted = threading.BoundedSemaphore(2 * self.workers)
        self._lock = threading.Lock()  # the helper, its socket and the pending calls
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> socket.socket:
        """The socket of a live helper (one started now if there is none). Under the lock."""
        if self._sock is not None:
            return self._sock
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kvfs.helper", str(theirs.fileno()), self.target, str(2 * self.workers)],
                stdin=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
            )
            assert self._proc.stdin is not None
            self._proc.stdin.write(pickle.dumps(self.args))
            self._proc.stdin.close()
        except OSError as exc:
            mine.close()
            raise TierUnavailable(f"{self.what}: cannot start its helper process: {exc}") from exc
        finally:
            theirs.close()
        mine.settimeout(_STARTUP)  # a fresh interpreter: its start is not any call's deadline
        try:
            ready = _recv(mine)
        except (OSError, pickle.UnpicklingError, EOFError) as exc:
            ready = exc
        if ready != "ready":
            mine.close()
            why = ready if isinstance(ready, BaseException) else "it exited before it was ready"
            raise TierUnavailable(f"{self.what}: its helper process did not start: {why}")
        mine.settimeout(None)
        self._sock = mine
        threading.Thread(target=self._read, args=(mine,), name=f"kvfs-helper-{self.what}", daemon=True).start()
        return mine

    def _read(self, sock: socket.socket) -> None:
        """Hand each answer to the call waiting for it (or drop it: the call gave up)."""
        while True:
            try:
                msg = _recv(sock)
            except (OSError, pickle.UnpicklingError, EOFError):
                msg = None
            if msg is None:
                break
            call_id, ok, value = msg
            with self._lock:
                p = self._pending.pop(call_id, None)
            if p is not None:  # its slot is free again (also when its caller gave up)
                self._admitted.release()
                p.ok, p.value = ok, value
                p.done.set()
        with self._lock:  # the helper is gone: every call still waiting fails now
            if self._sock is sock:
                self._sock = None
            left = [(i, p) for i, p in self._pending.items() if p.value is None]
            for i, _ in left:
                del self._pending[i]
        for _, p in left:
            self._admitted.release()
            p.ok, p.value = False, TierUnavailable(f"{self.what}: its helper process exited")
            p.done.set()
        sock.close()

    def call(self, method: str, *args: Any, op: str = "operation") -> Any:
        """``target.method(*args)`` in the helper; its exception propagates unchanged.
        :class:`TierUnavailable` when it does not answer within the timeout (or the helper
        is full of stuck calls, or cannot be started)."""
        if not self._admitted.acquire(timeout=self.timeout):
            raise TierUnavailable(
                f"{self.what}: {op} not started within {self.timeout:g}s; earlier calls are still stuck"
            )
        p = _Pending()
        call_id = next(self._ids)
        registered = False
        try:
            with self._lock:
                if self._closed:
                    raise TierUnavailable(f"{self.what}: closed")
                sock = self._start()
                self._pending[call_id] = p
                registered = True
            _send(sock, self._send_lock, (call_id, method, args))
        except BaseException as exc:
            with self._lock:
                mine = self._pending.pop(call_id, None) is not None
            if mine or not registered:  # else the reader failed it (the helper is gone) and freed its slot
                self._admitted.release()
            if isinstance(exc, OSError):
                raise TierUnavailable(f"{self.what}: {op} failed: its helper process is gone ({exc})") from exc
            raise
        if not p.done.wait(self.timeout):
            raise TierUnavailable(f"{self.what}: {op} timed out after {self.timeout:g}s")
        if not p.ok:
            raise p.value
        return p.value

    def close(self) -> None:
        """Stop: the helper sees its socket end and exits (or, stuck in the kernel, stays
        until its call returns: nothing here waits for it)."""
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._proc = None  # never waited for (subprocess reaps it when it has ended)


# -- the helper process -------------------------------------------------------------------


def _answer(sock: socket.socket, lock: threading.Lock, call_id: int, fn: Any, args: tuple[Any, ...]) -> None:
    try:
        out: tuple[int, bool, Any] = (call_id, True, fn(*args))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        out = (call_id, False, exc)
    try:
        _send(sock, lock, out)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        _send(sock, lock, (call_id, False, KvfsError(f"the helper's answer could not be sent: {exc}")))
    except OSError:
        pass  # the daemon is gone


def _main(argv: list[str]) -> None:  # pragma: no cover - runs in the helper process
    fd, target, slots = int(argv[0]), argv[1], int(argv[2])
    args = pickle.loads(sys.stdin.buffer.read())
    module, _, factory = target.partition(":")
    obj = getattr(importlib.import_module(module), factory)(*args)
    sock = socket.socket(fileno=fd)
    lock = threading.Lock()
    free = threading.Semaphore(slots)
    _send(sock, lock, "ready")
    while True:
        try:
            msg = _recv(sock)
        except OSError:
            msg = None
        if msg is None:
            os._exit(0)  # the daemon closed its end (a stuck call keeps this process, never the daemon)
        call_id, method, args = msg
        free.acquire()

        def run(call_id: int = call_id, method: str = method, args: tuple[Any, ...] = args) -> None:
            try:
                _answer(sock, lock, call_id, getattr(obj, method), args)
            finally:
                free.release()

        threading.Thread(target=run, daemon=True).start()


if __name__ == "__main__":  # pragma: no cover - the helper process
    _main(sys.argv[1:])
