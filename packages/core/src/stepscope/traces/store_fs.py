"""A read-only pyarrow filesystem over a Store, so that pyarrow datasets (and DuckDB
scanning them) read a job's Parquet tables where the job is, local or S3, through the
Store's own reads: ranged GETs of the footers and of the column chunks a query needs,
never a whole object, never a second set of S3 credentials (DuckDB's httpfs)."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from ..store import Store


class _RangedFile(io.RawIOBase):
    """One object of the store as a seekable file: every read is a ranged read."""

    def __init__(self, store: Store, key: str, size: int):
        self._store, self._key, self._size, self._position = store, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        length = min(len(view), self._size - self._position)
        if length <= 0:
            return 0
        data = self._store.read_range(self._key, self._position, length)
        view[: len(data)] = data
        self._position += len(data)
        return len(data)


class StoreFileSystemHandler(pafs.FileSystemHandler):
    """pyarrow's side of a Store: files are keys; only reading is offered."""

    def __init__(self, store: Store):
        self.store = store

    def get_type_name(self) -> str:
        return "stepscope-store"

    def normalize_path(self, path: str) -> str:
        return path.strip("/")

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        infos = []
        for path in paths:
            key = self.normalize_path(path)
            try:
                infos.append(pafs.FileInfo(key, pafs.FileType.File, size=self.store.size(key)))
            except FileNotFoundError:
                infos.append(pafs.FileInfo(key, pafs.FileType.NotFound))
        return infos

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        prefix = self.normalize_path(selector.base_dir)
        keys = self.store.list(f"{prefix}/" if prefix else "")
        if not selector.recursive:
            keys = [k for k in keys if "/" not in k[len(prefix) + 1 :]]
        return self.get_file_info(keys)

    def open_input_file(self, path: str) -> pa.NativeFile:
        key = self.normalize_path(path)
        return pa.PythonFile(io.BufferedReader(_RangedFile(self.store, key, self.store.size(key)), buffer_size=1 << 20), mode="r")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.open_input_file(path)

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise pa.ArrowNotImplementedError(f"{self.store.describe()}: read-only here")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _read_only
    move = copy_file = open_output_stream = open_append_stream = _read_only


def parquet_dataset(store: Store, keys: list[str]) -> ds.Dataset:
    """The Parquet files `keys` of `store` as one dataset (the first file's schema)."""
    return ds.dataset(keys, filesystem=pafs.PyFileSystem(StoreFileSystemHandler(store)), format="parquet")
