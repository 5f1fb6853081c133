"""The ``s3`` tier: a bucket and prefix on any S3-compatible endpoint, through boto3.

One object per block at ``<prefix>/<block path>``. The body is the block file format of
:mod:`kvfs.blockfile` (header, then payload; the trailing zero padding of the file
format is left out since objects are never read with direct I/O), so every object is
self-describing and every read verifies the header and the payload checksum. The
payload length and checksum are also stored as object metadata (``x-amz-meta-kvfs-length``
and ``x-amz-meta-kvfs-checksum``) so :meth:`S3Tier.stat` is one HEAD; an object without
them (written by another tool) is stat'ed with a ranged GET of its header.

Blocks whose object reaches ``multipart_threshold`` bytes are uploaded in parts (at least
5 MiB each, S3's minimum); a failed multipart upload is aborted.

Lifetimes (``kvfs gc``, the retention sweep): :meth:`S3Tier.inventory` lists objects
(with ``LastModified``) and unfinished multipart uploads (a crashed writer's leftovers,
with ``Initiated``); :meth:`S3Tier.expire` checks an object's age with a HEAD and deletes
it with ``If-Match`` on the ETag it saw, so a different version written since is kept. S3
has no delete-if-unmodified-since: an identical copy another node published between the
two calls (same name, same bytes, same ETag) is deleted, and reads there as a miss.

Credentials come from boto3's usual chain (environment, config files, instance roles)
and are never logged: messages name the bucket, key and S3 error code only.

Timeouts and retries are botocore's: ``connect_timeout`` and ``read_timeout`` are the
tier's ``timeout``, ``max_attempts`` counts the first try, and the ``standard`` retry mode
backs off exponentially (with jitter) on throttling (``SlowDown``, 503), timeouts and
connection errors. What still fails after that is translated by :data:`ERROR_TABLE`.
Every call also runs in a bounded pool of worker threads
(:class:`~kvfs.deadline.DeadlineExecutor`) with a hard deadline of ``timeout x
max_attempts`` (:attr:`S3Tier.deadline`), so an endpoint that accepts connections and
trickles or never answers cannot hold a caller longer; an abandoned call never touches
the caller's buffers (uploads send a body built before the call, reads return their own).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from kvfs.blockfile import ALIGN, decode_header, encode_header, header_length, verify
from kvfs.config import S3Config, TierKind
from kvfs.deadline import DeadlineExecutor
from kvfs.errors import BlockCorrupt, BlockNotFound, KvfsError, TierFull, TierUnavailable
from kvfs.pieces import Pieces
from kvfs.tier import BlockInfo, BlockRef, StoredObject, Tier

try:
    import boto3
    import botocore.config
    import botocore.exceptions
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the s3 tier needs boto3: pip install 'kvfs[s3]'") from exc

__all__ = ["ERROR_TABLE", "S3Tier", "translate"]

log = logging.getLogger("kvfs.tiers.s3")

_MIN_PART = 5 << 20  # S3's smallest part (but the last)
_META_LENGTH = "kvfs-length"
_META_CHECKSUM = "kvfs-checksum"

# The one place S3 error codes become kvfs errors: code -> (error class, what it means).
# Codes absent here are TierUnavailable with the code and S3's own message.
ERROR_TABLE: dict[str, tuple[type[KvfsError], str]] = {
    "NoSuchKey": (BlockNotFound, "no such object"),
    "404": (BlockNotFound, "no such object"),
    "NotFound": (BlockNotFound, "no such object"),
    "NoSuchUpload": (BlockNotFound, "no such multipart upload"),
    "NoSuchBucket": (TierUnavailable, "the bucket does not exist"),
    "AccessDenied": (TierUnavailable, "access denied: check the credentials boto3 finds and the bucket policy"),
    "403": (TierUnavailable, "access denied: check the credentials boto3 finds and the bucket policy"),
    "InvalidAccessKeyId": (TierUnavailable, "the access key is not known to the endpoint"),
    "SignatureDoesNotMatch": (TierUnavailable, "the secret key does not match the access key"),
    "ExpiredToken": (TierUnavailable, "the session token has expired"),
    "InvalidToken": (TierUnavailable, "the session token is invalid"),
    "SlowDown": (TierUnavailable, "throttled (SlowDown) after every retry"),
    "503": (TierUnavailable, "service unavailable (503) after every retry"),
    "ServiceUnavailable": (TierUnavailable, "service unavailable after every retry"),
    "RequestTimeout": (TierUnavailable, "request timed out after every retry"),
    "InternalError": (TierUnavailable, "internal server error after every retry"),
    "500": (TierUnavailable, "internal server error after every retry"),
    "QuotaExceeded": (TierFull, "the bucket's quota is exhausted"),
    "EntityTooLarge": (TierFull, "the block is larger than the endpoint accepts"),
}

# botocore exceptions that are not ClientError (no S3 code): no answer at all.
_TRANSPORT: tuple[tuple[type[Exception], str], ...] = (
    (botocore.exceptions.NoCredentialsError, "no credentials: boto3's chain found none"),
    (botocore.exceptions.ConnectTimeoutError, "connection timed out after every retry"),
    (botocore.exceptions.ReadTimeoutError, "read timed out after every retry"),
    (botocore.exceptions.EndpointConnectionError, "cannot connect to the endpoint after every retry"),
    (botocore.exceptions.ConnectionClosedError, "the endpoint closed the connection after every retry"),
    (botocore.exceptions.ConnectionError, "connection failed after every retry"),
    (botocore.exceptions.BotoCoreError, "request failed"),
)


def translate(exc: Exception, what: str) -> KvfsError:
    """The kvfs error for a botocore exception raised while doing *what* (raise it
    ``from exc``). Only the code and S3's message are kept: nothing from the request."""
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?"))
        fallback: tuple[type[KvfsError], str] = (TierUnavailable, str(err.get("Message") or "request failed"))
        cls, meaning = ERROR_TABLE.get(code, fallback)
        return cls(f"{what}: {meaning} ({code})")
    for transport, why in _TRANSPORT:
        if isinstance(exc, transport):
            return TierUnavailable(f"{what}: {why} ({type(exc).__name__})")
    return TierUnavailable(f"{what}: {type(exc).__name__}")  # pragma: no cover - filtered by callers


