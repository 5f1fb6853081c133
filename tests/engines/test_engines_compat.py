"""Engines' own file access patterns, reproduced call for call against a KV directory.

SGLang's HiCache file backend (``sglang/srt/mem_cache/hicache_storage.py``, ``HiCacheFile``)
and LMCache's ``fs://`` remote connector (``lmcache/v1/storage_backend/connector/
fs_connector.py``, ``FSConnector``) write KV pages to a plain directory. These tests do not
import the engines (installing them on a CPU machine takes separate venvs with pinned
dependencies); each test reproduces the exact file calls one engine code path makes, as
read from the engines' source (see docs/engines.md and the facts gathered in ENGINES.md),
and says which one. Only POSIX file I/O is used; every test runs on a real kvfs FUSE
mount and, for reference, on a plain directory (``kv_dir``).
"""

from __future__ import annotations

import hashlib
import os
import struct
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(params=["kvfs", "plain-dir"])
def kv_dir(request, tmp_path):
    """The directory under test: a kvfs mount (DRAM over disk), or a plain directory."""
    if request.param == "plain-dir":
        return tmp_path
    return request.getfixturevalue("kvfs_mount")(dram="16MiB", disk="64MiB")


# -- SGLang HiCacheFile ------------------------------------------------------------------


def sglang_hash(token_ids, prior_hash: str | None = None) -> str:
    """SGLang's ``get_hash_str``: sha256 over the parent digest and u32-LE token ids."""
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


class SGLangFileCalls:
    """The file calls of ``HiCacheFile`` (flat directory, ``{key}{suffix}.bin``)."""

    def __init__(self, root: Path, model_name: str = "meta-llama/Llama-3.1-8B", tp_rank=0, tp_size=1):
        self.file_path = str(root)
        model = "-".join(model_name.split("/"))
        self.config_suffix = f"_{model}_{tp_rank}_{tp_size}"
        # __init__: makedirs only when the directory does not exist yet.
        if not os.path.exists(self.file_path) and tp_rank == 0:
            os.makedirs(self.file_path)

    def path(self, key: str) -> str:
        return os.path.join(self.file_path, f"{key}{self.config_suffix}.bin")

    def exists(self, key: str) -> bool:
        return os.path.exists(self.path(key))

    def set(self, key: str, value: torch.Tensor) -> bool:
        # Skip a page that exists; write a dot-named temp file in the same directory with
        # ndarray.tofile, then os.replace it onto the final name.
        if self.exists(key):
            return True
        tmp = os.path.join(self.file_path, f".{uuid.uuid4()}.tmp")
        value.contiguous().view(dtype=torch.uint8).numpy().tofile(tmp)
        os.replace(tmp, self.path(key))
        return True

    def set_direct(self, key: str, value: torch.Tensor) -> bool:
        """Older releases: ``tofile`` straight onto the final name (open "wb": O_TRUNC)."""
        if self.exists(key):
            return True
        value.contiguous().view(dtype=torch.uint8).numpy().tofile(self.path(key))
        return True

    def get(self, key: str, target_location: torch.Tensor) -> torch.Tensor | None:
        expected = target_location.numel() * target_location.element_size()
        try:
            with open(self.path(key), "rb", buffering=0) as f:
                buf = memoryview(target_location.view(torch.uint8).contiguous().numpy())
                if f.readinto(buf) != expected:
                    raise OSError(f"Short read for {key}")
            return target_location
        except FileNotFoundError:
            return None

    def batch_exists(self, keys) -> int:
        for i, key in enumerate(keys):
            if not self.exists(key):
                return i
        return len(keys)

    def batch_exists_v2(self, keys) -> list[bool]:
        return [os.path.isfile(self.path(k)) for k in keys]

    def scan(self) -> set[str]:
        """The metadata cache's fill at start: one os.listdir of the whole directory."""
        return {n for n in os.listdir(self.file_path) if n.endswith(".bin")}

    def clear(self) -> None:
        for filename in os.listdir(self.file_path):
            p = os.path.join(self.file_path, filename)
            if os.path.isfile(p):
                os.remove(p)


