"""How the ``kvfs`` command reads its flags: the parser and the value converters.

Every flag's value is checked when the command line is parsed, by a converter here
(``type=`` of ``add_argument``), so a bad value never reaches a daemon and every
subcommand words the refusal the same way: one line on stderr starting ``kvfs:``, naming
the subcommand, the flag and what it takes, and exit status 2::

    kvfs: top: argument --interval: must be at least 0.1 seconds (got '0'); see kvfs top --help

Errors found later (a daemon's answer, a config file) are ``kvfs: <what>: <why>`` with
exit status 1 (:func:`kvfs.tools.cli.main`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

from kvfs.units import parse_duration, parse_size

__all__ = ["Parser", "at_least", "duration", "port", "positive_int", "seconds", "share", "size"]


class Parser(argparse.ArgumentParser):
    """``argparse`` with kvfs's error line (see the module doc); subcommands' parsers are
    of the same class."""

    def error(self, message: str) -> NoReturn:
        sub = self.prog.partition(" ")[2]
        where = f"{sub}: " if sub else ""
        self.exit(2, f"kvfs: {where}{message}; see {self.prog} --help\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        raise SystemExit(status)


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {text!r})")
    return n


def at_least(minimum: int) -> Callable[[str], int]:
    """A whole number of at least *minimum*."""

    def convert(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {text!r})")
        return n

    return convert


def share(text: str) -> float:
    """A share from 0 up to, not including, 1."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= x < 1:
        raise argparse.ArgumentTypeError(f"must be from 0 up to, not including, 1 (got {text!r})")
    return x


def port(text: str) -> int:
    """A TCP port number, 0 (any free port) to 65535."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port number (0-65535)") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port number (0-65535)")
    return n


def seconds(minimum: float = 0.0) -> Callable[[str], float]:
    """A number of seconds, or a duration with a unit (``"250ms"``, ``"2m"``), more than 0
    and at least *minimum*."""

    def convert(text: str) -> float:
        value = duration(text)
        if not value > 0 or value < minimum:
            least = f"at least {minimum:g}" if minimum else "more than 0"
            raise argparse.ArgumentTypeError(f"must be {least} seconds (got {text!r})")
        return value

    return convert


def duration(text: str) -> float:
    """Seconds from ``"90"``, ``"250ms"``, ``"5s"``, ``"2m"``, ``"1h"``, ``"7d"``
    (:func:`kvfs.units.parse_duration`): finite, never negative."""
    try:
        value = parse_duration(_number_or_text(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; give a finite number")
    return value


def size(text: str) -> int:
    """Bytes from ``"4096"``, ``"512MiB"``, ``"4GB"`` (:func:`kvfs.units.parse_size`)."""
    try:
        return parse_size(int(text) if text.strip().lstrip("-").isdigit() else text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _number_or_text(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text
