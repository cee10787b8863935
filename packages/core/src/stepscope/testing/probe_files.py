"""A probe of the readers and writers by mechanism, not by case: symbolic links planted at
every level of a real job, hostile files of every kind a job holds, special files and a
full disk as outputs. Each case copies a base job (`make_base_job`: a real torch run with
a detailed trace, plus a synthetic GPU trace of a second rank and `check`'s reports),
breaks one thing and says what a reader must still do.

`run_case` runs each command line reader on it in a child process and classifies the
result: clean, escape (a file outside the job opened, created or changed: watched with
inotify, so a read through a link counts too), loss (something the damage did not touch
was not readable), traceback, hang (over the time bound). bench/bench_probe_files.py
runs them all; tests/faults/test_probe_files.py a fast part."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gzip
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HANG_S = 30.0
CANARY = b"canary: a reader left the job\n"
TRACE_DIR = "profiler-output/framework/pytorch/detailed"


# --- the base job ------------------------------------------------------------------------


def make_base_job(job: str | os.PathLike[str]) -> Path:
    """A small real job: torch training with every collection the rules read, the system
    monitor, the step timeline, one detailed window (rank 0), a synthetic GPU trace of rank
    1, `check`'s reports and the persisted trace tables."""
    import torch
    from torch import nn

    from stepscope_torch import Hook  # the plugin, where the probe runs

    from ..cli import main
    from ..config import ProfilerConfig, SaveConfig
    from ..traces.synth import SynthSpec, write_trace

    job = Path(job)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    config = ProfilerConfig(monitor_interval_ms=100, detailed_windows=[(2, 2)])  # type: ignore[arg-type]
    hook: Any
    with Hook(str(job), save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients", "losses"], profiler_config=config) as hook:
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
        for _ in range(8):
            x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
    target = job / TRACE_DIR / "rank1" / "000000000002_synth.pt.trace.json.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    write_trace(SynthSpec(steps=3, ops_per_step=6, rank=1, world_size=2), str(target))
    with contextlib.redirect_stdout(io.StringIO()):
        made = main(["check", str(job), "--quiet"]) in (0, 1) and main(["profile", str(job), "--json"]) == 0
    if not made:
        raise RuntimeError(f"the base job {job} does not read cleanly")
    return job


# --- cases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    mechanism: str  # symlink / hostile-file / output
    apply: Callable[[Path, Path], object]  # (job, outside): breaks one thing
    # Readers that may fail on this case (exit 2 naming the file) without it being a
    # loss: the damage hit what they exist to read. Others must still succeed.
    may_fail: frozenset[str] = frozenset()
    target: str | None = None  # output cases: the special file the output goes to


def _files_and_folders(job: Path, per_folder: int = 2) -> Iterator[Path]:
    """Every folder, and the first `per_folder` files of each (a step's files are alike)."""
    for dirpath, dirnames, filenames in os.walk(job):
        for name in sorted(dirnames) + sorted(filenames)[:per_folder]:
            yield Path(dirpath) / name


def _link_case(rel: str) -> Callable[[Path, Path], None]:
    def apply(job: Path, outside: Path) -> None:
        path = job / rel
        copy = outside / ("linked-" + rel.replace("/", "_"))
        shutil.move(str(path), str(copy))
        if copy.is_dir():  # a canary in every linked folder: anything read there is seen
            (copy / "canary.json").write_bytes(CANARY)
        path.symlink_to(copy)

    return apply


def symlink_cases(base: Path) -> list[Case]:
    """One case per folder and file of the base job: it is moved outside and replaced by a
    link to it. A reader must not follow the link (no read, no write through it): the
    file or folder reads as missing or refused, named, and the rest of the job stays
    readable (only readers of what was linked may fail)."""
    cases = []
    for path in _files_and_folders(base):
        rel = path.relative_to(base).as_posix()
        cases.append(Case(f"link:{rel}", "symlink", _link_case(rel), _readers_of(rel)))
    return cases


def _readers_of(rel: str) -> frozenset[str]:
    """The readers whose whole purpose a damaged `rel` may defeat."""
    if rel.startswith("profiler-output/framework/pytorch/detailed/rank1") or rel in ("profiler-output/framework/pytorch", "profiler-output/framework/pytorch/detailed"):
        return frozenset({"profile", "timeline"})  # the intact rank the profile judge looks for is what was linked
    if rel.startswith(("profiler-output/framework/pytorch", "stepscope-traces")) and rel.count("/") <= 4:
        return frozenset({"timeline"})  # every trace of a rank gone: the timeline may have nothing
    if rel in ("profiler-output", "profiler-output/framework"):
        return frozenset({"profile", "timeline"})
    if rel in ("index", "events", "collections", "collections/000000000") or rel.startswith(("index/", "events/")):
        return frozenset({"export-hdf5", "export-tb"}) if rel in ("index", "events") else frozenset()
    return frozenset()


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _first(job: Path, pattern: str) -> Path:
    found = sorted(job.glob(pattern))
    if not found:
        raise FileNotFoundError(f"{job}/{pattern}")
    return found[0]


def _gzip_of(chunks: Iterator[bytes]) -> bytes:
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [packer.compress(c) for c in chunks]
    out.append(packer.flush())
    return b"".join(out)


@functools.lru_cache(maxsize=1)
def _whitespace_bomb_bytes() -> bytes:
    # ~2 MB of gzip that inflates to 2 GiB of spaces inside the events array (made once:
    # compressing 2 GiB takes half a minute).
    def chunks() -> Iterator[bytes]:
        yield b'{"traceEvents": ['
        block = b" " * (1 << 24)
        for _ in range(128):
            yield block
        yield b"]}"

    return _gzip_of(chunks())


def _whitespace_bomb(job: Path, outside: Path) -> None:
    _write(_first(job, f"{TRACE_DIR}/rank0/*.json.gz"), _whitespace_bomb_bytes())
    _drop_tables(job)


def _event_bomb(job: Path, outside: Path) -> None:
    # ~1 MB of gzip inflating to 3.3 M identical events.
    event = b'{"ph":"X","cat":"cpu_op","name":"aten::x","pid":1,"tid":1,"ts":1.0,"dur":1.0},'

    def chunks() -> Iterator[bytes]:
        yield b'{"traceEvents": ['
        for _ in range(3300):
            yield event * 1000
        yield b'{"ph":"X","cat":"cpu_op","name":"end","pid":1,"tid":1,"ts":2.0,"dur":1.0}]}'

    _write(_first(job, f"{TRACE_DIR}/rank0/*.json.gz"), _gzip_of(chunks()))
    _drop_tables(job)


def _truncated_trace(job: Path, outside: Path) -> None:
    path = _first(job, f"{TRACE_DIR}/rank0/*.json.gz")
    path.write_bytes(path.read_bytes()[:200])
    _drop_tables(job)


def _drop_tables(job: Path) -> None:
    shutil.rmtree(job / "stepscope-traces", ignore_errors=True)


def _trace_json(job: Path, body: bytes) -> None:
    _write(_first(job, f"{TRACE_DIR}/rank0/*.json.gz"), gzip.compress(body))
    _drop_tables(job)


def _deep(n: int = 100_000) -> bytes:
    return b"[" * n + b"]" * n


def _forged_table(job: Path, outside: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _first(job, "stepscope-traces/pytorch/detailed/rank0/*.parquet")
    meta = {"version": 1, "rank": 0, "base_ns": 0, "start_ns": 0, "end_ns": 1, "metadata": {}}
    forged = pa.table({"kind": pa.array(["x"]), "evil": pa.array([1])}).replace_schema_metadata({"stepscope": json.dumps(meta)})
    pq.write_table(forged, str(table))


def _typed_table(job: Path, outside: Path) -> None:
    # The right columns, metadata of the wrong types (a rank of 1e20, NaN times).
    import pyarrow.parquet as pq

    path = _first(job, "stepscope-traces/pytorch/detailed/rank0/*.parquet")
    table = pq.read_table(str(path))
    meta = json.loads(table.schema.metadata[b"stepscope"])
    meta.update(rank=1e20, start_ns=float("nan"), base_ns="x")
    pq.write_table(table.replace_schema_metadata({"stepscope": json.dumps(meta)}), str(path))


def _timeline_file(job: Path) -> Path:
    return _first(job, "profiler-output/framework/steps/*/*.json")


def _metrics_file(job: Path) -> Path:
    return _first(job, "profiler-output/system/incremental/*/*.json")


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _step_events(**changes) -> Callable[[Path, Path], None]:
    def apply(job: Path, outside: Path) -> None:
        path = _timeline_file(job)
        body = json.loads(path.read_text())
        for event in body["traceEvents"]:
            if event.get("ph") == "X" and event.get("cat") == "step":
                event.update(changes)
                break
        path.write_text(json.dumps(body))

    return apply


def _rule_report(**changes) -> Callable[[Path, Path], None]:
    def apply(job: Path, outside: Path) -> None:
        path = job / "rule-output" / "StepOutlier.json"
        body = json.loads(path.read_text())
        body.update(changes)
        path.write_text(json.dumps(body))

    return apply


def hostile_file_cases() -> list[Case]:
    """One case per kind of hostile content, in every kind of file a job holds."""
    trace_readers: frozenset[str] = frozenset()  # one bad trace: the other rank's trace still reads
    cases = [
        Case("trace:gzip-of-2GiB-whitespace", "hostile-file", _whitespace_bomb, trace_readers),
        Case("trace:gzip-of-3.3M-events", "hostile-file", _event_bomb, trace_readers),
        Case("trace:deep-nesting", "hostile-file", lambda j, o: _trace_json(j, b'{"traceEvents": [' + _deep() + b"]}"), trace_readers),
        Case("trace:deep-metadata", "hostile-file", lambda j, o: _trace_json(j, b'{"deviceProperties": ' + _deep() + b', "traceEvents": []}'), trace_readers),
        Case("trace:not-utf8-name", "hostile-file", lambda j, o: _trace_json(j, b'{"traceEvents": [{"ph":"X","cat":"kernel","name":"\xff\xfe\x80","pid":1,"tid":7,"ts":1,"dur":2}]}'), trace_readers),
        Case("trace:quote-in-name", "hostile-file", lambda j, o: _trace_json(j, b'{"traceEvents": [{"ph":"X","cat":"user_annotation","name":"a"b","pid":1,"tid":1,"ts":1,"dur":2},{"ph":"X","cat":"cpu_op","name":"ok","pid":1,"tid":1,"ts":3,"dur":2}]}'), trace_readers),
        Case("trace:rank-1e20", "hostile-file", lambda j, o: _trace_json(j, b'{"distributedInfo": {"rank": 1e20}, "traceEvents": [{"ph":"X","cat":"cpu_op","name":"x","pid":1,"tid":1,"ts":1,"dur":2}]}'), trace_readers),
        Case("trace:nan-and-huge-times", "hostile-file", lambda j, o: _trace_json(j, b'{"traceEvents": [{"ph":"X","cat":"cpu_op","name":"x","pid":1,"tid":1,"ts":NaN,"dur":1e300},{"ph":"X","cat":"kernel","name":"k","pid":1,"tid":7,"ts":1e30,"dur":-1}]}'), trace_readers),
        Case("trace:truncated-gzip", "hostile-file", _truncated_trace, trace_readers),
        Case("trace:not-a-trace", "hostile-file", lambda j, o: _trace_json(j, b"[1, 2, 3"), trace_readers),
        Case("table:forged-schema", "hostile-file", _forged_table),
        Case("table:typed-metadata", "hostile-file", _typed_table),
        Case("table:garbage", "hostile-file", lambda j, o: _first(j, "stepscope-traces/pytorch/detailed/rank0/*.parquet").write_bytes(b"PAR1" + os.urandom(500) + b"PAR1")),
        Case("step-timeline:nan-times", "hostile-file", _step_events(ts=float("nan"), dur=float("nan"))),
        Case("step-timeline:huge-times", "hostile-file", _step_events(ts=1e300, dur=1e300)),
        Case("step-timeline:negative-huge", "hostile-file", _step_events(ts=-1e20, dur=-5)),
        Case("step-timeline:step-not-int", "hostile-file", _step_events(args={"step": 1.5e20, "mode": "TRAIN", "phase": "step"})),
        Case("step-timeline:deep", "hostile-file", lambda j, o: _timeline_file(j).write_bytes(b'{"traceEvents": ' + _deep() + b"}")),
        Case("step-timeline:gzip-bomb-named-json", "hostile-file", lambda j, o: _timeline_file(j).write_bytes(_gzip_of(iter([b" " * (1 << 24)] * 64)))),
        Case("metrics:deep-line", "hostile-file", lambda j, o: _append(_metrics_file(j), _deep() + b"\n")),
        Case("metrics:nan-values", "hostile-file", lambda j, o: _append(_metrics_file(j), b'{"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtilization", "Value": NaN, "NodeId": "vm", "Timestamp": 1e300}\n')),
        Case("metrics:huge-line", "hostile-file", lambda j, o: _append(_metrics_file(j), b'{"Name": "' + b"x" * (64 << 20) + b'"}\n')),
        Case("metrics:not-utf8", "hostile-file", lambda j, o: _append(_metrics_file(j), b'{"Type": "cpu", "Name": "\xff\xfe", "Dimension": "CPUUtilization", "Value": 1, "NodeId": "vm", "Timestamp": 1}\n')),
        Case("cost:deep", "hostile-file", lambda j, o: _first(j, "stepscope-cost/*.json").write_bytes(_deep())),
        Case("cost:typed", "hostile-file", lambda j, o: _first(j, "stepscope-cost/*.json").write_text('{"worker": 5, "steps": "many", "step_s": NaN, "samples": [[1e20, "x", null]], "bytes_written": -1}')),
        Case("rule-output:deep", "hostile-file", lambda j, o: (j / "rule-output" / "StepOutlier.json").write_bytes(b'{"rule": "StepOutlier", "details": ' + _deep() + b"}")),
        Case("rule-output:violations-text", "hostile-file", _rule_report(violations="many", fired=True, fired_steps=["x", 1e20])),
        Case("rule-output:violations-float", "hostile-file", _rule_report(violations=1.5, fired="yes", first_step=1e20)),
        Case("rule-output:summary-deep", "hostile-file", lambda j, o: (j / "rule-output" / "summary.json").write_bytes(_deep())),
        Case("status:typed", "hostile-file", lambda j, o: _write(j / "stepscope-status" / "worker_0.json", b'{"state": 5, "lost_steps": [1e20, "x"], "reason": {"a": []}}')),
        Case("end-marker:deep", "hostile-file", lambda j, o: (j / "training_job_end.ts").write_bytes(_deep())),
        Case("collections:not-utf8", "hostile-file", lambda j, o: _first(j, "collections/000000000/*.json").write_bytes(b'{"collections": {"\xff": {"name": "\xfe"}}}')),
        Case("index:nan-shape", "hostile-file", lambda j, o: _index_edit(j, lambda b: b.__setitem__("shape_payload", [{"tensorname": "x", "shape": [float("nan")]}]))),
        Case("index:count-float", "hostile-file", lambda j, o: _index_edit(j, lambda b: b["tensor_payload"][0].__setitem__("length", 1.5))),
        Case("folder:1400-deep", "hostile-file", _deep_folders),
        Case("folder:fifo-everywhere", "hostile-file", _fifos),
    ]
    return cases


def _index_edit(job: Path, edit: Callable[[dict], None]) -> None:
    path = _first(job, "index/*/000000000003_*.json")
    body = json.loads(path.read_text())
    edit(body)
    path.write_text(json.dumps(body))
    shutil.rmtree(job / "stepscope-index", ignore_errors=True)  # so the index file is read


def _deep_folders(job: Path, outside: Path) -> None:
    for top in ("profiler-output/framework/pytorch/detailed", "rule-output", "index"):
        fd = os.open(str(job / top), os.O_RDONLY)
        try:
            for _ in range(1400):
                os.mkdir("d", dir_fd=fd)
                child = os.open("d", os.O_RDONLY, dir_fd=fd)
                os.close(fd)
                fd = child
            with open(os.open("x.json", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "wb") as f:
                f.write(b"{}")
        finally:
            os.close(fd)


def _fifos(job: Path, outside: Path) -> None:
    for rel in ("rule-output/Fifo.json", f"{TRACE_DIR}/rank0/000000000009_fifo.pt.trace.json", "stepscope-cost/worker_1.json", "profiler-output/system/incremental/fifo.json"):
        (job / rel).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(job / rel)


def output_cases() -> list[Case]:
    """Outputs aimed at what is not a regular file; the full disk is `full_disk_cases`."""
    return [Case(f"output:{kind}", "output", lambda j, o: None, target=kind) for kind in ("symlink", "fifo", "device", "folder", "dangling-symlink")]


def all_cases(base: Path) -> list[Case]:
    return symlink_cases(base) + hostile_file_cases() + output_cases()


# --- readers -----------------------------------------------------------------------------

# name -> the command line (after `stepscope`), given the job and a scratch folder.
READERS: dict[str, Callable[[Path, Path], list[str]]] = {
    "check": lambda job, out: ["check", str(job), "--quiet"],
    "report": lambda job, out: ["report", str(job), "-o", str(out / "report.html"), "--rules", "auto", "--no-progress"],
    "profile": lambda job, out: ["profile", str(job), "--json"],
    "timeline": lambda job, out: ["timeline", str(job), "-o", str(out / "timeline.json")],
    "export-hdf5": lambda job, out: ["export", str(job), "--hdf5", str(out / "job.h5"), "--no-progress"],
    "export-tb": lambda job, out: ["export", str(job), "--tensorboard", str(out / "tb"), "--no-progress"],
}
OUTPUT_READERS = {"report": "report.html", "timeline": "timeline.json", "export-hdf5": "job.h5"}


@dataclass
class Outcome:
    case: str
    reader: str
    verdict: str  # clean / escape / loss / traceback / hang
    seconds: float
    detail: str = ""
    touched: list[str] = field(default_factory=list)


class _Inotify:
    """What happens under a folder tree (Linux inotify through ctypes): any file opened,
    created, written, moved or deleted there."""

    _MASK = 0x20 | 0x2 | 0x100 | 0x200 | 0x80 | 0x40 | 0x8  # OPEN MODIFY CREATE DELETE MOVED_TO MOVED_FROM CLOSE_WRITE

    def __init__(self, top: Path):
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.watches: dict[int, str] = {}
        for dirpath, _dirnames, _filenames in os.walk(top):
            wd = self._libc.inotify_add_watch(self.fd, dirpath.encode(), self._MASK)
            if wd >= 0:
                self.watches[wd] = dirpath

    def events(self) -> list[str]:
        seen: list[str] = []
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return seen
            at = 0
            while at < len(data):
                wd, mask, _cookie, length = struct.unpack_from("iIII", data, at)
                name = data[at + 16 : at + 16 + length].rstrip(b"\0").decode(errors="replace")
                at += 16 + length
                if mask & 0x40000000 and mask & 0x20:  # IN_ISDIR | IN_OPEN: a listing, not a read
                    continue
                seen.append(f"{self.watches.get(wd, '?')}/{name}")

    def close(self) -> None:
        os.close(self.fd)


# The command line, reporting its own CPU seconds (all threads) on the way out.
_CHILD = (
    "import atexit, os, resource, sys\n"
    "def _cpu():\n"
    "    r = resource.getrusage(resource.RUSAGE_SELF)\n"
    "    os.write(2, b'\\nPROBE_CPU %.3f\\n' % (r.ru_utime + r.ru_stime))\n"
    "atexit.register(_cpu)\n"
    "from stepscope.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
_CPU_LINE = re.compile(r"\nPROBE_CPU ([0-9.]+)\n")


def _prepare_target(kind: str, out: Path, name: str, outside: Path) -> Path:
    target = out / name
    if kind == "symlink":
        (outside / "victim").write_bytes(CANARY)
        target.symlink_to(outside / "victim")
    elif kind == "dangling-symlink":
        target.symlink_to(outside / "created-through-a-link")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    elif kind == "device":
        target = Path("/dev/null")
    return target


def run_case(case: Case, base: Path, scratch: Path, readers: list[str] | None = None, hang_s: float = HANG_S) -> list[Outcome]:
    """Copy the base job, apply the case, run every reader on it; an Outcome per reader."""
    outcomes = []
    for reader in readers or list(READERS):
        if case.mechanism == "output" and reader not in OUTPUT_READERS:
            continue
        work = scratch / f"{abs(hash((case.name, reader))):x}"
        if work.exists():
            _remove(work)
        job, outside, out = work / "job", work / "outside", work / "out"
        shutil.copytree(base, job, symlinks=True)
        outside.mkdir()
        out.mkdir()
        (outside / "canary.json").write_bytes(CANARY)
        case.apply(job, outside)
        argv = READERS[reader](job, out)
        before = None
        if case.target is not None:
            target = _prepare_target(case.target, out, OUTPUT_READERS[reader], outside)
            argv = [str(target) if a == str(out / OUTPUT_READERS[reader]) else a for a in argv]
            before = os.lstat(target)
        watch = _Inotify(outside)
        started = time.monotonic()
        try:
            # Killed at twice the bound of wall time; judged by its CPU time, which a
            # loaded machine does not inflate.
            done = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, timeout=2 * hang_s, errors="replace")
        except subprocess.TimeoutExpired:
            outcomes.append(Outcome(case.name, reader, "hang", time.monotonic() - started, f"killed after {2 * hang_s:.0f} s"))
            watch.close()
            _remove(work)
            continue
        touched = watch.events()
        watch.close()
        cpu = _CPU_LINE.search(done.stderr)
        seconds = float(cpu.group(1)) if cpu else time.monotonic() - started
        done.stderr = _CPU_LINE.sub("", done.stderr)
        if seconds > hang_s:
            outcomes.append(Outcome(case.name, reader, "hang", seconds, f"{seconds:.0f} s of CPU"))
        else:
            outcomes.append(_judge(case, reader, done, seconds, touched, out, before))
        _remove(work)
    return outcomes


def _judge(case: Case, reader: str, done: subprocess.CompletedProcess, seconds: float, touched: list[str], out: Path, before: os.stat_result | None) -> Outcome:
    text = done.stdout[-2000:] + done.stderr[-4000:]
    if touched:
        return Outcome(case.name, reader, "escape", seconds, text[-600:], touched[:5])
    if "Traceback" in done.stderr or done.returncode not in (0, 1, 2):
        return Outcome(case.name, reader, "traceback", seconds, f"exit {done.returncode}: {done.stderr[-1500:]}")
    if case.target is not None:
        target_path = Path("/dev/null") if case.target == "device" else out / OUTPUT_READERS[reader]
        after = os.lstat(target_path)
        assert before is not None
        if done.returncode != 2 or (after.st_mode, after.st_ino) != (before.st_mode, before.st_ino):
            return Outcome(case.name, reader, "escape", seconds, f"exit {done.returncode}; the target was replaced or written: {text[-400:]}")
        if any(n.endswith((".tmp", ".partial")) for n in os.listdir(out)):
            return Outcome(case.name, reader, "loss", seconds, "a temporary was left behind")
        return Outcome(case.name, reader, "clean", seconds)
    if done.returncode == 2 and reader not in case.may_fail and reader != "check":
        return Outcome(case.name, reader, "loss", seconds, f"one damaged file made the whole command fail: {done.stderr[-600:]}")
    if reader == "profile" and done.returncode == 0 and "profile" not in case.may_fail:
        try:
            ranks = {row["rank"] for row in json.loads(done.stdout)["traces"]}
        except (ValueError, KeyError, TypeError):
            return Outcome(case.name, reader, "loss", seconds, f"unreadable output: {done.stdout[:300]}")
        if 1 not in ranks:
            return Outcome(case.name, reader, "loss", seconds, f"the intact trace of rank 1 is missing (ranks {sorted(ranks)})")
    return Outcome(case.name, reader, "clean", seconds, text[-300:] if done.returncode else "")


def _remove(path: Path) -> None:
    # `rm -rf` (fts) removes a 1,400-deep chain that shutil.rmtree cannot (recursion).
    subprocess.run(["rm", "-rf", str(path)], check=False)


__all__ = ["Case", "Outcome", "READERS", "make_base_job", "all_cases", "symlink_cases", "hostile_file_cases", "output_cases", "run_case", "HANG_S"]
