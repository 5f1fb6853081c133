"""The ``kvfs`` command: one entry point, subcommands found through two registries.

Each subcommand is a module with ``add_arguments(parser)`` and ``run(args) -> int``,
imported only when it runs, so ``kvfs --help`` stays fast and a missing optional extra
only affects the subcommand that needs it. Adding a subcommand is one line below.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

from kvfs import __version__
from kvfs.errors import KvfsError

from .flags import Parser

__all__ = ["BENCHES", "COMMANDS", "main"]

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "mount": ("kvfs.tools.cmd_mount", "mount kvfs on an empty directory (background, or --foreground)"),
    "umount": ("kvfs.tools.cmd_umount", "flush DRAM-only blocks down, unmount, and return when done"),
    # inspection and control of a running mount (they talk to its daemon)
    "ls": ("kvfs.tools.cmd_ls", "list blocks and directories with size, tiers, pin, hits, last access"),
    "du": ("kvfs.tools.cmd_du", "bytes and blocks per tier and in total under paths"),
    "stat": ("kvfs.tools.cmd_stat", "one block's record: size, checksum, tiers, pinned, hits, times"),
    "df": ("kvfs.tools.cmd_df", "each tier's capacity, use and health"),
    "pin": ("kvfs.tools.cmd_pin", "keep blocks (or everything under a directory) from being evicted"),
    "unpin": ("kvfs.tools.cmd_pin", "let pinned blocks be evicted again"),
    "prefetch": ("kvfs.tools.cmd_prefetch", "copy blocks up into a tier (DRAM by default) now"),
    "evict": ("kvfs.tools.cmd_evict", "drop local copies of blocks (never the last unless --force)"),
    "quota": ("kvfs.tools.cmd_quota", "namespaces' quotas per tier and their use (quota set, quota show)"),
    "gc": ("kvfs.tools.cmd_gc", "clean shared tiers: crashed writers' leftovers, retired namespaces (--dry-run)"),
    "fsck": ("kvfs.tools.cmd_fsck", "verify every copy's checksum on every tier; --repair drops bad ones"),
    "top": ("kvfs.tools.cmd_top", "live view of tier use, hit ratios, bytes moved per second, errors"),
    "events": ("kvfs.tools.cmd_events", "stream block events (stored, promoted, evicted, …) as they happen"),
}

# ``kvfs bench NAME``: benchmarks operators run on their own hardware.
BENCHES: dict[str, tuple[str, str]] = {
    "tiers": ("kvfs.tools.bench_tiers", "put/get of blocks through the store per tier vs memcpy and raw file I/O"),
    "quota": (
        "kvfs.tools.bench_quota",
        "cost of namespaces: quota accounting on a put, du of a namespace, a retention pass, vs no namespaces",
    ),
    "s3": ("kvfs.tools.bench_s3", "block put/get through the s3 tier vs raw boto3 put_object/get_object"),
    "policy": (
        "kvfs.tools.bench_policy",
        "hit ratio of each eviction policy on traces vs Belady and LRU, and policy cost",
    ),
    "fuse": (
        "kvfs.tools.bench_fuse",
        "file I/O through a kvfs mount next to a minimal pyfuse3 filesystem and tmpfs: GB/s, latency, stat/s",
    ),
    "soak": ("kvfs.tools.bench_soak", "mixed load on a mount, every byte read checked: wrong reads must be 0"),
    "fuzz": (
        "kvfs.tools.bench_fuzz",
        "the socket protocol fuzzed (hypothesis): the codec, and a real daemon's request handling",
    ),
    "ttft": (
        "kvfs.tools.bench_ttft",
        "time to first token of a transformers model: cold, warm from each directory, ideal",
    ),
    "client": (
        "kvfs.tools.bench_client",
        "the batch client's put/get/lookup vs memcpy, raw preadv and the FUSE path on the same blocks",
    ),
    "faults": (
        "kvfs.tools.bench_faults",
        "DRAM and disk hits, unmount and recovery while a shared tier (posix, s3) stops answering",
    ),
    "cluster": (
        "kvfs.tools.bench_cluster",
        "the peer tier on a 3-node namespace cluster: remote-DRAM get vs S3 and local gets; --soak: faults",
    ),
    "gpu": (
        "kvfs.tools.bench_gpu",
        "the GPU agent: NIXL reads vs preadv, map hits; with CUDA: arena H2D, GDS vs kvikio, TTFT per tier",
    ),
    "mount": (
        "kvfs.tools.bench_mount",
        "time from kvfs mount to a serving mount, and the idle daemon's memory, CPU and wakeups, vs a minimal mount",
    ),
    "engines": (
        "kvfs.tools.bench_engines",
        "real engine clients (vLLM, SGLang, LMCache, safetensors) on a kvfs mount vs a plain directory",
    ),
}


def _load(module: str) -> ModuleType:
    return importlib.import_module(module)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The ``kvfs`` parser, with the arguments of the subcommand (and bench) *argv* names
    (:class:`~kvfs.tools.flags.Parser`: a bad flag is one ``kvfs: …`` line, status 2)."""
    parser = Parser(
        prog="kvfs",
        description="kvfs: a tiered, content-addressed block filesystem for LLM KV caches.",
    )
    parser.add_argument("--version", action="version", version=f"kvfs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = argv[0] if argv else None
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            _load(module).add_arguments(p)
            p.set_defaults(_module=module)
    bench = sub.add_parser("bench", help="benchmarks that print figures and ratios", description="Benchmarks.")
    bsub = bench.add_subparsers(dest="bench", metavar="BENCH")
    bchosen = argv[1] if chosen == "bench" and len(argv) > 1 else None
    for name, (module, help_) in BENCHES.items():
        p = bsub.add_parser(name, help=help_, description=help_)
        if name == bchosen:
            _load(module).add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    module = getattr(args, "_module", None)
    if module is None:
        parser.print_help()
        return 2
    if args.command == "bench":
        from .scratch import end_on_sigterm

        end_on_sigterm()  # a bench's mounts are unmounted when it is killed
    try:
        return int(_load(module).run(args) or 0)
    except KvfsError as exc:
        print(f"kvfs: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kvfs ls -l | head`: the reader is gone, so is our output
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
