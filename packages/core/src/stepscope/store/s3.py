"""A store under an s3://bucket/prefix URL, through boto3.

Credentials come from boto3's default chain; an endpoint override (MinIO, a local test
server) from the standard AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 variables or the AWS
config file.

No request can hang its caller: each has connect and read timeouts and a bounded number of
attempts (botocore's standard retries), and the `Expect: 100-continue` handshake is off
(botocore spins forever on an endpoint that answers `100 Continue` and closes). A store
that does not answer (timeouts, resets, 5xx, throttling) raises StoreUnavailable, which
the writer waits out and a reader reports, naming the endpoint. Reads retry what the
request-level retries cannot see: a body cut short or a connection dropped while the body
streams. Only a complete object whose CRC fails is corruption; a short read is transient.

A reader against an endpoint that never answers fails after at most
MAX_ATTEMPTS x (CONNECT_TIMEOUT + READ_TIMEOUT) plus botocore's back-off between attempts
(at most 2^(MAX_ATTEMPTS-1) - 1 s): 3 x (5 + 20) + 3 = 78 s with the defaults (`worst_case_s`)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..exceptions import ConfigError, StoreError, StoreUnavailable
from .base import FolderListing, Store, join_key

MULTIPART_THRESHOLD = 64 * 1024 * 1024
MULTIPART_CHUNK = 16 * 1024 * 1024


def parse_s3_url(url: str) -> tuple[str, str]:
    if not url.startswith("s3://"):
        raise ConfigError(f"not an s3:// URL: {url!r}")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise ConfigError(f"S3 URL has no bucket: {url!r}")
    return bucket, prefix.strip("/")


logger = logging.getLogger("stepscope")

# Overridable per process; they bound one request (`worst_case_s`). The writer does not
# lean on them to ride out an outage (it retries for as long as it has to), so they are
# sized for a reader that should say soon that the endpoint is not answering.
MAX_ATTEMPTS_ENV = "STEPSCOPE_S3_MAX_ATTEMPTS"
CONNECT_TIMEOUT_ENV = "STEPSCOPE_S3_CONNECT_TIMEOUT_S"
READ_TIMEOUT_ENV = "STEPSCOPE_S3_READ_TIMEOUT_S"
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 20.0
READ_RETRIES = 4  # extra tries of a read whose body was cut short
_READ_BACKOFF_S = 0.05


def _positive(env: str, default: float, kind: type = float) -> float:
    raw = os.environ.get(env)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{env} must be a positive number, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{env} must be a positive number, got {raw!r}")
    return value


def _settings() -> tuple[int, float, float]:
    return (
        int(_positive(MAX_ATTEMPTS_ENV, DEFAULT_MAX_ATTEMPTS, int)),
        _positive(CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT_S),
        _positive(READ_TIMEOUT_ENV, DEFAULT_READ_TIMEOUT_S),
    )


def worst_case_s() -> float:
    """The longest one request waits for an endpoint that never answers, with the current
    settings: every attempt's connect and read timeouts, plus botocore's back-off between
    attempts (random, under min(2^i, 20) s before attempt i + 1)."""
    attempts, connect, read = _settings()
    return attempts * (connect + read) + sum(min(2.0**i, 20.0) for i in range(attempts - 1))


def client_config():
    """botocore's Config for stepscope's clients: timeouts and retry budget from the env.
    Standard retries, not adaptive: adaptive mode adds a client-side rate limiter that
    keeps throttling a writer catching up after an outage."""
    from botocore.config import Config

    attempts, connect, read = _settings()
    return Config(
        retries={"mode": "standard", "total_max_attempts": attempts},  # ("max_attempts" would count retries only)
        connect_timeout=connect,
        read_timeout=read,
        tcp_keepalive=True,
        max_pool_connections=32,
    )


_session_lock = threading.Lock()
_sessions: dict[int, Any] = {}


def _client():
    import boto3
    from botocore.handlers import add_expect_header

    # One boto3 session per process: a fresh session parses botocore's service models again
    # (~0.2 s of CPU per client; 64 writer threads or a trial per worker pay it each time).
    # Creating clients from one session is not thread-safe, hence the lock.
    with _session_lock:
        session = _sessions.get(os.getpid())
        if session is None:
            session = _sessions[os.getpid()] = boto3.session.Session()
        client = session.client("s3", config=client_config())
    client.meta.events.unregister("before-call.s3", add_expect_header)
    return client


def _transient_read_errors() -> tuple[type[Exception], ...]:
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError, IncompleteReadError
    from urllib3.exceptions import HTTPError as Urllib3Error

    return (IncompleteReadError, HTTPClientError, BotoConnectionError, Urllib3Error, ConnectionError, TimeoutError)


# Answers that mean "not now" rather than "never": a later try may succeed.
_TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable", "InternalError", "RequestLimitExceeded"})


def is_transient(exc: BaseException) -> bool:
    """Whether the store may take the request if asked again later: no answer (timeouts,
    refused or reset connections), a 5xx, throttling. Not: a refusal (403), a missing
    bucket, a TLS failure (a configuration that retrying will not mend)."""
    from botocore.exceptions import ClientError
    from botocore.exceptions import SSLError as BotoSSLError

    if isinstance(exc, ClientError):
        response = getattr(exc, "response", None) or {}
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = response.get("Error", {}).get("Code")
        return code in _TRANSIENT_CODES or status in (408, 429) or (isinstance(status, int) and status >= 500)
    if isinstance(exc, BotoSSLError):
        return False
    return isinstance(exc, (_ShortRead, *_transient_read_errors()))


class _ShortRead(Exception):
    """A body shorter than the server said it would be."""


class S3Store(Store):
    concurrent_reads = True

    def __init__(self, url: str, client=None):
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self._client = client or _client()

    def _key(self, key: str) -> str:
        return join_key(self.prefix, key)

    @property
    def endpoint(self) -> str:
        return str(getattr(self._client.meta, "endpoint_url", "") or "the default AWS endpoint")

    def _error(self, action: str, key: str, exc: Exception) -> StoreError:
        if is_transient(exc):
            return StoreUnavailable(f"cannot {action} {self.describe(key)}: the endpoint {self.endpoint} did not answer ({exc})")
        return StoreError(f"cannot {action} {self.describe(key)} (endpoint {self.endpoint}): {exc}")

    def write(self, key: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
        total = sum(memoryview(p).nbytes for p in parts)
        try:
            if total < MULTIPART_THRESHOLD:
                body = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)
                self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body)
            else:
                self._multipart(key, parts)
        except StoreError:
            raise
        except Exception as exc:  # botocore raises many unrelated types
            raise self._error("write", key, exc) from exc

    def _multipart(self, key: str, parts: list) -> None:
        full_key = self._key(key)
        upload = self._client.create_multipart_upload(Bucket=self.bucket, Key=full_key)
        upload_id = upload["UploadId"]
        try:
            done = []
            buffer = bytearray()
            number = 1

            def send(chunk: bytes) -> None:
                nonlocal number
                reply = self._client.upload_part(Bucket=self.bucket, Key=full_key, UploadId=upload_id, PartNumber=number, Body=chunk)
                done.append({"ETag": reply["ETag"], "PartNumber": number})
                number += 1

            for part in parts:
                view = memoryview(part).cast("B")
                while view.nbytes:
                    take = min(MULTIPART_CHUNK - len(buffer), view.nbytes)
                    buffer += view[:take]
                    view = view[take:]
                    if len(buffer) == MULTIPART_CHUNK:
                        send(bytes(buffer))
                        buffer.clear()
            if buffer or not done:
                send(bytes(buffer))
            self._client.complete_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id, MultipartUpload={"Parts": done})
        except BaseException:
            try:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
            except Exception as exc:  # the upload's own error is the one to report
                logger.debug("stepscope: could not abort the multipart upload of %s: %s", self.describe(key), exc)
            raise

    def read(self, key: str, max_size: int | None = None) -> bytes:
        if max_size is None:
            return self._get(key, {})
        # One ranged GET asks for one byte more than allowed: more back means too large.
        data = self._get(key, {"Range": f"bytes=0-{max_size}"})
        if len(data) > max_size:
            raise StoreError(f"{self.describe(key)} is larger than the {max_size} bytes a file of its kind may have")
        return data

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        if start < 0:
            raise StoreError(f"cannot read {self.describe(key)} from byte {start}")
        return self._get(key, {"Range": f"bytes={start}-{start + length - 1}"})

    def _get(self, key: str, extra: dict[str, str]) -> bytes:
        """One GET, retried when its body arrives short or the connection drops mid-body
        (botocore's own retries end once the headers are in). A request that got no
        answer at all has had botocore's attempts already: it is not tried again here,
        so that a silent endpoint costs one request's budget (`worst_case_s`)."""
        retried: tuple[type[Exception], ...] = (_ShortRead, *_transient_read_errors())
        for attempt in range(READ_RETRIES + 1):
            try:
                reply = self._client.get_object(Bucket=self.bucket, Key=self._key(key), **extra)
            except self._client.exceptions.NoSuchKey:
                raise FileNotFoundError(self.describe(key)) from None
            except Exception as exc:
                if (getattr(exc, "response", None) or {}).get("Error", {}).get("Code") == "InvalidRange":
                    return b""  # a range past the end: like a local read there, nothing
                raise self._error("read", key, exc) from exc
            try:
                data = reply["Body"].read()
                expected = reply.get("ContentLength")
                if expected is not None and len(data) != expected:
                    raise _ShortRead(f"{len(data)} of {expected} bytes")
                return data
            except retried as exc:
                if attempt == READ_RETRIES:
                    raise self._error("read", key, exc) from exc
                logger.debug("stepscope: retrying read of %s after %s", self.describe(key), exc)
                time.sleep(_READ_BACKOFF_S * 2**attempt)
            except Exception as exc:
                raise self._error("read", key, exc) from exc
        raise AssertionError("unreachable")

    def size(self, key: str) -> int:
        try:
            return int(self._client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except Exception as exc:
            if (getattr(exc, "response", None) or {}).get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError(self.describe(key)) from None
            raise self._error("check", key, exc) from exc

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        full_prefix = self._key(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        if prefix.endswith("/") and not full_prefix.endswith("/"):
            full_prefix += "/"
        strip = len(self.prefix) + 1 if self.prefix else 0
        kwargs = {"Bucket": self.bucket, "Prefix": full_prefix}
        if start_after:
            kwargs["StartAfter"] = self._key(start_after)
        keys: list[str] = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(**kwargs):
                keys.extend(item["Key"][strip:] for item in page.get("Contents", ()))
        except Exception as exc:
            raise self._error("list", prefix, exc) from exc
        return sorted(keys)

    def list_folder(self, folder: str = "") -> FolderListing:
        # One level: S3's delimiter listing returns the "folders" as common prefixes.
        prefix = self._key(folder.strip("/")) if folder.strip("/") else self.prefix
        prefix = prefix + "/" if prefix else ""
        files, folders = [], []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
                folders += [common["Prefix"][len(prefix) :].rstrip("/") for common in page.get("CommonPrefixes", ())]
                files += [item["Key"][len(prefix) :] for item in page.get("Contents", ())]
        except Exception as exc:
            raise self._error("list", folder, exc) from exc
        return FolderListing(sorted(f for f in files if f), sorted(f for f in folders if f))

    def reopenable_url(self) -> str:
        return self.url

    def is_empty(self) -> bool:
        try:
            reply = self._client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + "/" if self.prefix else "", MaxKeys=1)
        except Exception as exc:
            raise self._error("list", "", exc) from exc
        return not reply.get("Contents")

    def probe(self) -> None:
        try:
            self._client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + "/" if self.prefix else "", MaxKeys=1)
        except Exception as exc:
            raise self._error("list", "", exc) from exc

    def delete_prefix(self, prefix: str) -> int:
        if not prefix.strip("/"):
            raise StoreError(f"refusing to delete everything in {self.describe()}: give a folder")
        keys = self.list(prefix)
        # DeleteObjects takes at most 1,000 keys a request.
        for first in range(0, len(keys), 1000):
            batch = [{"Key": self._key(key)} for key in keys[first : first + 1000]]
            try:
                reply = self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except Exception as exc:
                raise self._error("delete", prefix, exc) from exc
            if reply.get("Errors"):
                failed = reply["Errors"][0]
                raise StoreError(f"cannot delete s3://{self.bucket}/{failed.get('Key', prefix)} (endpoint {self.endpoint}): {failed.get('Message', failed)}")
        return len(keys)

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except Exception as exc:
            if (getattr(exc, "response", None) or {}).get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._error("check", key, exc) from exc

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise self._error("delete", key, exc) from exc