def sglang_pages(n: int, page_tokens: int = 64, seed: int = 0):
    """Keys of a chain of *n* pages and one KV page tensor per key (bf16, page-first)."""
    g = torch.Generator().manual_seed(seed)
    keys, prior = [], None
    for i in range(n):
        prior = sglang_hash(list(range(i * page_tokens, (i + 1) * page_tokens)), prior)
        keys.append(prior)
    # [2 (K/V), layers, page tokens, heads, dim]
    pages = [torch.randn(2, 4, page_tokens, 2, 32, generator=g).to(torch.bfloat16) for _ in keys]
    return keys, pages


def test_sglang_set_then_get_with_readinto(kv_dir):
    """SGLang HiCacheFile set/get: temp '.{uuid4}.tmp' + os.replace, then
    open(path, 'rb', buffering=0).readinto(memoryview of a preallocated tensor)."""
    store = SGLangFileCalls(kv_dir / "hicache")
    keys, pages = sglang_pages(3)
    assert all(len(k) == 64 for k in keys)
    for k, p in zip(keys, pages):
        assert store.set(k, p)
    for k, p in zip(keys, pages):
        target = torch.empty_like(p)
        assert store.get(k, target) is target
        assert torch.equal(target, p)
    # The directory holds exactly the pages under their names: no temp file is left.
    assert sorted(os.listdir(store.file_path)) == sorted(os.path.basename(store.path(k)) for k in keys)
    assert os.path.getsize(store.path(keys[0])) == pages[0].numel() * 2


def test_sglang_exists_and_prefix_length(kv_dir):
    """SGLang HiCacheFile exists/batch_exists (os.path.exists, consecutive prefix) and
    batch_exists_v2 (os.path.isfile per key)."""
    store = SGLangFileCalls(kv_dir)
    keys, pages = sglang_pages(4)
    for k, p in zip(keys[:2], pages[:2]):
        store.set(k, p)
    store.set(keys[3], pages[3])
    assert store.batch_exists(keys) == 2
    assert store.batch_exists_v2(keys) == [True, True, False, True]
    assert not store.exists("0" * 64)


def test_sglang_set_skips_an_existing_page(kv_dir):
    """SGLang HiCacheFile set: a page that exists is not rewritten (first writer wins)."""
    store = SGLangFileCalls(kv_dir)
    keys, pages = sglang_pages(1)
    store.set(keys[0], pages[0])
    before = os.stat(store.path(keys[0]))
    store.set(keys[0], torch.zeros_like(pages[0]))
    target = torch.empty_like(pages[0])
    store.get(keys[0], target)
    assert torch.equal(target, pages[0])
    assert os.stat(store.path(keys[0])).st_ino == before.st_ino


def test_sglang_two_ranks_racing_on_one_page(kv_dir):
    """Two SGLang writers that both missed exists() publish the same page: each writes its
    own temp file and os.replace()s it; the reader sees one whole page, never a mix."""
    a, b = SGLangFileCalls(kv_dir), SGLangFileCalls(kv_dir)
    keys, pages = sglang_pages(1)
    tmp_a = os.path.join(a.file_path, f".{uuid.uuid4()}.tmp")
    tmp_b = os.path.join(b.file_path, f".{uuid.uuid4()}.tmp")
    pages[0].view(torch.uint8).numpy().tofile(tmp_a)
    pages[0].view(torch.uint8).numpy().tofile(tmp_b)
    assert not a.exists(keys[0])  # temp files are invisible under the page's name
    os.replace(tmp_a, a.path(keys[0]))
    os.replace(tmp_b, b.path(keys[0]))
    target = torch.empty_like(pages[0])
    assert a.get(keys[0], target) is target and torch.equal(target, pages[0])
    assert a.scan() == {os.path.basename(a.path(keys[0]))}
    assert [n for n in os.listdir(kv_dir) if n.endswith(".tmp")] == []


