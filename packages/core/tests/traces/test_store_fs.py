"""The read-only pyarrow filesystem over a Store (store_fs.py), on the S3 test server and a
local folder: the same data as the files themselves, listings with sizes, no writes."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from stepscope.store import open_store
from stepscope.traces.store_fs import StoreFileSystemHandler, parquet_dataset


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=1000)
    return sink.getvalue()


@pytest.mark.parametrize("where", ["s3", "local"])
def test_datasets_read_through_the_store(where: str, s3_url: str, tmp_path) -> None:
    store = open_store(s3_url if where == "s3" else str(tmp_path))
    tables = [pa.table({"rank": pa.array([rank] * 2500, pa.int32()), "ts_ns": pa.array(range(rank, rank + 2500), pa.int64())}) for rank in (0, 1)]
    keys = [f"t/rank{rank}/w.parquet" for rank in (0, 1)]
    for key, table in zip(keys, tables):
        store.write(key, _parquet(table))
    store.write("t/notes.txt", b"x")
    read = parquet_dataset(store, keys).to_table()
    assert read.equals(pa.concat_tables(tables))
    # a projection and a filter read only what they need, and still the right rows
    one = parquet_dataset(store, keys).to_table(columns=["ts_ns"], filter=pc.field("rank") == 1)
    assert one.column("ts_ns").to_pylist() == list(range(1, 2501))
    fs = pafs.PyFileSystem(StoreFileSystemHandler(store))
    listed = {info.path: info.size for info in fs.get_file_info(pafs.FileSelector("t", recursive=True))}
    assert listed == {key: len(store.read(key)) for key in [*keys, "t/notes.txt"]}
    assert [info.path for info in fs.get_file_info(pafs.FileSelector("t", recursive=False))] == ["t/notes.txt"]
    assert fs.get_file_info("t/missing.parquet").type == pafs.FileType.NotFound
    with pytest.raises(pa.ArrowNotImplementedError, match="read-only"):
        fs.open_output_stream("t/new.parquet")
