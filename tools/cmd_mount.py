"""``kvfs mount MOUNTPOINT``: mount kvfs with a config file or the embedded default.

Without ``--foreground`` it returns once the mount is ready and the daemon runs on in the
background (it prints the log file); with it, it stays attached (systemd, containers)
and unmounts cleanly on SIGTERM/SIGINT. A missing, non-directory, non-empty or already
mounted mountpoint, or a bad config, is a clear error and a non-zero exit; nothing is
left mounted.
"""

from __future__ import annotations

import argparse
import dataclasses

from kvfs.config import default_config, load_config
from kvfs.errors import KvfsError

from .flags import port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint", help="an empty directory")
    parser.add_argument("--config", metavar="FILE", help="TOML config (default: the embedded default)")
    parser.add_argument("--foreground", action="store_true", help="stay attached; unmount on SIGTERM/SIGINT")
    parser.add_argument("--metrics-port", type=port, metavar="N", help="serve Prometheus metrics on port N")


def run(args: argparse.Namespace) -> int:
    try:
        import pyfuse3  # noqa: F401
        import trio  # noqa: F401
    except ImportError as exc:
        raise KvfsError(f"kvfs mount needs the mount extra: pip install 'kvfs[mount]' ({exc})") from None
    from kvfs.mount.daemon import run as run_daemon

    config = load_config(args.config) if args.config else default_config()
    if args.metrics_port is not None:
        config = dataclasses.replace(config, mount=dataclasses.replace(config.mount, metrics_port=args.metrics_port))
    return run_daemon(args.mountpoint, config, foreground=args.foreground)
