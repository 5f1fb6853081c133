"""``kvfs gc``: clean a cluster's shared tiers of what crashed writers and retired namespaces left."""

from __future__ import annotations

import argparse
import sys
import time

from kvfs.config import load_config
from kvfs.errors import ConfigError, KvfsError
from kvfs.gc import GcPlan, GcReport, collect, with_retired
from kvfs.tiers import open_tier

from .flags import duration
from .render import Tally, format_size, format_time, print_json, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Walk the shared tiers (posix, s3) of a config and remove what no daemon cleans: temporaries and "
        "unfinished multipart uploads of writers that died (older than --tmp-age), and blocks of retired "
        "namespaces (retired = true in [[namespaces]], or --retired) written more than --min-age ago (or "
        "the namespace's retention). Never removes a block written within that window, even one another "
        "node publishes while gc runs. Runs from any node; needs no mount. --dry-run lists and removes nothing."
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="the cluster's kvfs config (TOML)")
    parser.add_argument(
        "--tier", action="append", default=[], metavar="NAME", help="only this shared tier (repeat; default: all)"
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    parser.add_argument(
        "--retired", action="append", default=[], metavar="PATH", help="also treat this namespace as retired (repeat)"
    )
    parser.add_argument(
        "--tmp-age",
        type=duration,
        default=3600.0,
        metavar="DURATION",
        help="leftovers younger than this are kept (default 1h)",
    )
    parser.add_argument(
        "--min-age",
        type=duration,
        default=3600.0,
        metavar="DURATION",
        help="blocks of a retired namespace without a retention are kept this long after written (default 1h)",
    )
    parser.add_argument(
        "--expired",
        action="store_true",
        help="also remove blocks of namespaces with a retention written longer ago than it (shared tiers "
        "record no reads: a block read all along but written long ago goes too)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="name every object removed")
    parser.add_argument("--progress", action="store_true", help="show the count on stderr even when not a terminal")
    parser.add_argument(
        "--json",
        action="store_true",
        help='print JSON: {"dry_run", "now", "tiers": [{"tier", "dry_run", "scanned", "removed": [{"name", '
        '"why", "size", "mtime"}], "bytes", "young", "failed": [{"name", "error"}]}]}',
    )


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    shared = [t for t in config.tiers if t.kind.value in ("posix", "s3")]
    if args.tier:
        names = [t.name for t in shared]
        for n in args.tier:
            if n not in names:
                raise ConfigError("--tier", f"no shared tier named {n!r}; shared tiers: {', '.join(names) or 'none'}")
        shared = [t for t in shared if t.name in args.tier]
    if not shared:
        raise ConfigError("--config", "the config has no shared tier (posix or s3): there is nothing to collect")
    plan = GcPlan(
        namespaces=with_retired(config.namespaces, args.retired),
        tmp_age=args.tmp_age,
        min_age=args.min_age,
        expired=args.expired,
    )
    now = time.time()
    reports: list[GcReport] = []
    failed = False
    for tc in shared:
        tier = open_tier(tc)
        tally = Tally(f"gc {tc.name}", force=args.progress)
        verb = "to remove" if args.dry_run else "removed"

        def progress(scanned: int, removed: int, tally: Tally = tally, verb: str = verb) -> None:
            tally.update(f"{scanned} scanned, {removed} {verb}")

        try:
            report = collect(tier, plan, now=now, dry_run=args.dry_run, progress=progress)
            tally.update(f"{report.scanned} scanned, {len(report.removed)} {verb}", final=True)
        except KvfsError as exc:
            raise KvfsError(f"gc of tier {tc.name!r} stopped: {exc}") from exc
        finally:
            tally.close()
            tier.close()
        reports.append(report)
        failed = failed or bool(report.failed)
    if args.json:
        print_json({"dry_run": args.dry_run, "now": now, "tiers": [r.to_json() for r in reports]})
        return 1 if failed else 0
    rows = [[r.tier, r.scanned, len(r.removed), format_size(r.bytes), r.young, len(r.failed)] for r in reports]
    head = "WOULD REMOVE" if args.dry_run else "REMOVED"
    print(table(["TIER", "SCANNED", head, "BYTES", "KEPT (YOUNG)", "FAILED"], rows, right=(1, 2, 3, 4, 5)))
    for r in reports:
        if args.verbose or args.dry_run:
            for item in r.removed:
                print(f"{r.tier}: {item.name}  {format_size(item.size)}  {format_time(item.mtime)}  {item.why}")
        for name, err in r.failed:
            print(f"kvfs: gc: {r.tier}: not removed: {name}: {err}", file=sys.stderr)
    return 1 if failed else 0