_BOTO_ERRORS = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)


class S3Tier(Tier):
    kind = TierKind.S3
    persistent = True
    shared = True

    def __init__(self, config: S3Config, *, client: Any = None) -> None:
        super().__init__(config)
        self.bucket = config.bucket
        p = config.prefix.strip("/")
        self.prefix = f"{p}/" if p else ""
        self.multipart_threshold = max(config.multipart_threshold, 1)
        self._what = f"s3 tier {config.name!r} (s3://{self.bucket}/{self.prefix})"
        self.deadline = config.timeout * config.max_attempts
        """Seconds any one call may take, every retry included."""
        if client is None:
            bc = botocore.config.Config(
                connect_timeout=config.timeout,
                read_timeout=config.timeout,
                retries={"max_attempts": config.max_attempts, "mode": "standard"},
                max_pool_connections=max(config.concurrency, 10),
            )
            # A session per tier: boto3's default session is not thread-safe to create clients on.
            client = boto3.session.Session().client(
                "s3", endpoint_url=config.endpoint_url, region_name=config.region, config=bc
            )
        self.client = client
        self._exec = DeadlineExecutor(self._what, timeout=self.deadline, workers=config.concurrency)

    def key(self, name: str) -> str:
        return self.prefix + name

    def _fail(self, exc: Exception, op: str, name: str = "") -> KvfsError:
        return translate(exc, f"{self._what}: {op} {name}".rstrip())

    def footprint(self, name: str, size: int) -> int:
        return header_length(name) + size

    # -- writing ---------------------------------------------------------------------

    def put(self, name: str, data: Any, checksum: int) -> None:
        pieces = Pieces.of(data)
        # the body is built here, a copy: a call abandoned at its deadline must not read
        # the caller's buffer later (a DRAM extent may be reused by then)
        body = b"".join((encode_header(name, len(pieces), checksum), *pieces))
        meta = {_META_LENGTH: str(len(pieces)), _META_CHECKSUM: f"{checksum:016x}"}
        self._exec.call(self._upload, name, body, meta, op=f"write of {name}")

    def _upload(self, name: str, body: bytes, meta: dict[str, str]) -> None:
        key = self.key(name)
        try:
            if len(body) < self.multipart_threshold:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=body, Metadata=meta)
            else:
                self._put_multipart(key, body, meta)
        except _BOTO_ERRORS as exc:
            raise self._fail(exc, "write of", name) from exc

    def _put_multipart(self, key: str, body: bytes, meta: dict[str, str]) -> None:
        part = max(self.multipart_threshold, _MIN_PART, -(-len(body) // 10000))
        up = self.client.create_multipart_upload(Bucket=self.bucket, Key=key, Metadata=meta)
        uid = up["UploadId"]
        try:
            view = memoryview(body)
            parts = []
            for n, off in enumerate(range(0, len(body), part), start=1):
                r = self.client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=uid, PartNumber=n, Body=bytes(view[off : off + part])
                )
                parts.append({"PartNumber": n, "ETag": r["ETag"]})
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=uid)
            except _BOTO_ERRORS as exc:
                log.warning("%s: cannot abort multipart upload of %s: %s", self._what, key, self._fail(exc, "abort"))
            raise

    # -- reading ---------------------------------------------------------------------

    def _get(self, name: str) -> memoryview:
        def get() -> bytes:
            try:
                body: bytes = self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()
                return body
            except _BOTO_ERRORS as exc:
                raise self._fail(exc, "read of", name) from exc

        return memoryview(self._exec.call(get, op=f"read of {name}"))

    def _payload(self, name: str, mv: memoryview) -> tuple[memoryview, int]:
        hdr = decode_header(mv)
        if hdr.name != name:
            raise BlockCorrupt(f"{self._what}: object {name} holds block {hdr.name!r}")
        end = hdr.header_length + hdr.length
        if len(mv) < end:
            raise BlockCorrupt(f"{self._what}: object {name} is truncated")
        payload = mv[hdr.header_length : end]
        verify(payload, hdr.checksum, f"{self._what}: {name}")
        return payload, hdr.checksum

    def open(self, name: str) -> BlockRef:
        payload, csum = self._payload(name, self._get(name))
        return BlockRef(payload, csum)  # bytes from the response: already read-only

    def read_into(self, name: str, out: Any) -> tuple[int, int]:
        payload, csum = self._payload(name, self._get(name))
        n = len(payload)
        if len(out) < n:
            raise ValueError(f"buffer of {len(out)} bytes is too small for a block of {n}")
        memoryview(out).cast("B")[:n] = payload
        return n, csum

    def stat(self, name: str) -> BlockInfo | None:
        return self._exec.call(self._stat, name, op=f"stat of {name}")

    def _stat(self, name: str) -> BlockInfo | None:
        key = self.key(name)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
            meta = head.get("Metadata", {})
            if _META_LENGTH in meta and _META_CHECKSUM in meta:
                return BlockInfo(name, int(meta[_META_LENGTH]), int(meta[_META_CHECKSUM], 16))
            raw = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=0-{ALIGN - 1}")["Body"].read()
        except _BOTO_ERRORS as exc:
            err = self._fail(exc, "stat of", name)
            if isinstance(err, BlockNotFound):
                return None
            raise err from exc
        except ValueError:  # metadata that is not ours
            log.warning("%s: %s has unreadable kvfs metadata", self._what, key)
            return None
        try:
            hdr = decode_header(raw)
        except BlockCorrupt as exc:
            log.warning("%s: %s is not a kvfs block: %s", self._what, key, exc)
            return None
        return BlockInfo(name, hdr.length, hdr.checksum) if hdr.name == name else None

    # -- listing ---------------------------------------------------------------------

    def _pages(self, **kw: Any) -> list[dict[str, Any]]:
        """Every page of a listing, fetched in one deadline-bounded call."""

        def pages() -> list[dict[str, Any]]:
            try:
                return list(self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, **kw))
            except _BOTO_ERRORS as exc:
                raise self._fail(exc, "listing of", kw.get("Prefix", "")) from exc

        return self._exec.call(pages, op=f"listing of {kw.get('Prefix', '') or '/'}")

    def scan(self, prefix: str = "") -> Iterator[BlockInfo]:
        """Every block under *prefix*: one listing, then a HEAD per object for its checksum."""
        p = prefix.strip("/")
        start = self.prefix + (f"{p}/" if p else "")
        for page in self._pages(Prefix=start):
            for obj in page.get("Contents", ()):
                name = obj["Key"][len(self.prefix) :]
                info = self.stat(name)
                if info is None:
                    log.warning("%s: skipping %s: not a kvfs block", self._what, obj["Key"])
                    continue
                yield info

    def listdir(self, directory: str = "") -> dict[str, bool]:
        """One delimited listing: objects are blocks, common prefixes are directories."""
        d = directory.strip("/")
        start = self.prefix + (f"{d}/" if d else "")
        out: dict[str, bool] = {}
        for page in self._pages(Prefix=start, Delimiter="/"):
            for cp in page.get("CommonPrefixes", ()):
                out[cp["Prefix"][len(start) :].rstrip("/")] = True
            for obj in page.get("Contents", ()):
                base = obj["Key"][len(start) :]
                if base:
                    out.setdefault(base, False)
        return out

    # -- lifetimes -------------------------------------------------------------------

    def inventory(self, prefix: str = "") -> Iterator[StoredObject]:
        """Objects under *prefix*, a listing page per deadline, then the unfinished
        multipart uploads there (leftovers: their ``token`` is the upload id)."""
        p = prefix.strip("/")
        start = self.prefix + (f"{p}/" if p else "")
        token: str | None = None
        while True:
            page = self._exec.call(self._list_page, start, token, op=f"listing of {start or '/'}")
            for obj in page.get("Contents", ()):
                key = obj["Key"]
                yield StoredObject(key[len(self.prefix) :], obj["LastModified"].timestamp(), int(obj.get("Size", 0)))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        marker: tuple[str, str] | None = None
        while True:
            page = self._exec.call(self._list_uploads, start, marker, op=f"uploads under {start or '/'}")
            for up in page.get("Uploads", ()):
                name = up["Key"][len(self.prefix) :]
                yield StoredObject(name, up["Initiated"].timestamp(), 0, leftover=True, token=up["UploadId"])
            if not page.get("IsTruncated"):
                break
            marker = (page.get("NextKeyMarker", ""), page.get("NextUploadIdMarker", ""))

    def _list_page(self, start: str, token: str | None) -> dict[str, Any]:
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": start}
        if token:
            kw["ContinuationToken"] = token
        try:
            page: dict[str, Any] = self.client.list_objects_v2(**kw)
            return page
        except _BOTO_ERRORS as exc:
            raise self._fail(exc, "listing of", start) from exc

    def _list_uploads(self, start: str, marker: tuple[str, str] | None) -> dict[str, Any]:
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": start}
        if marker:
            kw["KeyMarker"], kw["UploadIdMarker"] = marker
        try:
            page: dict[str, Any] = self.client.list_multipart_uploads(**kw)
            return page
        except _BOTO_ERRORS as exc:
            raise self._fail(exc, "listing of uploads under", start) from exc

    def expire(self, name: str, cutoff: float) -> bool:
        return bool(self._exec.call(self._expire, name, cutoff, op=f"expiry of {name}"))

    def _expire(self, name: str, cutoff: float) -> bool:
        key = self.key(name)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except _BOTO_ERRORS as exc:
            err = self._fail(exc, "expiry of", name)
            if isinstance(err, BlockNotFound):
                return False
            raise err from exc
        if head["LastModified"].timestamp() >= cutoff:
            return False
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key, IfMatch=head["ETag"])
        except botocore.exceptions.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("PreconditionFailed", "412", "NoSuchKey", "404"):
                return False  # replaced by another version since the HEAD, or gone
            if code not in ("NotImplemented", "501", "InvalidArgument"):
                raise self._fail(exc, "expiry of", name) from exc
            try:  # an endpoint without conditional deletes: the HEAD above is all the check there is
                self.client.delete_object(Bucket=self.bucket, Key=key)
            except _BOTO_ERRORS as exc2:
                raise self._fail(exc2, "expiry of", name) from exc2
        except botocore.exceptions.BotoCoreError as exc:
            raise self._fail(exc, "expiry of", name) from exc
        return True

    def remove_leftover(self, obj: StoredObject, cutoff: float) -> bool:
        if not obj.leftover:
            raise ValueError(f"{obj.name} is a block, not a leftover; use expire()")
        if obj.mtime >= cutoff:
            return False

        def abort() -> bool:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key(obj.name), UploadId=obj.token)
            except _BOTO_ERRORS as exc:
                err = self._fail(exc, "abort of the upload of", obj.name)
                if isinstance(err, BlockNotFound):  # NoSuchUpload: finished or aborted since
                    return False
                raise err from exc
            return True

        return bool(self._exec.call(abort, op=f"abort of the upload of {obj.name}"))

    # -- removing --------------------------------------------------------------------

    def delete(self, name: str) -> None:
        def delete() -> None:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=self.key(name))
            except _BOTO_ERRORS as exc:
                err = self._fail(exc, "delete of", name)
                if not isinstance(err, BlockNotFound):
                    raise err from exc

        self._exec.call(delete, op=f"delete of {name}")

    def close(self) -> None:
        self._exec.close()
        self.client.close()
