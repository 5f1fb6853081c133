"""What the native-client rows of ``kvfs bench engines`` share: a client's figures
against its engine's own alternative on a plain directory, as GB/s rows of that table,
and the status a failed run of a client shows in them."""

from __future__ import annotations

from typing import Any

from .engine_clients import ClientFailed

__all__ = ["failed", "gbps_rows"]


def failed(exc: ClientFailed) -> str:
    """The status of a client run that failed: its output's last line, or the error."""
    text = exc.output.strip()
    return f"failed: {text.splitlines()[-1][-160:] if text else exc}"


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
