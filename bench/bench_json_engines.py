"""Which compiled JSON engine could parse Kineto's events faster per core than pyarrow's,
keeping times exact: the same generated events as newline-delimited JSON (the form the
trace reader hands its parser after marking the separators), read with the reader's
explicit schema, on one thread each, side by side in one process, CPU seconds measured.

    python bench/bench_json_engines.py [--mb 75] [--repeat 2]

Engines: pyarrow.json (what stepscope uses), DuckDB's read_json with typed columns
(ts/dur as DECIMAL(38, 3): exact nanoseconds) in two forms: `args` as a struct of the
fields the reader needs (fastest, but DuckDB matches struct keys without case, so Kineto's
`bytes` (memcpy) and `Bytes` (allocator events) cannot both be read), and `args` as JSON
with the fields extracted (both read). Prints MB/s per CPU core and checks that every
engine's nanoseconds are equal."""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time

import numpy as np
import pyarrow.json as pj

from stepscope.traces.reader import _RAW_SCHEMA, _micros_to_ns
from stepscope.traces.synth import SynthSpec, trace_bytes

FIELDS = ["External id", "correlation", "device", "stream", "bytes", "Total Allocated", "Device Id"]


def ndjson(megabytes: float) -> bytes:
    ops = max(100, int(megabytes * 1e6 / 1050 / 10))
    data, _ = trace_bytes(SynthSpec(steps=10, ops_per_step=ops, seed=5))
    body = data[data.index(b"[", data.index(b'"traceEvents"')) + 1 : data.rindex(b"]")]
    lines = [line for line in body.replace(b"},\n{", b"}\n{").split(b"\n") if line.strip() and b'"Traces"' not in line]
    return b"\n".join(line.rstrip(b",") for line in lines) + b"\n"


def run_pyarrow(data: bytes) -> np.ndarray:
    table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1), parse_options=pj.ParseOptions(explicit_schema=_RAW_SCHEMA, unexpected_field_behavior="ignore"))
    return _micros_to_ns(table.column("ts"))


def run_duckdb(path: str, as_json: bool) -> np.ndarray:
    import duckdb

    con = duckdb.connect(config={"threads": 1})
    struct = "STRUCT(" + ", ".join(f'"{f}" BIGINT' for f in FIELDS) + ")"
    columns = {"ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "VARCHAR", "tid": "VARCHAR", "ts": "DECIMAL(38,3)", "dur": "DECIMAL(38,3)", "args": "JSON" if as_json else struct}
    spec = "{" + ", ".join(f"'{k}': '{v}'" for k, v in columns.items()) + "}"
    select = "ph, cat, name, TRY_CAST(pid AS BIGINT) AS pid, TRY_CAST(tid AS BIGINT) AS tid, ts, dur"
    if as_json:
        select += ", " + ", ".join(f"TRY_CAST(args->>'$.\"{f}\"' AS BIGINT) AS \"a_{f}\"" for f in (*FIELDS, "Bytes"))
    else:
        select += ", args"
    table = con.sql(f"SELECT {select} FROM read_json('{path}', format = 'newline_delimited', columns = {spec})").to_arrow_table()
    return _micros_to_ns(table.column("ts"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=75.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    data = ndjson(args.mb)
    size = len(data) / 1e6
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "events.ndjson")
        with open(path, "wb") as handle:
            handle.write(data)
        engines = {
            "pyarrow.json": lambda: run_pyarrow(data),
            "duckdb read_json, args struct": lambda: run_duckdb(path, False),
            "duckdb read_json, args JSON": lambda: run_duckdb(path, True),
        }
        print(f"{size:.0f} MB of newline-delimited Kineto events, one thread per engine, load {os.getloadavg()[0]:.1f}")
        reference = None
        for _ in range(args.repeat):
            for name, run in engines.items():
                started, cpu = time.perf_counter(), time.process_time()
                ns = run()
                cpu, wall = time.process_time() - cpu, time.perf_counter() - started
                reference = ns if reference is None else reference
                same = "exact, equal" if np.array_equal(ns, reference) else "DIFFERENT"
                print(f"  {name:32s} {wall:6.2f} s wall {cpu:6.2f} CPU s  {size / cpu:6.0f} MB/s per core  ts {same}")


if __name__ == "__main__":
    main()
