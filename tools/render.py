"""How the ``kvfs`` subcommands print: aligned tables, times, JSON and a progress bar."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from kvfs.units import format_size

__all__ = ["Progress", "Tally", "format_size", "format_time", "print_json", "table", "yes_no"]


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] | None = None) -> str:
    """Rows under headers, columns aligned with two spaces between them; the column
    indexes in *right* (numbers, sizes) are right-aligned; ``None`` right-aligns every
    column whose cells all start with a digit. No trailing spaces."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if right is None:
        right = [
            i
            for i in range(len(headers))
            if len(cells) > 1 and all(r[i][:1].isdigit() or r[i][:2].lstrip("-")[:1].isdigit() for r in cells[1:])
        ]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def format_time(ts: float | None) -> str:
    """Local time to the second (``2026-11-29 09:03:24``); ``-`` for none."""
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def print_json(obj: object, out: TextIO | None = None) -> None:
    print(json.dumps(obj, indent=2), file=out or sys.stdout)


def print_json_each(results: Sequence[object]) -> None:
    """``--json`` of a command over several paths: one object for one path, a list for several."""
    print_json(results[0] if len(results) == 1 else results)


class Progress:
    """A one-line progress bar on stderr: ``prefetch [#####.....]  512/1024  50%``.

    Drawn only when *enabled* (``--progress``, or stderr is a terminal and the job has at
    least *threshold* items), redrawn at most ten times a second, ended by :meth:`close`.
    """

    def __init__(self, label: str, *, force: bool = False, threshold: int = 50, out: TextIO | None = None) -> None:
        self.label = label
        self.out = out or sys.stderr
        self.force = force
        self.threshold = threshold
        self._tty = self.out.isatty()
        self._drawn = False
        self._last = 0.0

    def _enabled(self, total: int) -> bool:
        return self.force or (self._tty and total >= self.threshold)

    def update(self, done: int, total: int) -> None:
        if not self._enabled(total):
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        width = 30
        filled = width * done // total if total else width
        pct = 100 * done // total if total else 100
        line = f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {pct:3d}%"
        if self._tty:
            self.out.write("\r" + line)
        else:
            self.out.write(line + "\n")  # a log file gets one line per update
        self.out.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn and self._tty:
            self.out.write("\n")
            self.out.flush()
        self._drawn = False


class Tally:
    """A one-line count on stderr for work of unknown size: ``gc nfs: 12000 scanned, 3 to remove``.

    Drawn when *force* (``--progress``) or stderr is a terminal; redrawn at most ten
    times a second on a terminal, once a second in a log; ended by :meth:`close`.
    """

    def __init__(self, label: str, *, force: bool = False, out: TextIO | None = None) -> None:
        self.label = label
        self.out = out or sys.stderr
        self._tty = self.out.isatty()
        self.enabled = force or self._tty
        self._last = 0.0
        self._line = ""

    def update(self, text: str, *, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self._last < (0.1 if self._tty else 1.0):
            return
        self._last = now
        self._line = f"{self.label}: {text}"
        self.out.write(("\r" + self._line) if self._tty else self._line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self._line and self._tty:
            self.out.write("\n")
            self.out.flush()
        self._line = ""