def test_sglang_reader_keeps_the_page_it_opened(kv_dir):
    """An SGLang reader that opened a page keeps reading its bytes when another writer
    os.replace()s the page meanwhile; the next open sees the new page."""
    store = SGLangFileCalls(kv_dir)
    keys, pages = sglang_pages(2)
    store.set(keys[0], pages[0])
    nbytes = pages[0].numel() * 2
    with open(store.path(keys[0]), "rb", buffering=0) as f:
        tmp = os.path.join(store.file_path, f".{uuid.uuid4()}.tmp")
        pages[1].view(torch.uint8).numpy().tofile(tmp)
        os.replace(tmp, store.path(keys[0]))
        target = torch.empty_like(pages[0])
        assert f.readinto(memoryview(target.view(torch.uint8).numpy())) == nbytes
    assert torch.equal(target, pages[0])
    assert torch.equal(store.get(keys[0], torch.empty_like(pages[0])), pages[1])


def test_sglang_evicted_page_is_a_miss_and_a_short_page_is_an_error(kv_dir):
    """SGLang HiCacheFile get: a vanished file (evicted by the directory) is a miss
    (FileNotFoundError -> None); a short file raises IOError, never returns partial KV."""
    store = SGLangFileCalls(kv_dir)
    keys, pages = sglang_pages(2)
    for k, p in zip(keys, pages):
        store.set(k, p)
    os.remove(store.path(keys[0]))
    assert not store.exists(keys[0])
    assert store.get(keys[0], torch.empty_like(pages[0])) is None
    # A foreign writer publishes a page of another size under that name (temp + replace,
    # which a kvfs mount allows; sealed pages cannot be truncated in place there).
    tmp = os.path.join(store.file_path, f".{uuid.uuid4()}.tmp")
    pages[1][:, :, :10].contiguous().view(torch.uint8).numpy().tofile(tmp)
    os.replace(tmp, store.path(keys[1]))
    with pytest.raises(IOError, match="Short read"):
        store.get(keys[1], torch.empty_like(pages[1]))


def test_sglang_direct_tofile_and_listdir_scan_and_clear(kv_dir):
    """Older SGLang HiCacheFile: tofile() straight onto the final name (O_CREAT|O_TRUNC);
    the metadata cache's os.listdir scan; clear() by listdir + isfile + os.remove."""
    store = SGLangFileCalls(kv_dir)
    keys, pages = sglang_pages(3)
    for k, p in zip(keys, pages):
        store.set_direct(k, p)
    assert store.scan() == {os.path.basename(store.path(k)) for k in keys}
    target = torch.empty_like(pages[2])
    assert torch.equal(store.get(keys[2], target), pages[2])
    store.clear()
    assert os.listdir(store.file_path) == []
    assert store.batch_exists(keys) == 0


def test_sglang_sharded_layout(kv_dir):
    """HiCacheFile variants with a sharded layout: pages under '<root>/<key[:2]>/', shard
    directories made on demand with os.makedirs(exist_ok=True) (racing writers both call
    it), the temp file in the shard directory, and a start-up os.scandir of the root that
    looks at top-level '.bin' files only and checks each against its shard."""
    root = str(kv_dir)
    keys, pages = sglang_pages(6)
    suffix = "_m_0_1"

    def sharded(key):
        return os.path.join(root, key[:2], f"{key}{suffix}.bin")

    for k, p in zip(keys, pages):
        path = sharded(k)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), f".{uuid.uuid4()}.tmp")
        p.contiguous().view(torch.uint8).numpy().tofile(tmp)
        os.replace(tmp, path)
    # One legacy flat page beside the shards.
    flat = os.path.join(root, f"{keys[0]}{suffix}.bin")
    pages[0].view(torch.uint8).numpy().tofile(flat)
    with os.scandir(root) as it:
        entries = list(it)
    dirs = {e.name for e in entries if e.is_dir()}
    assert dirs == {k[:2] for k in keys}
    duplicates = [
        e.name[:-4]
        for e in entries
        if not e.is_dir() and e.name.endswith(".bin") and os.path.exists(os.path.join(root, e.name[:2], e.name))
    ]
    assert duplicates == [f"{keys[0]}{suffix}"]
    for k, p in zip(keys, pages):
        target = torch.empty_like(p)
        with open(sharded(k), "rb", buffering=0) as f:
            assert f.readinto(memoryview(target.view(torch.uint8).numpy())) == p.numel() * 2
        assert torch.equal(target, p)
    walked = sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names)
    assert walked == sorted([flat, *(sharded(k) for k in keys)])


# -- LMCache fs:// connector -----------------------------------------------------------

