"""Fixtures of the cross-package tests (faults, distributed): a fault-injecting HTTP proxy in
front of the S3-protocol test server (real sockets on 127.0.0.1; boto3 talks to it as to
any S3 endpoint). The proxy itself is stepscope.testing.s3_proxy (bench/ uses it too)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from stepscope.testing.s3_proxy import FAULTS, FaultProxy

__all__ = ["FAULTS", "FaultProxy", "wait_until"]


@pytest.fixture
def fault_proxy(s3_endpoint):
    proxy = FaultProxy(s3_endpoint)
    yield proxy
    proxy.close()


@pytest.fixture
def via_proxy(fault_proxy, monkeypatch):
    """boto3 clients created from here on talk to the proxy; fast retries for tests."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", fault_proxy.url)
    monkeypatch.setenv("STEPSCOPE_S3_CONNECT_TIMEOUT_S", "2")
    monkeypatch.setenv("STEPSCOPE_S3_READ_TIMEOUT_S", "2")
    return fault_proxy


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
