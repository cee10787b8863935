"""Check stepscope's memory analyses end to end on a machine with a CUDA GPU. Prints one
line per check; exits 1 when a check fails, 2 when there is no GPU.

    python scripts/check_memory_gpu.py                 # temporary folder
    python scripts/check_memory_gpu.py --out /tmp/memcheck

1. Allocator events in a real Kineto trace (profile_memory=True through stepscope's torch
   window): the `cuda:0` rows of memory_steps, whose highest peak must equal
   torch.cuda.max_memory_allocated() over the steady-state steps (reset after the first);
   the same window with memory_history=True publishes an allocator snapshot whose history
   peaks at the same bytes.
2. A real allocator snapshot (`_record_memory_history` + `_dump_snapshot`, in a
   subprocess): AllocatorSnapshot's reserved / allocated equal torch.cuda's
   memory_reserved() / memory_allocated() at the dump, its live bytes by user frame name
   this script's lines, and the history's peak equals max_memory_allocated().
3. A real OOM in a subprocess: a loop that allocates until CUDA runs out, with the history
   recorded and the snapshot dumped in the `except torch.cuda.OutOfMemoryError`: the
   snapshot has an `oom` entry whose size is the failed request (the exception message
   names it) and whose user frame is this script's allocating line.
4. The streamed reader (stepscope.traces.snapshot_stream) gives the in-memory reader's
   summary and peak on the real snapshots of 2 and 3.
5. The black box a hook installs by itself, in a subprocess: a plain loop with a Hook (no
   `black_box` wrapping) runs out of CUDA memory with the history recorded; the process
   exits 1 with the traceback, and stepscope-blackbox/worker_0/ holds reason `oom`, the
   device's allocator counts (num_ooms >= 1) and the allocator snapshot.
6. On demand: `hook.snapshot_memory()` in a real loop writes a snapshot whose reserved
   bytes equal torch.cuda.memory_reserved() at the call."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [str(ROOT / "packages" / package / "src") for package in ("core", "torch_plugin")]
sys.path[:0] = SOURCES
# The children that import stepscope find it where this script does.
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([*SOURCES, os.environ.get("PYTHONPATH", "")])}

_SNAPSHOT_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    torch.cuda.memory._record_memory_history(max_entries=100000)
    torch.cuda.reset_peak_memory_stats()
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    kept = []
    for step in range(4):
        x = torch.randn(256, 1024, device="cuda")
        out = model(x)                      # CHECK-FORWARD
        kept.append(out.detach())           # a leak: every step's output stays
        out.sum().backward()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(sys.argv[1])
    print(json.dumps({"reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(), "peak": torch.cuda.max_memory_allocated()}))
    """
)

_OOM_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    torch.cuda.memory._record_memory_history(max_entries=100000)
    blocks = []
    try:
        while True:
            blocks.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))  # CHECK-OOM
    except torch.cuda.OutOfMemoryError as error:
        torch.cuda.memory._dump_snapshot(sys.argv[1])
        print(json.dumps({"message": str(error).splitlines()[0], "blocks": len(blocks)}))
    """
)

_BLACKBOX_CHILD = textwrap.dedent(
    """
    import sys, torch
    from stepscope.config import ProfilerConfig
    from stepscope_torch import Hook
    torch.cuda.memory._record_memory_history(max_entries=20000)
    model = torch.nn.Linear(1024, 1024).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = Hook(sys.argv[1], profiler_config=ProfilerConfig(system_monitor=False))
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    blocks = []
    for step in range(100000):
        loss = model(torch.randn(64, 1024, device="cuda")).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        blocks.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))  # CHECK-BLACKBOX-OOM
    """
)

_ON_DEMAND_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    from stepscope.config import ProfilerConfig
    from stepscope_torch import Hook
    model = torch.nn.Linear(1024, 1024).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = Hook(sys.argv[1], profiler_config=ProfilerConfig(system_monitor=False))
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    for step in range(4):
        loss = model(torch.randn(64, 1024, device="cuda")).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    key = hook.snapshot_memory()
    hook.close()
    print(json.dumps({"key": key, "reserved": reserved}))
    """
)