_META = struct.Struct("iiiiiii")  # length, memory format, dtype code, shape[4]
assert _META.size == 28


class LMCacheFileCalls:
    """The file calls of LMCache's ``FSConnector`` (``remote_url: fs:///p1,/p2``)."""

    def __init__(self, base_paths_str: str, relative_tmp_dir: str | None = None, read_ahead_size: int | None = None):
        self.base_paths = [Path(p.strip()) for p in base_paths_str.split(",")]
        self.relative_tmp_dir = Path(relative_tmp_dir) if relative_tmp_dir else None
        self.read_ahead_size = read_ahead_size
        for path in self.base_paths:
            path.mkdir(parents=True, exist_ok=True)
            if self.relative_tmp_dir is not None:
                (path / self.relative_tmp_dir).mkdir(parents=False, exist_ok=True)

    def _base(self, chunk_hash: int) -> Path:
        if len(self.base_paths) == 1:
            return self.base_paths[0]
        return self.base_paths[abs(chunk_hash) % len(self.base_paths)]

    def file_and_tmp(self, key: str, chunk_hash: int) -> tuple[Path, Path]:
        name = key.replace("/", "-SEP-") + ".data"
        base = self._base(chunk_hash)
        final = base / name
        tmp = base / self.relative_tmp_dir / name if self.relative_tmp_dir else final.with_suffix(".tmp")
        return final, tmp

    def exists_sync(self, key: str, chunk_hash: int) -> bool:
        return os.path.exists(self.file_and_tmp(key, chunk_hash)[0])

    def put(self, key: str, chunk_hash: int, data: torch.Tensor, fmt: int = 1, dtype_code: int = 3) -> None:
        final, tmp = self.file_and_tmp(key, chunk_hash)
        buffer = memoryview(data.contiguous().view(torch.uint8).numpy()).cast("B")
        shape = list(data.shape) + [0] * (4 - data.dim())
        try:
            with open(tmp, "wb") as f:
                f.write(_META.pack(len(buffer), fmt, dtype_code, *shape))
                f.write(buffer)
            os.replace(tmp, final)
        except Exception:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def get(self, key: str, chunk_hash: int, dtype=torch.bfloat16) -> torch.Tensor | None:
        """save_chunk_meta path: read the 28-byte header, allocate, readinto the rest."""
        final, _ = self.file_and_tmp(key, chunk_hash)
        try:
            with open(final, "rb") as f:
                md = bytearray(_META.size)
                if f.readinto(md) != len(md):
                    raise RuntimeError("Partial read meta")
                length, _fmt, _dtype, *shape = _META.unpack(md)
                out = torch.empty([s for s in shape if s], dtype=dtype)
                buffer = memoryview(out.view(torch.uint8).numpy()).cast("B")
                if self.read_ahead_size is None:
                    n = f.readinto(buffer)
                else:
                    n = f.readinto(buffer[: self.read_ahead_size])
                    if n == self.read_ahead_size:
                        n += f.readinto(buffer[self.read_ahead_size :])
                if n != length or n != len(buffer):
                    raise RuntimeError(f"Partial read data {len(buffer)} got {n}")
                return out
        except FileNotFoundError:
            return None

    def list(self) -> list[str]:
        keys = []
        for base in self.base_paths:
            keys.extend(f.stem for f in base.glob("*.data"))
        return keys

    def remove_sync(self, key: str, chunk_hash: int) -> bool:
        try:
            os.remove(self.file_and_tmp(key, chunk_hash)[0])
            return True
        except OSError:
            return False


