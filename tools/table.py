"""Aligned text tables for output meant for people (``--json`` is for programs)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

__all__ = ["format_table", "print_table"]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers (cells starting with a digit) right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        out = []
        for i, c in enumerate(row):
            numeric = c[:1].isdigit() or (c[:1] == "-" and c[1:2].isdigit())
            out.append(c.rjust(widths[i]) if numeric and row is not cells[0] else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join(fmt(r) for r in cells)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], file: TextIO | None = None) -> None:
    print(format_table(headers, rows), file=file or sys.stdout)