class Checks:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def __call__(self, ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            self.failures.append(what)


def _child(source: str, out: Path, name: str) -> dict:
    script = out / f"{name}.py"
    script.write_text(source)
    done = subprocess.run([sys.executable, str(script), str(out / f"{name}.pickle")], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_trace(out: Path, check: Checks) -> None:
    import torch

    from stepscope.config import ProfilerConfig
    from stepscope.store import open_store
    from stepscope.traces import TraceAnalysis
    from stepscope_torch.profiling import create_profiling

    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    profiling = create_profiling(ProfilerConfig(detailed_windows=[(2, 3)], memory_history=True), open_store(str(out / "job")))
    assert profiling is not None
    for step in range(6):
        if step == 1:  # after Adam made its state: every later step has the same peak
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        profiling.step_started(step)
        loss = model(torch.randn(512, 512, device="cuda")).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        profiling.step_ended(step)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    profiling.close()
    steps = TraceAnalysis(out / "job").memory_steps()
    gpu = steps[steps["device"] == "cuda:0"]
    print(gpu.to_string(index=False))
    check(len(gpu) >= 2 and set(gpu["step"]) <= {2, 3, 4}, "memory_steps has the window's recorded steps on cuda:0")
    check(int(gpu["peak_allocated"].max()) == peak, f"trace peak {int(gpu['peak_allocated'].max()):,} == max_memory_allocated {peak:,}")
    check(bool((gpu["peak_reserved"] >= gpu["peak_allocated"]).all()), "reserved >= allocated at every step")
    from stepscope.traces.snapshot import AllocatorSnapshot

    snapshots = sorted((out / "job").glob("profiler-output/framework/pytorch/memory/rank0/*.pickle.gz"))
    check(len(snapshots) == 1, "memory_history=True published the window's allocator snapshot")
    if snapshots:
        snap = AllocatorSnapshot.load(snapshots[0])
        at, _ = snap.peak(0)
        check(int(snap.summary().set_index("device").loc[0, "trace_entries"]) > 0, "the window's snapshot holds the allocator's history")
        check(at["allocated"] == peak, f"the window snapshot's history peak {at['allocated']:,} == max_memory_allocated {peak:,}")


def check_snapshot(out: Path, check: Checks) -> None:
    from stepscope.traces.snapshot import AllocatorSnapshot

    expected = _child(_SNAPSHOT_CHILD, out, "snapshot")
    snap = AllocatorSnapshot.load(out / "snapshot.pickle")
    summary = snap.summary().set_index("device").loc[0]
    print(snap.summary().to_string(index=False))
    print(snap.by_frame(0, k=5).to_string(index=False))
    check(int(summary["reserved"]) == expected["reserved"], f"reserved {int(summary['reserved']):,} == memory_reserved {expected['reserved']:,}")
    check(int(summary["allocated"]) == expected["allocated"], f"allocated {int(summary['allocated']):,} == memory_allocated {expected['allocated']:,}")
    frames = snap.by_frame(0, k=None)
    check(bool(frames["frame"].str.contains("snapshot.py").any()), "live bytes are attributed to this script's lines")
    at, _ = snap.peak(0)
    check(at["allocated"] == expected["peak"], f"history peak {at['allocated']:,} == max_memory_allocated {expected['peak']:,}")


def check_oom(out: Path, check: Checks) -> None:
    from stepscope.traces.snapshot import AllocatorSnapshot

    expected = _child(_OOM_CHILD, out, "oom")
    snap = AllocatorSnapshot.load(out / "oom.pickle")
    summary = snap.summary().set_index("device").loc[0]
    window = snap.around(0, count=3)
    print(expected["message"])
    print(window.drop(columns="stack").to_string(index=False))
    check(int(summary["ooms"]) >= 1, "the snapshot holds the OOM")
    check(int(summary["oom_request"]) == 1 << 30, f"the OOM's request {int(summary['oom_request']):,} is the 1 GiB asked for")
    check(window["action"].iloc[-1] == "oom" and "oom.py" in window["frame"].iloc[-1], "the entries around the OOM end with it, at this script's line")


def check_streamed(out: Path, check: Checks) -> None:
    from stepscope.traces.snapshot import AllocatorSnapshot
    from stepscope.traces.snapshot_stream import summarize

    for name in ("snapshot", "oom"):
        path = out / f"{name}.pickle"
        if not path.exists():
            check(False, f"{name}.pickle was not written (its check failed above)")
            continue
        whole, streamed = AllocatorSnapshot.load(path), summarize(path)
        same = whole.summary().astype(str).equals(streamed.summary.astype(str))
        check(same, f"{name}: the streamed summary equals the in-memory one")
        check(whole.peak(0)[0] == streamed.peak(0)[0], f"{name}: the streamed peak {streamed.peak(0)[0]} equals the in-memory one")


def check_black_box(out: Path, check: Checks) -> None:
    script = out / "blackbox_loop.py"
    script.write_text(_BLACKBOX_CHILD)
    job = out / "blackbox_job"
    done = subprocess.run([sys.executable, str(script), str(job)], capture_output=True, text=True, timeout=600, env=CHILD_ENV)
    check(done.returncode == 1 and "OutOfMemoryError" in done.stderr, f"the OOM propagated (exit {done.returncode}, traceback printed)")
    record_path = job / "stepscope-blackbox" / "worker_0" / "record.json"
    check(record_path.exists(), "the hook's own black box wrote record.json")
    if record_path.exists():
        record = json.loads(record_path.read_text())
        device = (record.get("devices") or [{}])[0]
        check(record["reason"] == "oom" and device.get("num_ooms", 0) >= 1, f"reason {record['reason']}, num_ooms {device.get('num_ooms')}")
        check("snapshot.pickle.gz" in record.get("attachments", []), f"the allocator snapshot is attached ({record.get('attachments')})")


def check_on_demand(out: Path, check: Checks) -> None:
    from stepscope.traces.snapshot import AllocatorSnapshot

    job = out / "on_demand_job"
    script = out / "on_demand.py"
    script.write_text(_ON_DEMAND_CHILD)
    done = subprocess.run([sys.executable, str(script), str(job)], capture_output=True, text=True, timeout=600, env=CHILD_ENV)
    if done.returncode != 0:
        raise RuntimeError(f"on_demand failed: {done.stderr[-2000:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    check(answer["key"] is not None, f"snapshot_memory() wrote {answer['key']}")
    if answer["key"]:
        reserved = int(AllocatorSnapshot.load(job / answer["key"]).summary().set_index("device").loc[0, "reserved"])
        check(reserved == answer["reserved"], f"its reserved {reserved:,} == memory_reserved {answer['reserved']:,}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check")
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="stepscope-memcheck-"))
    out.mkdir(parents=True, exist_ok=True)
    check = Checks()
    for part in (check_trace, check_snapshot, check_oom, check_streamed, check_black_box, check_on_demand):
        try:
            part(out, check)
        except Exception as exc:  # one part failing must not hide the others' results
            check(False, f"{part.__name__}: {type(exc).__name__}: {exc}")
    print(f"{len(check.failures)} failed" if check.failures else "all passed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
