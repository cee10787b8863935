"""A store under an s3://bucket/prefix URL, through boto3.

Credentials come from boto3's default chain; an endpoint override (MinIO, a local test
server) from the standard AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 variables or the AWS
config file. Retries are boto3's adaptive mode."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..exceptions import ConfigError, StoreError
from .base import Store, join_key

MULTIPART_THRESHOLD = 64 * 1024 * 1024
MULTIPART_CHUNK = 16 * 1024 * 1024


def parse_s3_url(url: str) -> tuple[str, str]:
    if not url.startswith("s3://"):
        raise ConfigError(f"not an s3:// URL: {url!r}")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise ConfigError(f"S3 URL has no bucket: {url!r}")
    return bucket, prefix.strip("/")


def _client():
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "adaptive", "max_attempts": int(os.environ.get("STEPSCOPE_S3_MAX_ATTEMPTS", "10"))}, max_pool_connections=32)
    return boto3.session.Session().client("s3", config=config)


class S3Store(Store):
    concurrent_reads = True

    def __init__(self, url: str, client=None):
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self._client = client or _client()

    def _key(self, key: str) -> str:
        return join_key(self.prefix, key)

    def _error(self, action: str, key: str, exc: Exception) -> StoreError:
        return StoreError(f"cannot {action} {self.describe(key)}: {exc}")

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
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
            raise

    def read(self, key: str) -> bytes:
        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self._client.exceptions.NoSuchKey:
            raise FileNotFoundError(self.describe(key)) from None
        except Exception as exc:
            raise self._error("read", key, exc) from exc

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            reply = self._client.get_object(Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{start + length - 1}")
            return reply["Body"].read()
        except self._client.exceptions.NoSuchKey:
            raise FileNotFoundError(self.describe(key)) from None
        except Exception as exc:
            raise self._error("read", key, exc) from exc

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

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._error("check", key, exc) from exc

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise self._error("delete", key, exc) from exc
