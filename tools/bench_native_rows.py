"""What the native-client rows of ``kvfs bench engines`` share: a client's figures
against its engine's own alternative on a plain directory (:func:`versus_plain`), as GB/s
rows of that table, and the status a failed run of a client shows in them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .engine_clients import ClientFailed

__all__ = ["failed", "gbps_rows", "versus_plain"]


def failed(exc: ClientFailed) -> str:
    """The status of a client run that failed: its output's last line, or the error."""
    text = exc.output.strip()
    return f"failed: {text.splitlines()[-1][-160:] if text else exc}"


def versus_plain(
    out: dict[str, Any], figures: Callable[[str], dict[str, Any] | str], ops: tuple[str, ...]
) -> dict[str, Any]:
    """Fill a native client's result *out* with ``figures(kind)`` of the engine's own
    alternative on a plain directory (kind ``"plain"``, run first) and of kvfs (``"kvfs"``):
    ``bytes`` and ``<op>_s`` for each op of *ops*, or a string, the status of a run that did
    not read back every byte. Then the status ``ok`` and kvfs's ratio per op (plain seconds
    over kvfs seconds: above 1 is faster). A client that failed on the plain directory
    raises (the baseline is broken); on kvfs, its failure is the status."""
    figs: dict[str, dict[str, Any]] = {}
    for kind in ("plain", "kvfs"):
        try:
            fig = figures(kind)
        except ClientFailed as exc:
            if kind == "plain":
                raise
            out["status"] = failed(exc)
            return out
        if isinstance(fig, str):
            out["status"] = fig
            return out
        figs[kind] = fig
    out["status"] = "ok"
    out["plain"], out["kvfs"] = figs["plain"], figs["kvfs"]
    out["ratio"] = {op: figs["plain"][f"{op}_s"] / figs["kvfs"][f"{op}_s"] for op in ops}
    return out


def gbps_rows(c: dict[str, Any], ops: list[tuple[str, str]]) -> list[list[str]]:
    """Table rows of a native client's result *c* (``plain`` and ``kvfs`` figures with
    ``bytes`` and ``<op>_s``, ``ratio`` per op): one per ``(op, aim)`` of *ops*, the
    status on the first; one row of dashes and the status when it has no figures."""
    if "plain" not in c:
        return [[c["client"], "-", "-", "-", "-", "-", c.get("status", "")]]
    out = []
    for i, (op, aim) in enumerate(ops):
        p, k = (c[kind]["bytes"] / c[kind][f"{op}_s"] / 1e9 for kind in ("plain", "kvfs"))
        out.append(
            [
                c["client"],
                f"{op} GB/s",
                f"{p:.3f}",
                f"{k:.3f}",
                f"{c['ratio'][op]:.2f}x",
                aim,
                c["status"] if i == 0 else "",
            ]
        )
    return out
