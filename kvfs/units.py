"""Sizes and durations as operators write them (``"512MiB"``, ``"2.5s"``) and as we print them."""

from __future__ import annotations

import re

__all__ = ["format_duration", "format_size", "parse_duration", "parse_size"]

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
_DUR_UNITS = {"ms": 1e-3, "s": 1.0, "": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DUR_UNITS_SHOWN = [u for u in _DUR_UNITS if u]  # the error lists exactly what the parser takes


def parse_size(value: int | str) -> int:
    """Bytes from an int or a string like ``"512MiB"``, ``"4GB"``, ``"1.5GiB"``, ``"4096"``.

    Raises ``ValueError`` with the accepted forms when *value* is not one of them.
    """
    if isinstance(value, bool):
        raise ValueError('expected a size such as 4096, "512MiB" or "4GB", got a boolean')
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative (got {value})")
        return value
    if not isinstance(value, str):
        raise ValueError(f'expected a size such as "512MiB", got {type(value).__name__}')
    m = _SIZE_RE.match(value)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise ValueError(
            f"{value!r} is not a size; write bytes or a number with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
        )
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def parse_duration(value: float | str) -> float:
    """Seconds from a number or a string like ``"250ms"``, ``"5s"``, ``"2m"``, ``"7d"``."""
    if isinstance(value, bool):
        raise ValueError('expected a duration such as "5s" or "250ms", got a boolean')
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a duration cannot be negative (got {value})")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f'expected a duration such as "5s", got {type(value).__name__}')
    m = _SIZE_RE.match(value)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _DUR_UNITS:
        raise ValueError(
            f"{value!r} is not a duration; write seconds, or a number with a unit: "
            f'{", ".join(_DUR_UNITS_SHOWN)} (e.g. "250ms", "5s", "7d")'
        )
    return float(m.group(1)) * _DUR_UNITS[unit]


def format_size(n: float) -> str:
    """``1536`` → ``"1.5 KiB"``: binary units, three significant digits."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(n)} B"
            text = f"{n:.3g}"
            return f"{text if 'e' not in text else f'{n:.0f}'} {unit}"  # 1020 MiB, not 1.02e+03
        n /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """``604800`` → ``"7d"``, ``5400`` → ``"90m"``: the largest unit that divides it
    (``parse_duration`` reads it back), seconds otherwise."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