def lmcache_chunks(n: int, model="meta-llama/Llama-3.1-8B", tag: str = ""):
    """Keys ``model@world_size@worker_id@<chunk hash hex>@dtype[%tag]`` and 256-token chunks."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        h = int.from_bytes(hashlib.sha256(f"chunk-{i}".encode()).digest()[:8], "little", signed=True)
        key = f"{model}@1@0@{h & (2**64 - 1):x}@bfloat16{tag}"
        data = torch.randn(2, 4, 256, 64, generator=g).to(torch.bfloat16)  # [K/V, layers, tokens, hidden]
        out.append((key, h, data))
    return out


@pytest.mark.parametrize("tag", ["", "%lora=abc%salt=1"])
def test_lmcache_put_get_with_header_and_replace(kv_dir, tag):
    """LMCache fs:// put/get: '<key>.data' names with '@' (and '%'), 28-byte 'iiiiiii' header
    then raw bytes, written to '<key>.tmp' and os.replace()d; read header then readinto."""
    conn = LMCacheFileCalls(str(kv_dir / "lmc"))
    chunks = lmcache_chunks(3, tag=tag)
    for key, h, data in chunks:
        assert not conn.exists_sync(key, h)
        conn.put(key, h, data)
        assert conn.exists_sync(key, h)
    for key, h, data in chunks:
        got = conn.get(key, h)
        assert got is not None and torch.equal(got, data)
    names = sorted(os.listdir(kv_dir / "lmc"))
    assert all("@" in n and n.endswith(".data") and "-SEP-" in n for n in names)
    assert len(names) == 3  # no .tmp left behind
    assert os.path.getsize(kv_dir / "lmc" / names[0]) == 28 + chunks[0][2].numel() * 2
    assert sorted(conn.list()) == sorted(k.replace("/", "-SEP-") for k, _, _ in chunks)


def test_lmcache_two_base_paths_and_relative_tmp_dir(kv_dir):
    """LMCache fs:///p1,/p2 with fs_connector_relative_tmp_dir: chunks spread over the paths
    by hash; the temp file lives in '<base>/<tmp dir>/' and is renamed across directories."""
    p1, p2 = kv_dir / "p1", kv_dir / "p2"
    conn = LMCacheFileCalls(f"{p1},{p2}", relative_tmp_dir="tmp")
    chunks = lmcache_chunks(8)
    for key, h, data in chunks:
        conn.put(key, h, data)
    assert len(list(p1.glob("*.data"))) + len(list(p2.glob("*.data"))) == 8
    assert os.listdir(p1 / "tmp") == [] and os.listdir(p2 / "tmp") == []
    for key, h, data in chunks:
        assert torch.equal(conn.get(key, h), data)
    assert len(conn.list()) == 8


def test_lmcache_read_ahead_split_reads(kv_dir):
    """LMCache fs:// with fs_connector_read_ahead_size: the payload is read with two
    readinto calls (the first read-ahead bytes, then the rest) at a non-aligned offset."""
    conn = LMCacheFileCalls(str(kv_dir), read_ahead_size=4096 + 28)
    key, h, data = lmcache_chunks(1)[0]
    conn.put(key, h, data)
    assert torch.equal(conn.get(key, h), data)


def test_lmcache_vanished_file_reads_as_missing(kv_dir):
    """LMCache never deletes; the directory evicts. A chunk that vanished between
    exists/list and get reads as missing (FileNotFoundError -> None), not as an error."""
    conn = LMCacheFileCalls(str(kv_dir))
    chunks = lmcache_chunks(2)
    for key, h, data in chunks:
        conn.put(key, h, data)
    key, h, _ = chunks[0]
    assert conn.exists_sync(key, h)
    os.remove(conn.file_and_tmp(key, h)[0])  # the directory evicted it
    assert conn.get(key, h) is None
    assert not conn.exists_sync(key, h)
    assert conn.list() == [chunks[1][0].replace("/", "-SEP-")]
    assert conn.remove_sync(key, h) is False  # remove of a missing chunk: False, not a crash


def test_lmcache_raw_chunk_partial_read(kv_dir):
    """LMCache fs:// without save_chunk_meta: raw bytes only; a final partial chunk is
    shorter than the preallocated buffer and readinto returns the bytes present."""
    path = kv_dir / "m@1@0@ff@bfloat16.data"
    tmp = path.with_suffix(".tmp")
    full = torch.randn(2, 256, 64).to(torch.bfloat16)
    partial = full[:, :100].contiguous()
    with open(tmp, "wb") as f:
        f.write(memoryview(partial.view(torch.uint8).numpy()).cast("B"))
    os.replace(tmp, path)
    buffer = torch.empty_like(full)
    with open(path, "rb") as f:
        n = f.readinto(memoryview(buffer.view(torch.uint8).numpy()).cast("B"))
    assert n == partial.numel() * 2
    assert torch.equal(buffer.view(-1)[: partial.numel()], partial.view(-1))
