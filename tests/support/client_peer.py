"""A batch-client process for the tests, driven line by line over stdin.

Each line is a command; each answer one JSON line on stdout, ``{"ok": true, ...}`` or
``{"ok": false, "type": ERROR CLASS, "error": MESSAGE}``. It holds what it takes (views,
leases, reservations) until told to release, or until it is killed: that is the point of
it (a client SIGKILLed while holding leases). Block contents are ``blob(seed, size)``.

Commands: ``connect WHERE [write]``, ``become UID GID`` (drop root, keeping the
interpreter: the test machine's Python is not readable by other users), ``put NAME SEED
SIZE [PARENT]``, ``read NAME [never|always|policy]`` (get_into a fresh buffer), ``view
NAME`` (hold a zero-copy view), ``viewhash NAME`` (hash what a held view shows now),
``lease NAME [never|always]`` (hold a lease, answer where the copy is), ``reserve NAME
SIZE`` (hold a reservation, written, uncommitted), ``release``, ``mapwrite`` (make the
arena mapping writable and write it), ``raw KIND JSON`` (send any request, answer the
reply), ``each OP NAME,NAME,...`` (one batch call of lookup, read, view, lease, put, pin,
evict or prefetch, or stat/ls/du per name: per name "ok" or [error class, message]),
``events start``/``events stop`` (subscribe; answer the names seen), ``views NAME,...``
(hold views of them), ``readmany NAME,... ROOM`` (get_into buffers of ROOM bytes),
``shrink`` (try to truncate a copy buffer), ``exit``.
``become UID GID [G1,G2]`` also sets supplementary groups.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import random
import sys
import threading
import traceback

from kvfs.client import BatchError, Client
from kvfs.protocol.codec import kinds


def blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def sha(data) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def main() -> None:
    client: Client | None = None
    views: dict[str, object] = {}
    holds: list[object] = []
    reserved: list[object] = []
    for line in sys.stdin:
        cmd, *args = line.split(" ", 2) if line.startswith("raw ") else line.split()
        try:
            out: dict = {}
            if cmd == "connect":
                client = Client(args[0], write=len(args) > 1 and args[1] == "write", name="test peer")
                w = client.welcome
                out = {"owner": w.owner, "write": w.write, "max_put": w.max_put, "arena": w.arena is not None}
                out["copy_buffer"] = w.copy_buffer
            elif cmd == "become":
                os.setgroups([int(g) for g in args[2].split(",")] if len(args) > 2 else [])
                os.setgid(int(args[1]))
                os.setuid(int(args[0]))
            elif cmd == "put":
                name, seed, size = args[0], int(args[1]), int(args[2])
                client.put([name], [blob(seed, size)], parents=[args[3] if len(args) > 3 else None])
            elif cmd == "read":
                st = client.lookup([args[0]])[0]
                buf = bytearray(st.size if st else 1)
                [n] = client.get_into([args[0]], [buf], promote=args[1] if len(args) > 1 else None)
                out = {"sha": sha(buf[:n]), "size": n}
            elif cmd == "view":
                [v] = client.get([args[0]])
                views[args[0]] = v
                out = {"sha": sha(v.data), "tier": v.tier}
            elif cmd == "viewhash":
                out = {"sha": sha(views[args[0]].data)}
            elif cmd == "lease":
                [h] = client.lease([args[0]], promote=args[1] if len(args) > 1 else "never")
                holds.append(h)
                out = {"kind": h.kind, "path": h.path, "offset": h.offset, "length": h.length, "tier": h.tier}
            elif cmd == "reserve":
                reserved += client.reserve([args[0]], [int(args[1])])
                reserved[-1].data[:] = blob(1, int(args[1]))
            elif cmd == "release":
                client.release([*views.values(), *holds])
                views.clear()
                holds.clear()
            elif cmd == "views":
                names = args[0].split(",")
                try:
                    got = client.get(names)
                except BatchError as exc:
                    got = exc.results
                out = {"results": [sha(v.data) if hasattr(v, "data") else type(v).__name__ for v in got]}
                views.update({n: v for n, v in zip(names, got) if hasattr(v, "data")})
            elif cmd == "readmany":
                names = args[0].split(",")
                bufs = [bytearray(int(args[1])) for _ in names]
                sizes = client.get_into(names, bufs)
                out = {"sha": [sha(b[:n]) for b, n in zip(bufs, sizes)]}
            elif cmd == "shrink":
                out = _try_to_shrink_the_copy_buffer(client)
            elif cmd == "mapwrite":
                out = _try_to_write_the_arena(client)
            elif cmd == "raw":
                kind, body = args[0], json.loads(args[1])
                reply = client._request(kinds()[kind](**body))
                out = {"reply": reply.to_json()}
            elif cmd == "each":
                out = {"results": _each(client, args[0], args[1].split(","))}
            elif cmd == "events":
                if args[0] == "start":
                    seen: list[str] = []
                    threading.Thread(target=_collect, args=(client.events(), seen), daemon=True).start()
                else:
                    out = {"names": list(seen)}
            elif cmd == "exit":
                if client is not None:
                    client.close()
                return
            else:
                raise ValueError(f"unknown command {cmd!r}")
            print(json.dumps({"ok": True, **out}), flush=True)
        except BatchError as exc:
            first = next(iter(exc.errors.values()))
            print(json.dumps({"ok": False, "type": type(first).__name__, "error": str(first)}), flush=True)
        except Exception as exc:
            print(
                json.dumps({"ok": False, "type": type(exc).__name__, "error": str(exc), "tb": traceback.format_exc()}),
                flush=True,
            )


def _collect(stream, seen: list[str]) -> None:
    for e in stream:
        seen.append(e.name)


def _each(client: Client, op: str, names: list[str]) -> list:
    """*op* on *names* in one call where the client batches it: per name "ok" or
    [error class, message]."""
    from kvfs.errors import KvfsError
    from kvfs.protocol import Du, Ls

    def one(fn):
        try:
            fn()
            return "ok"
        except KvfsError as exc:
            return [type(exc).__name__, str(exc)]

    if op in ("stat", "ls", "du"):
        call = {
            "stat": client.stat,
            "ls": lambda n: client._request(Ls(name=n)),
            "du": lambda n: client._request(Du(name=n)),
        }[op]
        return [one(lambda n=n: call(n)) for n in names]
    if op in ("pin", "evict", "prefetch"):
        try:
            res = getattr(client, op)(names)
        except KvfsError as exc:
            return [[type(exc).__name__, str(exc)]] * len(names)
        failed = {f.name: [f.type, f.error] for f in res.failed}
        return [failed.get(n, "ok") for n in names]
    try:
        if op == "lookup":
            client.lookup(names)
        elif op == "read":
            client.get_into(names, [bytearray(4 << 20) for _ in names])
        elif op == "view":
            client.release(client.get(names))
        elif op == "lease":
            client.release(client.lease(names, promote="always"))
        elif op == "put":
            client.put(names, [blob(7, 4096) for _ in names])
        else:
            raise ValueError(f"each: unknown op {op!r}")
    except BatchError as exc:
        for r in exc.results:
            if hasattr(r, "release"):
                r.release()
        return [[type(e).__name__, str(e)] if (e := exc.errors.get(i)) else "ok" for i in range(len(names))]
    return ["ok"] * len(names)


def _try_to_shrink_the_copy_buffer(client: Client) -> dict:
    """Truncate a copy buffer the daemon maps (it would fault on its next copy), as an
    attacker would: on a second session's descriptor."""
    from kvfs.client.connection import Connection
    from kvfs.protocol import Hello

    with Connection(client.socket) as conn:
        conn.request(Hello(client="shrink"))
        [fd] = conn.take_fds()
        try:
            os.ftruncate(fd, 0)
            return {"shrunk": True}
        except OSError as exc:
            return {"shrunk": False, "errno": exc.errno}
        finally:
            os.close(fd)


def _try_to_write_the_arena(client: Client) -> dict:
    """Make the arena mapping writable (mprotect) and write it, as an attacker would."""
    import ctypes

    path = client.welcome.arena.path
    with open("/proc/self/maps") as f:
        start, end = next(
            [int(x, 16) for x in line.split()[0].split("-")] for line in f if line.rstrip().endswith(path)
        )
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    rc = libc.mprotect(start, end - start, mmap.PROT_READ | mmap.PROT_WRITE)
    if rc != 0:
        return {"wrote": False, "errno": ctypes.get_errno()}
    ctypes.memset(start + 4096, 0x55, 1)
    return {"wrote": True}


if __name__ == "__main__":
    main()
