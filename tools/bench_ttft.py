"""``kvfs bench ttft``: time to first token with the prefix read from kvfs, vs cold and ideal.

For each prompt length, in one run and with one model:

- **cold**: the whole prompt is prefilled (no cache);
- **ideal**: the prefix's KV is already in process memory; only the rest is computed;
- **warm** per ``--dir LABEL=PATH``: the prefix's blocks are read from files in that
  directory with :class:`kvfs.gpu.prefix_cache.PrefixCache`; only the rest is computed.
  With ``--client`` every kvfs mount is measured twice: through FUSE (file I/O) and with
  the batch client (``LABEL+client``: the DRAM arena, direct reads of the disk tier's
  block files).

The request is a prompt whose first ``length - suffix`` tokens were seen before (a long
shared context) followed by ``suffix`` new tokens. Ideal and warm use the same cached
prefix (whole blocks), so ``warm / ideal`` is the price of reading the KV from the
directory. TTFT is measured from the token ids in hand to the first token's id (argmax),
logits for the last position only.

What the page cache does: by default (``--page-cache drop``) every block file that a warm
run will read is fsynced and dropped from the kernel page cache
(``posix_fadvise(DONTNEED)``) before each run, so a warm figure measures the directory's
own storage: a plain disk directory reads from the device, a tmpfs directory from memory
(tmpfs has no other copy), and a kvfs mount from whichever tier holds the block (DRAM
arena, NVMe, ...), through FUSE. ``--page-cache keep`` measures repeat reads served by the
kernel's cache instead.

A multi-turn scenario follows: each turn appends new user tokens to the conversation, the
answer is generated greedily, and the conversation's blocks are stored; the next turn's
prefix is the whole previous conversation.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvfs.errors import ConfigError

from .flags import at_least, positive_int
from .scratch import drop_page_cache_under, progress

if TYPE_CHECKING:
    import torch
    from transformers import DynamicCache, LlamaForCausalLM

    from kvfs.gpu.prefix_cache import Prefill, PrefixHit

__all__ = ["add_arguments", "run"]

FULL_LENGTHS = (512, 1024, 2048, 4096, 8192)
QUICK_LENGTHS = (512, 1024)


def _lengths(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lengths: {text!r} is not a comma-separated list of integers") from None
    if not out or any(n < 2 for n in out):
        raise argparse.ArgumentTypeError("--lengths: every length must be at least 2")
    return out


def _dir_spec(text: str) -> tuple[str, str]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"--dir: expected LABEL=PATH, got {text!r}")
    return label, path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="small model (~31M), prompts 512 and 1024, 2 turns: for small machines"
    )
    parser.add_argument(
        "--model", default=None, help="model preset: tiny, small, 250m (default 250m; small with --quick)"
    )
    parser.add_argument("--dtype", default="bf16", help="bf16 (default), fp32 or fp16")
    parser.add_argument(
        "--lengths",
        type=_lengths,
        default=None,
        help="comma-separated prompt lengths (default 512,1024,2048,4096,8192; 512,1024 with --quick)",
    )
    parser.add_argument(
        "--suffix", type=at_least(0), default=128, help="new tokens at the end of each prompt, not cached (default 128)"
    )
    parser.add_argument("--block-tokens", type=positive_int, default=128, help="tokens per KV block file (default 128)")
    parser.add_argument(
        "--dir",
        dest="dirs",
        action="append",
        type=_dir_spec,
        default=[],
        metavar="LABEL=PATH",
        help="a directory to store blocks in and read them from (repeatable): a kvfs mount "
        "or a plain directory. Default: tmpfs=/dev/shm and disk=/var/tmp",
    )
    parser.add_argument(
        "--kvfs",
        type=_kvfs_spec,
        default=["auto"],
        metavar="TIERS",
        help="kvfs mounts to measure, each with the blocks in one tier: a list of "
        "dram,disk,posix,s3 (s3 on a local moto server); 'auto' (default) = all "
        "whose packages are installed; 'none' = only the --dir directories",
    )
    parser.add_argument(
        "--page-cache",
        choices=("drop", "keep"),
        default="drop",
        help="drop (default): evict each block file from the kernel page cache before each warm run; keep: leave it",
    )
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs of ideal and warm per case (default 3)")
    parser.add_argument(
        "--cold-repeat",
        type=positive_int,
        default=None,
        help="runs of the cold prefill per case (default 1; 3 with --quick)",
    )
    parser.add_argument(
        "--stat",
        choices=("median", "min"),
        default="median",
        help="how repeated runs are summarized (default median; min discounts other "
        "processes' load on a shared machine)",
    )
    parser.add_argument(
        "--turns",
        type=at_least(0),
        default=None,
        help="turns of the multi-turn scenario (default 4; 2 with --quick; 0 skips)",
    )
    parser.add_argument(
        "--turn-tokens",
        type=positive_int,
        default=None,
        help="new user tokens per turn (default 1024; 256 with --quick)",
    )
    parser.add_argument("--answer-tokens", type=positive_int, default=16, help="tokens generated per turn (default 16)")
    parser.add_argument(
        "--io-threads", type=positive_int, default=4, help="concurrent block reads per warm load (default 4)"
    )
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument("--seed", type=at_least(0), default=0, help="seed of the model weights and prompts")
    parser.add_argument(
        "--client",
        action="store_true",
        help="also read and write each kvfs mount's blocks with the batch client (kvfs.client: shared memory, "
        "direct block-file reads), as LABEL+client columns beside the FUSE ones",
    )
    parser.add_argument("--keep", action="store_true", help="keep the block files written under each directory")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")


@dataclass
class _Target:
    label: str
    root: str  # the bench's own subdirectory inside the given directory
    cache: Any = None  # its kvfs.gpu.prefix_cache.PrefixCache, made once the model is built
    backing: str | None = None  # a kvfs tier's own directory, whose page cache is dropped too
    client: bool = False  # the prefix cache uses the batch client (a kvfs mount), else file I/O


KVFS_TIERS = ("dram", "disk", "posix", "s3")


def _kvfs_spec(text: str) -> list[str]:
    if text in ("auto", "none"):
        return [text]
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KVFS_TIERS]
    if bad or not kinds:
        raise argparse.ArgumentTypeError(f"--kvfs: expected auto, none or a list of {', '.join(KVFS_TIERS)}")
    return kinds


def _kvfs_config(kind: str, base: Path, dram_bytes: int, endpoint: str | None, bucket: str) -> str:
    """A config whose blocks live in tier *kind*: the hottest (or only) tier of the mount."""
    if kind == "dram":
        return (
            f'[[tiers]]\nkind = "dram"\ncapacity = {dram_bytes}\n\n'
            f'[[tiers]]\nkind = "disk"\ncapacity = "8GiB"\npath = "{base}/disk"\n'
        )
    if kind == "disk":
        return f'[[tiers]]\nkind = "disk"\ncapacity = "8GiB"\npath = "{base}/disk"\n'
    if kind == "posix":
        return f'[[tiers]]\nkind = "posix"\ncapacity = "8GiB"\npath = "{base}/shared"\n'
    return f'[[tiers]]\nkind = "s3"\nbucket = "{bucket}"\nendpoint_url = "{endpoint}"\n'


class _KvfsMounts:
    """kvfs mounts made for the bench, one per tier kind, each with its blocks in that
    tier; everything is unmounted and removed on close."""

    def __init__(self, kinds: list[str], dram_bytes: int, say: Callable[..., None]) -> None:
        from kvfs.tools.scratch import mount, start_moto

        self.bases: list[Path] = []
        self.mounts: list[Path] = []
        self.moto = None
        self.targets: list[tuple[str, str, str | None]] = []
        env = {}
        endpoint, bucket = None, f"kvfs-ttft-{os.getpid()}"
        try:
            if "s3" in kinds:
                import boto3

                for k, v in {
                    "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1",
                }.items():
                    env[k] = os.environ.get(k, v)
                self.moto, endpoint = start_moto()
                boto3.client(
                    "s3",
                    endpoint_url=endpoint,
                    aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                    aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                    region_name=env["AWS_DEFAULT_REGION"],
                ).create_bucket(Bucket=bucket)
            for kind in kinds:
                base = Path(tempfile.mkdtemp(prefix=f"kvfs-ttft-{kind}-", dir="/var/tmp"))
                self.bases.append(base)
                cfg = base / "kvfs.toml"
                cfg.write_text(_kvfs_config(kind, base, dram_bytes, endpoint, bucket))
                mp = base / "mnt"
                mount(mp, cfg, env=env)
                self.mounts.append(mp)
                backing = {"disk": base / "disk", "posix": base / "shared"}.get(kind)
                self.targets.append((f"kvfs-{kind}", str(mp), str(backing) if backing else None))
                say(f"  mounted kvfs with its blocks in a {kind} tier at {mp}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        from kvfs.tools.scratch import umount

        for mp in self.mounts:
            umount(mp)
        self.mounts = []
        if self.moto is not None:
            self.moto.kill()
            self.moto.wait()
            self.moto = None
        for b in self.bases:
            shutil.rmtree(b, ignore_errors=True)
        self.bases = []


def _kvfs_kinds(spec: list[str]) -> list[str]:
    """The tier kinds to mount kvfs with: explicit, none, or every one that can run here."""
    if spec == ["none"]:
        return []
    if spec != ["auto"]:
        return spec
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        return []
    if not os.path.exists("/dev/fuse"):
        return []
    kinds = ["dram", "disk", "posix"]
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError:
        return kinds
    return kinds + ["s3"]


def _default_dirs() -> list[tuple[str, str, bool]]:
    out = []
    if os.path.isdir("/dev/shm"):
        out.append(("tmpfs", tempfile.mkdtemp(prefix="kvfs-ttft-", dir="/dev/shm"), True))
    disk = "/var/tmp" if os.path.isdir("/var/tmp") else None
    out.append(("disk", tempfile.mkdtemp(prefix="kvfs-ttft-", dir=disk), True))
    return out


def _drop_page_cache(paths: list[str]) -> None:
    """fsync each file and ask the kernel to drop its cached pages."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                os.fsync(fd)  # dirty pages are not dropped; block files are written just before
            except OSError as exc:
                # A FUSE daemon may not implement fsync; its files hold no dirty pages then.
                if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EROFS):
                    raise
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(args: argparse.Namespace) -> int:
    try:
        import torch

        from kvfs.gpu import prefix_cache as pcm
        from kvfs.gpu.random_llama import PRESETS, build_model, torch_dtype
    except ImportError as exc:
        print(f"kvfs bench ttft: {exc}", file=sys.stderr)
        return 1

    preset = args.model or ("small" if args.quick else "250m")
    if preset not in PRESETS:
        raise ConfigError("--model", f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    lengths = args.lengths or list(QUICK_LENGTHS if args.quick else FULL_LENGTHS)
    turns = args.turns if args.turns is not None else (2 if args.quick else 4)
    turn_tokens = args.turn_tokens or (256 if args.quick else 1024)
    if args.suffix < 1:
        raise ConfigError("--suffix", "must be at least 1 (the last token is always computed)")
    if args.block_tokens < 1:
        raise ConfigError("--block-tokens", "must be at least 1")
    if args.repeat < 1:
        raise ConfigError("--repeat", "must be at least 1")
    if args.io_threads < 1:
        raise ConfigError("--io-threads", "must be at least 1")
    if args.cold_repeat is not None and args.cold_repeat < 1:
        raise ConfigError("--cold-repeat", "must be at least 1")
    try:
        dtype = torch_dtype(args.dtype)
    except ValueError as exc:
        raise ConfigError("--dtype", str(exc)) from None
    if args.threads:
        torch.set_num_threads(args.threads)

    say = progress(args.json)
    labels = [label for label, _ in args.dirs]
    if len(set(labels)) != len(labels):
        raise ConfigError("--dir", "labels must be distinct")
    for label, path in args.dirs:
        if not os.path.isdir(path):
            raise ConfigError("--dir", f"{label}={path}: not a directory")
    specs: list[tuple[str, str, bool, str | None]] = [(label, path, False, None) for label, path in args.dirs] or [
        (label, path, created, None) for label, path, created in _default_dirs()
    ]
    kinds = _kvfs_kinds(args.kvfs)
    mounts = None
    if kinds:
        per_token = (
            2
            * PRESETS[preset]["num_hidden_layers"]
            * PRESETS[preset]["num_key_value_heads"]
            * (PRESETS[preset]["hidden_size"] // PRESETS[preset]["num_attention_heads"])
            * (4 if args.dtype == "fp32" else 2)
        )
        total = sum(lengths) + turns * (turn_tokens + args.answer_tokens) * turns
        dram_bytes = max(256 << 20, 2 * total * per_token)  # every block of the run fits twice
        mounts = _KvfsMounts(kinds, dram_bytes, say)
        specs += [(label, path, False, backing) for label, path, backing in mounts.targets]
        if args.client:
            specs += [(f"{label}+client", path, False, backing) for label, path, backing in mounts.targets]
    targets: list[_Target] = []
    for label, path, created, backing in specs:
        # A given directory gets the bench's own subdirectory; a default one is the bench's.
        client = label.endswith("+client")
        root = path if created else os.path.join(path, f"kvfs-bench-ttft-{os.getpid()}{'-client' if client else ''}")
        os.makedirs(root, exist_ok=True)
        targets.append(_Target(label=label, root=root, backing=backing, client=client))

    t0 = time.perf_counter()
    max_len = max(max(lengths), turns * (turn_tokens + args.answer_tokens) + 16)
    try:
        rm = build_model(preset, dtype=dtype, seed=args.seed, max_positions=max(4096, max_len))
    except BaseException:
        if mounts is not None:
            mounts.close()
        raise
    model = rm.model
    say(
        f"model {rm.name}: {rm.parameters / 1e6:.0f}M parameters, {args.dtype}, built in "
        f"{time.perf_counter() - t0:.1f}s; torch threads {torch.get_num_threads()}; "
        f"blocks of {args.block_tokens} tokens; page cache: {args.page_cache}"
    )
    for t in targets:
        t.cache = pcm.PrefixCache.for_model(
            t.root,
            model,
            rm.name,
            tokens_per_block=args.block_tokens,
            io_threads=args.io_threads,
            client=t.client,  # True: the batch client (kvfs mounts only); False: file I/O
        )
        say(f"  {t.label}: {t.root}")
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(args.seed + 1)

    def timed(fn: Callable[[], Prefill]) -> tuple[float, Prefill]:
        start = time.perf_counter()
        res = fn()
        int(res.logits.argmax())  # the first token
        return time.perf_counter() - start, res

    def warm_once(t: _Target, prompt: list[int]) -> tuple[float, PrefixHit]:
        """One warm request; returns (ttft seconds, the load's PrefixHit without its cache)."""
        if args.page_cache == "drop":
            _drop_page_cache([t.cache.path(d) for d in t.cache.digests(prompt[: len(prompt) - 1])])
            if t.backing:  # the kvfs tier's own files: the read must come from the device
                drop_page_cache_under(Path(t.backing))
        s, res = timed(lambda: pcm.prefill(model, prompt, t.cache))
        assert res.hit is not None  # prefill was given a cache: it says what it loaded
        return s, dataclasses.replace(res.hit, cache=None)  # type: ignore[arg-type]  # only its figures are kept

    cold_repeat = args.cold_repeat or (3 if args.quick else 1)
    summary = statistics.median if args.stat == "median" else min

    def cold_ttft(prompt: list[int]) -> tuple[float, Prefill]:
        """Median TTFT of a full prefill, and the last run's result (its cache is stored)."""
        runs = [timed(lambda: pcm.prefill(model, prompt)) for _ in range(cold_repeat)]
        return summary([s for s, _ in runs]), runs[-1][1]

    def measure(
        row: dict[str, Any], prompt: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]] | None, cached: int
    ) -> None:
        """Ideal and warm TTFT of *prompt*, interleaved round by round so that load from
        other processes hits every variant alike; the summaries (``--stat``) go into *row*."""
        ideal: list[float] = []
        warm: dict[str, list[tuple[float, PrefixHit]]] = {t.label: [] for t in targets}
        for _ in range(args.repeat):
            if kv is not None:
                in_memory = lambda: pcm.prefill(model, prompt, cache=pcm.cache_from_tensors(model, kv, cached))
                ideal.append(timed(in_memory)[0])
            for t in targets:
                warm[t.label].append(warm_once(t, prompt))
        row["ideal_s"] = summary(ideal) if ideal else row["cold_s"]
        for t in targets:
            times = [s for s, _ in warm[t.label]]
            hits = [h for _, h in warm[t.label]]
            bad = [h for h in hits if h.tokens != cached]
            if bad:
                say(
                    f"  warning: {t.label} loaded {bad[0].tokens} of {cached} tokens "
                    f"({bad[0].stop.value}: {bad[0].detail})"
                )
            row["warm"][t.label] = {
                "ttft_s": summary(times),
                "load_s": summary([h.seconds for h in hits]),
                "bytes": hits[0].bytes_read,
                "cached_tokens": hits[0].tokens,
            }

    # Warm up torch's kernels and allocator so the first case is not penalized.
    pcm.prefill(model, torch.randint(0, vocab, (64,), generator=gen).tolist())

    results: dict[str, Any] = {
        "model": rm.name,
        "parameters": rm.parameters,
        "dtype": args.dtype,
        "block_tokens": args.block_tokens,
        "suffix": args.suffix,
        "threads": torch.get_num_threads(),
        "page_cache": args.page_cache,
        "stat": args.stat,
        "repeat": args.repeat,
        "cold_repeat": cold_repeat,
        "io_threads": args.io_threads,
        "dirs": {t.label: t.root for t in targets},
        "prompts": [],
        "turns": [],
    }
    try:
        for n in lengths:
            prompt = torch.randint(0, vocab, (n,), generator=gen).tolist()
            seen = max(0, n - args.suffix)
            cold_s, cold = cold_ttft(prompt)
            row = {"tokens": n, "cold_s": cold_s, "warm": {}}
            for t in targets:
                st = t.cache.store(prompt[:seen], cold.cache)
                row.setdefault("store_s", {})[t.label] = st.seconds
            kv = _layer_kv(cold.cache)
            del cold
            cached = min((seen // args.block_tokens) * args.block_tokens, n - 1)
            row["cached_tokens"] = cached
            measure(row, prompt, kv, cached)
            del kv
            gc.collect()
            results["prompts"].append(row)
            say(_prompt_line(row, targets))
        if turns:
            results["turns"] = _multi_turn(
                args, model, targets, turns, turn_tokens, gen, vocab, cold_ttft, measure, say
            )
    finally:
        for t in targets:
            t.cache.close()
            if not args.keep:
                shutil.rmtree(t.root, ignore_errors=True)
        if mounts is not None:
            mounts.close()

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print()
        print(format_tables(results))
    return 0


def _multi_turn(
    args: argparse.Namespace,
    model: LlamaForCausalLM,
    targets: list[_Target],
    turns: int,
    turn_tokens: int,
    gen: torch.Generator,
    vocab: int,
    cold_ttft: Callable[[list[int]], tuple[float, Prefill]],
    measure: Callable[[dict[str, Any], list[int], list[tuple[torch.Tensor, torch.Tensor]] | None, int], None],
    say: Callable[..., None],
) -> list[dict[str, Any]]:
    import torch

    out = []
    convo: list[int] = []
    prev_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    prev_tokens = 0
    for turn in range(1, turns + 1):
        convo = convo + torch.randint(0, vocab, (turn_tokens,), generator=gen).tolist()
        cold_s, cold = cold_ttft(convo)
        cached = min((prev_tokens // args.block_tokens) * args.block_tokens, len(convo) - 1)
        row = {"turn": turn, "tokens": len(convo), "cached_tokens": cached, "cold_s": cold_s, "warm": {}}
        measure(row, convo, prev_kv, cached)
        # The engine answers (greedy), then stores the conversation's blocks.
        cache, logits = cold.cache, cold.logits
        answer = [int(logits.argmax())]
        with torch.no_grad():
            while len(answer) < args.answer_tokens:
                res = model(input_ids=torch.tensor([[answer[-1]]]), cache=cache, use_cache=True, logits_to_keep=1)
                cache = res.cache
                answer.append(int(res.logits[0, -1].argmax()))
        convo = convo + answer
        prev_tokens = cache.get_seq_length()  # the last answer token has no KV yet
        for t in targets:
            t.cache.store(convo[:prev_tokens], cache)
        prev_kv = _layer_kv(cache)
        del cold
        gc.collect()
        out.append(row)
        say(_prompt_line(row, targets, turn=turn))
    return out


def _layer_kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) of a filled cache (prefix_cache's caches hold full-attention
    layers only, which have both)."""
    return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]


def _prompt_line(row: dict[str, Any], targets: list[_Target], turn: int | None = None) -> str:
    head = f"turn {turn}: " if turn else ""
    parts = [
        (
            f"{head}{row['tokens']} tokens ({row['cached_tokens']} cached): cold {row['cold_s']:.3f}s, "
            f"ideal {row['ideal_s']:.3f}s"
        )
    ]
    for t in targets:
        w = row["warm"][t.label]
        parts.append(f"{t.label} {w['ttft_s']:.3f}s (load {w['load_s']:.3f}s)")
    return ", ".join(parts)


def format_tables(results: dict[str, Any]) -> str:
    """The results as aligned text tables (what the docs paste)."""
    labels = list(results["dirs"])
    lines = [
        (
            f"model {results['model']} ({results['parameters'] / 1e6:.0f}M params, {results['dtype']}), "
            f"{results['threads']} threads, blocks of {results['block_tokens']} tokens, "
            f"page cache {results['page_cache']}; times are {results['stat']} TTFT in seconds"
        ),
        "",
    ]

    def table(rows: list[dict[str, Any]], first: str) -> list[str]:
        cols = [first, "tokens", "cached", "cold s", "ideal s", "ideal x"]
        for label in labels:
            cols += [f"{label} s", f"{label} x", f"{label}/ideal", f"{label} load s"]
        body = []
        for r in rows:
            ideal = r["ideal_s"]
            cells = [
                str(r.get("turn", r["tokens"])),
                str(r["tokens"]),
                str(r["cached_tokens"]),
                f"{r['cold_s']:.3f}",
                f"{ideal:.3f}",
                f"{r['cold_s'] / ideal:.1f}",
            ]
            for label in labels:
                w = r["warm"][label]
                cells += [
                    f"{w['ttft_s']:.3f}",
                    f"{r['cold_s'] / w['ttft_s']:.1f}",
                    f"{w['ttft_s'] / ideal:.2f}",
                    f"{w['load_s']:.3f}",
                ]
            body.append(cells)
        widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
        fmt: Callable[[list[str]], str] = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))
        return [fmt(cols), fmt(["-" * w for w in widths]), *(fmt(b) for b in body)]

    if results["prompts"]:
        lines += [
            "Prompts (x = speedup over cold; /ideal = warm TTFT / ideal TTFT):",
            *table(results["prompts"], "prompt"),
            "",
        ]
    if results["turns"]:
        lines += ["Multi-turn (each turn extends the previous conversation):", *table(results["turns"], "turn")]
    return "\n".join(lines).rstrip()
