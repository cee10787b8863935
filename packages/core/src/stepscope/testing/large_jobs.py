"""Large jobs made fast, for tests and benchmarks of the read side at scale: a job of many
workers x many steps is written once for one worker by the real Writer into memory, then
copied under the other workers' names (their values are worker 0's: what is measured is
listing and opening, not values), and loaded straight into a moto S3 backend."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import numpy as np

from ..capture.collection_manager import CollectionManager
from ..capture.writer import Writer
from ..modes import ModeKeys
from ..store.base import Store


class MemoryStore(Store):
    """Objects in a dict (no I/O): the Writer's output, to be copied elsewhere."""

    def __init__(self) -> None:
        self.url = "memory://job"
        self.objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def write(self, key, data):
        body = bytes(data) if isinstance(data, (bytes, bytearray, memoryview)) else b"".join(bytes(memoryview(p)) for p in data)
        with self._lock:
            self.objects[key] = body

    def read(self, key, max_size=None):
        try:
            return self.objects[key]
        except KeyError:
            raise FileNotFoundError(key) from None

    def read_range(self, key, start, length):
        return self.read(key)[start : start + length]

    def list(self, prefix="", start_after=None):
        return sorted(k for k in self.objects if k.startswith(prefix) and (start_after is None or k > start_after))

    def exists(self, key):
        return key in self.objects

    def delete(self, key):
        self.objects.pop(key, None)


def step_value(worker: int, step: int) -> np.ndarray:
    return np.array([worker, step, worker * step], dtype=np.int64)


def write_worker(store: Store, worker: int, steps: Iterable[int], num_workers: int, end_marker: bool = False) -> None:
    """Real writes of one worker (tensors "ids" = step_value(worker, step) and "loss")."""
    writer = Writer(store, worker=f"worker_{worker}")
    writer.write_collections(CollectionManager().dumps(num_workers=num_workers))
    for step in steps:
        writer.write_step(step, ModeKeys.TRAIN, step, {"ids": step_value(worker, step), "loss": np.float32(step)})
    if not writer.close(end_marker=end_marker):
        raise RuntimeError("the writer did not finish")


def many_worker_job(workers: int, steps: int) -> MemoryStore:
    """`workers` x `steps` job in memory: worker_0 written for real, the rest copied."""
    first = MemoryStore()
    write_worker(first, 0, range(steps), workers)
    out = MemoryStore()
    for worker in range(workers):
        name = f"worker_{worker}"
        for key, body in first.objects.items():
            if key.endswith(".json") and b"worker_0" in body:
                body = body.replace(b'"worker_0', f'"{name}'.encode()).replace(b"_worker_0.", f"_{name}.".encode())
            out.objects[key.replace("worker_0", name)] = body
    return out


def load_into_moto(memory: MemoryStore, url: str, skip: Callable[[str], bool] | None = None) -> None:
    """Put every object (but those `skip` names) into moto's in-process S3 backend, under
    the s3:// `url` (whose bucket exists). Straight into the backend: the S3 protocol is
    what readers are measured on, not how the job got there."""
    from moto.backends import get_backend
    from moto.core import DEFAULT_ACCOUNT_ID

    from ..store.s3 import parse_s3_url

    bucket, prefix = parse_s3_url(url)
    backend = get_backend("s3")[DEFAULT_ACCOUNT_ID]["global"]
    for key, body in memory.objects.items():
        if skip is not None and skip(key):
            continue
        backend.put_object(bucket, f"{prefix}/{key}" if prefix else key, body)


__all__ = ["MemoryStore", "many_worker_job", "write_worker", "step_value", "load_into_moto"]
