"""Every numbered line of docs/SEMANTICS.md has a test on a real mount that names it.

Tests carry the line numbers in their names (``test_s07_…``, ``test_s26_to_s30_…`` for a
range, ``test_s09_s25_…`` for two lines); this fails when a line has none, so a new rule
cannot be written down without being checked.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def numbered_lines() -> set[int]:
    text = (ROOT / "docs" / "SEMANTICS.md").read_text()
    return {int(m.group(1)) for m in re.finditer(r"^(\d+)\. ", text, re.MULTILINE)}


def lines_with_tests() -> set[int]:
    found: set[int] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        for name in re.findall(r"^def (test_s\w+)\(", path.read_text(), re.MULTILINE):
            for a, b in re.findall(r"_s(\d+)(?:_to_s(\d+))?(?=_)", name):
                found.update(range(int(a), int(b or a) + 1))
    return found


def test_every_numbered_line_has_a_test():
    lines = numbered_lines()
    assert lines == set(range(1, max(lines) + 1)), "SEMANTICS.md numbers its lines 1, 2, 3, … without gaps"
    missing = sorted(lines - lines_with_tests())
    assert not missing, f"docs/SEMANTICS.md lines without a test_sNN_ test: {missing}"
