"""Is a task dying of a signal? Read from ``/proc`` while it closes its files.

A process killed by a signal closes its descriptors like one that exits: ``do_exit``
runs ``exit_files``, and the kernel sends FLUSH for each open kvfs file (then RELEASE
after the last), exactly as for ``close``. What tells the two apart is set *before*
``exit_files`` and readable in ``/proc/<tid>/stat`` while the dying task waits for the
daemon to answer its FLUSH (the FLUSH is sent synchronously from that task):

- ``flags`` (field 9) has ``PF_EXITING`` (0x4): the task is exiting;
- ``exit_code`` (field 52) is the wait status being built: the signal number in its low
  7 bits (0x80 added for a core dump) for a death by a signal, ``code << 8`` for
  ``exit(code)`` — also in the other threads of a process whose thread called
  ``exit_group``, which the kernel kills with SIGKILL but gives the group's exit code.
  The kernel shows it only to a reader allowed to ptrace the task (root, or its own
  user); to others it reads 0, and then ``PF_SIGNALED`` (0x400) is the evidence:
  exact for a single-threaded process, but set too in the sibling threads a normal
  ``exit_group`` kills (documented in docs/mount-internals.md).

A task that has finished exiting (a zombie, ``Z``, or ``X``) closed its files already:
whatever FLUSH the daemon sees now is someone else's, unless it is the leader of a thread
group whose other threads are still exiting (one of them closes the files last).

:func:`killed_by` takes the task id as an argument: pyfuse3 gives FLUSH no request
context, so the mount passes the pid that opened the file; a FUSE transport that knows
each request's pid passes the closing task's own (``KvfsOperations.flush(fh, pid)``),
which counts when it is a thread of the opener's process (:func:`closing_writer`).
"""

from __future__ import annotations

import os

__all__ = ["PF_EXITING", "PF_SIGNALED", "SIGNAL_UNKNOWN", "closing_writer", "killed_by"]

PF_EXITING = 0x4
PF_SIGNALED = 0x400
SIGNAL_UNKNOWN = 0
"""What :func:`killed_by` answers for a task dying of a signal it may not see the number of."""

_STATE = 0  # fields after the command name: state is field 3
_FLAGS = 6  # field 9
_EXIT_CODE = 49  # field 52


def killed_by(pid: int) -> int | None:
    """The signal killing task *pid* (a thread id, as FUSE requests carry them) while it
    is exiting and may still be closing its files; :data:`SIGNAL_UNKNOWN` when it is
    dying of a signal this process may not see; None when it is alive, exiting normally
    (``exit``, a return from ``main``), done exiting, gone, or not readable."""
    fields = _stat(pid)
    if fields is None or len(fields) <= _EXIT_CODE:
        return None
    try:
        flags, code = int(fields[_FLAGS]), int(fields[_EXIT_CODE])
    except ValueError:
        return None
    if not flags & PF_EXITING:
        return None
    if fields[_STATE] in (b"Z", b"X") and _threads(pid) <= 1:
        return None  # finished exiting: its files are closed (a FLUSH now is another holder's)
    if code:
        return (code & 0x7F) or None  # a signal number, or exit(n) << 8
    if flags & PF_SIGNALED and not _sees_exit_code(pid):
        return SIGNAL_UNKNOWN
    return None


def closing_writer(closer: int | None, opener: int | None) -> int | None:
    """The task whose death decides a close: the closing task *closer* (where the
    transport knows it) when it belongs to the process that opened the file (*opener*),
    else the opener. A child that inherited the descriptor and was killed does not stop
    its parent's file (it closes a copy; the parent writes on), exactly as on a
    transport that knows only the opener."""
    if closer is None or opener is None or closer == opener:
        return opener if closer is None else closer
    group = _status_field(closer, b"Tgid:")
    return closer if group is not None and group == _status_field(opener, b"Tgid:") else opener


def _status_field(pid: int, key: bytes) -> int | None:
    """An integer field of ``/proc/<pid>/status``, or None."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces
    and parentheses), or None when there is no such task."""
    # read on every FLUSH of a file being written: os.read, not a buffered file object
    # (which costs an fstat, an ioctl and a second read more)
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, 4096)]
        while len(chunks[-1]) == 4096:  # never so long in practice; read to the end then
            chunks.append(os.read(fd, 4096))
    except OSError:
        return None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    return raw[raw.rfind(b")") + 2 :].split()


def _threads(pid: int) -> int:
    """Threads of *pid*'s group not yet released (``Threads:`` in its status; 0 if gone)."""
    return _status_field(pid, b"Threads:") or 0


def _sees_exit_code(pid: int) -> bool:
    """Whether the kernel shows this process *pid*'s exit code (it shows it to whoever
    may ptrace the task: root, or the task's own user)."""
    if os.geteuid() == 0:
        return True
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False
