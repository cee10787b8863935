"""Weights + gradients every 10 steps, as smdebug users write it (no register_optimizer),
stepscope against smdebug 1.0.34, side by side in one run: each in its own interpreter
(smdebug in a virtualenv of its own), each timing its plain loop against its hooked loop
in interleaved blocks (medians). A hooked block ends when the tool has written what the
block saved: stepscope's writer threads are waited for at the block's end (smdebug closes
each step's event file at the next step's start), so no block's writing is counted in the
next block, which may be a plain one. Prints each one's added time per step, the ratio of the
two (goal: stepscope adds at most one third of what smdebug adds), and the bytes per
second each wrote while training. Two configurations: training on one thread (a core left
for stepscope's writer), then on every core (`--threads`, default: all of them), where
nothing is spare, with the byte-cost limit: the same loop beside them with only the bytes
done (`Floor`: copy each weight and gradient out on the training thread, CRC-32C and write
them to a new file on a thread of its own), whose added time is what the bytes cost under the
same contention (goal: stepscope's added time within 1.3x of it), and the same with the
file system's part of smdebug's layout added (`Floor(layout=True)`: a folder, an event file
and an index file per save, each published by a rename; smdebug's reader needs them), what
any tool that keeps that layout cannot go below. The comparison with the floors is printed
twice: from the medians of all blocks, and paired (each round's block less the plain block of
the same round, median over the rounds), which leaves out the machine's drift within a run
(on this VM more than the floor adds). Last,
everything at every step (save_all) on every core (goal: at most a quarter of what smdebug
adds). On every core each tool runs four times by default (`--core-rounds`), and each run's
hooked loop over its plain one is printed with the spread between runs (range over median;
goal: stepscope's no wider than smdebug's); the `spread %` column is the spread of the hooked
blocks within the runs. Each configuration also prints the write requests per save that
reached the job's block device in each variant's blocks (Linux, /sys/dev/block): each
request is an interrupt on the core the device's interrupts go to, time that shows in no
thread's CPU (on the development VM: stepscope's direct write 3-4, the floors' about 1,
from how scattered the buffers' pages are in physical memory). Run it when nothing has been deleted on the temporary folder's file system for six
minutes: on ext4 without a journal, files made near recently deleted ones cost several times
their usual CPU (see AGE_S), for both tools, more for whichever makes more files. A run
started within six minutes of a bench's removing its jobs waits for the rest
(bench/_quiet.py; `--no-wait`: it says so and starts).

    python bench/bench_vs_smdebug.py --quick
    python bench/bench_vs_smdebug.py --smdebug-python ../smdebug-venv/bin/python

The smdebug environment (outside the repository): `python -m venv ../smdebug-venv &&
../smdebug-venv/bin/pip install smdebug==1.0.34 protobuf==3.20.3 torch==2.13.0 "numpy<2"
"pandas<2.3" psutil requests` (smdebug 1.0.34 needs numpy 1's `tostring`, and imports pandas and
psutil without declaring them). Without one, only stepscope's numbers are printed.
stepscope runs with its profiler side off (smdebug's default has none)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _quiet import QUIET_S, mark_removed, wait_for_quiet  # (this folder is the script's)

# Runs in either interpreter: `python -c WORKER impl model steps out_dir`.
WORKER = r'''
import json, mmap, os, queue, statistics, sys, threading, time
import torch
from torch import nn

impl, kind, blocks, out, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
floors = sys.argv[6:]  # "floor" (the bytes), "floor+layout" (and smdebug's files)
# "mlp-all": the MLP with everything saved at every step (save_all), else weights and gradients every 10 steps.
kind, save_all = kind.split("-")[0], kind.endswith("-all")
torch.set_num_threads(threads)
BLOCK = 20

def _device_stat():
    # The block device's I/O counters for the job's folder (a partition's or a disk's):
    # each completed write request is an interrupt on the core the device's interrupts go
    # to, time that is no thread's CPU. None where there is no such file (not Linux, a
    # virtual file system).
    try:
        st = os.stat(os.path.dirname(out) or ".")
        path = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
        int(open(path).read().split()[4])
        return path
    except (OSError, ValueError, IndexError):
        return None

DEVICE_STAT = _device_stat()

def write_requests():
    if DEVICE_STAT is None:
        return 0
    with open(DEVICE_STAT) as f:
        return int(f.read().split()[4])

def model_and_batch():
    torch.manual_seed(0)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)), (64, 256)
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 7 * 7, 10)), (64, 1, 28, 28)

class Floor:
    """The bytes and nothing else: at every 10th step (before the optimizer's step, as the
    hooks see them) each weight and gradient is copied on the training thread into one of two
    page-aligned buffers (private memory in huge pages where the kernel gives them); a thread
    of its own takes their CRC-32C and writes the buffer to a new file with O_DIRECT (the
    cheapest write of new data this file system has: through the page cache costs several
    times its CPU). What a tool that keeps each save cannot do
    without, measured on the same loop and cores as the tools. With `layout`, also the file
    system's part of smdebug's layout, as any tool that keeps it and publishes whole files
    does: the step's own folder, the event file written under a temporary name and renamed,
    and a small index file (600 bytes) likewise in the index folder."""

    def __init__(self, out, layout=False):
        os.makedirs(out)
        self.out, self.step, self.buffers, self.todo, self.layout = out, 0, queue.Queue(), queue.Queue(), layout
        self.sizes = None
        threading.Thread(target=self.write, daemon=True).start()

    def register_module(self, model):
        self.model = model

    def register_loss(self, loss_fn):
        pass

    def attach(self, optimizer):
        optimizer.register_step_pre_hook(lambda *_: self.save())

    def save(self):
        step, self.step = self.step, self.step + 1
        if step % 10:
            return
        tensors = [p.detach() for p in self.model.parameters()] + [p.grad for p in self.model.parameters()]
        if self.sizes is None:
            self.sizes = [t.numel() * t.element_size() for t in tensors]
            size = -(-sum(self.sizes) // 4096) * 4096
            for _ in range(2):
                # Private memory in huge pages where the kernel gives them (as stepscope's
                # buffers for the device are): a direct write then pins fewer pages.
                buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                if hasattr(mmap, "MADV_HUGEPAGE"):
                    buffer.madvise(mmap.MADV_HUGEPAGE)
                self.buffers.put(buffer)
        buffer = self.buffers.get()
        view, at = torch.frombuffer(buffer, dtype=torch.uint8), 0
        for t, n in zip(tensors, self.sizes):
            view[at:at + n].view(t.dtype).view(t.shape).copy_(t)
            at += n
        self.todo.put((step, buffer))

    def write(self):
        import crc32c
        while True:
            step, buffer = self.todo.get()
            try:
                at = 0
                for n in self.sizes:
                    crc32c.crc32c(memoryview(buffer)[at:at + n])
                    at += n
                self.publish(step, buffer)
            finally:
                self.buffers.put(buffer)
                self.todo.task_done()

    def publish(self, step, buffer):
        path = final = os.path.join(self.out, f"{step}.bin")
        if self.layout:
            folder = os.path.join(self.out, "events", f"{step:012d}")
            os.makedirs(folder)
            final = os.path.join(folder, f"{step:012d}_worker_0.tfevents")
            path = os.path.join(folder, f".{step:012d}_worker_0.tfevents.tmp")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_DIRECT", 0))
        except OSError:  # a file system without direct writes (tmpfs)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            os.write(fd, buffer)
        finally:
            os.close(fd)
        if self.layout:
            os.rename(path, final)
            index = os.path.join(self.out, "index", f"{step // 1000:09d}")
            os.makedirs(index, exist_ok=True)
            tmp = os.path.join(index, f".{step:012d}_worker_0.json.tmp")
            with open(tmp, "wb") as f:
                f.write(b"i" * 600)
            os.rename(tmp, os.path.join(index, f"{step:012d}_worker_0.json"))

    def flush(self):
        self.todo.join()


def make_hook():
    if impl == "stepscope":
        from stepscope.config import ProfilerConfig, SaveConfig
        from stepscope_torch import Hook
        if save_all:
            return Hook(out, save_config=SaveConfig(save_interval=1), save_all=True, profiler_config=ProfilerConfig.disabled())
        return Hook(out, save_config=SaveConfig(save_interval=10), include_collections=["weights", "gradients"],
                    profiler_config=ProfilerConfig.disabled())
    import smdebug.pytorch as smd
    if save_all:
        return smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=1), save_all=True)
    return smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=10), include_collections=["weights", "gradients"])

class Loop:
    def __init__(self, hook=None):
        self.model, shape = model_and_batch()
        self.loss_fn = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(1)
        self.batches = [(torch.randn(*shape, generator=g), torch.randint(0, 10, (shape[0],), generator=g)) for _ in range(4)]
        self.i = 0
        # stepscope writes on threads of its own: the block ends when they have written what
        # it handed over, or the rest would land in the next block (a plain one, on every
        # core). smdebug closes its event file at the next step's start, inside the block.
        self.drain = None
        if isinstance(hook, Floor):
            hook.attach(self.optimizer)
            self.drain = hook.flush
        elif impl == "stepscope" and hook is not None:
            self.drain = hook._runtime.writer.flush
        if hook is not None:
            hook.register_module(self.model)
            hook.register_loss(self.loss_fn)
    def run(self, n):
        requests = write_requests()
        start, self.cpu, self.all_cpu = time.perf_counter(), time.thread_time(), time.process_time()
        for _ in range(n):
            x, y = self.batches[self.i % 4]
            self.i += 1
            self.optimizer.zero_grad()
            self.loss_fn(self.model(x), y).backward()
            self.optimizer.step()
        if self.drain is not None:
            self.drain()
        self.cpu, self.all_cpu = (time.thread_time() - self.cpu) / n, (time.process_time() - self.all_cpu) / n
        elapsed = (time.perf_counter() - start) / n
        self.requests = (write_requests() - requests) / n
        return elapsed

hook = make_hook()
loops = {"plain": Loop(), "hooked": Loop(hook)}
for name in floors:  # the floors in this process: their blocks between the others, on the same loop
    loops[name] = Loop(Floor(f"{out}-{name}", layout=name == "floor+layout"))
for loop in loops.values():
    loop.run(2 * BLOCK)
times = {name: [] for name in loops}
# CPU seconds per step: the training thread's, and the whole process's (every thread:
# torch's, the writer's), which load on the machine changes less than the time.
cpu = {name: [] for name in loops}
all_cpu = {name: [] for name in loops}
requests = {name: [] for name in loops}  # the device's write requests per step, each block's
hooked_s = 0.0
names = list(loops)
for b in range(blocks):
    # Each block of blocks in another order: (plain, hooked), (hooked, plain); with the
    # floor, its three rotations.
    order = names[b % len(names):] + names[:b % len(names)] if len(names) > 2 else (names if b % 2 == 0 else names[::-1])
    for name in order:
        t = loops[name].run(BLOCK)
        times[name].append(t)
        cpu[name].append(loops[name].cpu)
        all_cpu[name].append(loops[name].all_cpu)
        requests[name].append(loops[name].requests)
        if name == "hooked":
            hooked_s += t * BLOCK
close = time.perf_counter()
hook.close() if hasattr(hook, "close") else None
close = time.perf_counter() - close
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)

print(json.dumps({"plain": statistics.median(times["plain"]), "hooked": statistics.median(times["hooked"]),
                  "train_cpu_added": statistics.median(cpu["hooked"]) - statistics.median(cpu["plain"]),
                  "all_cpu_added": statistics.median(all_cpu["hooked"]) - statistics.median(all_cpu["plain"]),
                  "hooked_blocks": times["hooked"], "plain_blocks": times["plain"],
                  "bytes": size, "hooked_s": hooked_s, "close_s": close,
                  "requests": {name: statistics.mean(r) for name, r in requests.items()} if DEVICE_STAT else None,
                  "floors": {name: {"blocks": times[name], "train_cpu_added": statistics.median(cpu[name]) - statistics.median(cpu["plain"]),
                                    "all_cpu_added": statistics.median(all_cpu[name]) - statistics.median(all_cpu["plain"])} for name in floors}}))
'''


FLOORS = ("floor", "floor+layout")


def run_worker(python: str, impl: str, kind: str, blocks: int, root: str, threads: int, round_: int = 0, floor: bool = False) -> dict[str, float]:
    out = os.path.join(root, f"{impl}-{kind}-{threads}-{round_}")
    env = dict(os.environ)
    if impl == "stepscope":
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    # The job is kept until the bench ends (or until space runs short: make_room): ext4
    # without a journal skips recently freed inodes when it makes a file (see AGE_S), so
    # deleting a run's thousands of files would slow the file creation of the next run,
    # whichever tool.
    floors = list(FLOORS) if floor else []
    _kept.extend([out] + [f"{out}-{name}" for name in floors])
    argv = [python, "-c", WORKER, impl, kind, str(blocks), out, str(threads)] + floors
    reply = subprocess.run(argv, capture_output=True, text=True, env=env)
    if reply.returncode != 0:
        raise RuntimeError(reply.stderr.strip().splitlines()[-1] if reply.stderr.strip() else f"exit {reply.returncode}")
    return json.loads(reply.stdout.strip().splitlines()[-1])


def _merged(runs: list[dict]) -> dict:
    """One tool's runs as one: medians over every run's blocks (the floor's too), CPU as
    the median of the runs', bytes and seconds summed."""
    merged = dict(runs[0])
    for key in ("plain_blocks", "hooked_blocks"):
        merged[key] = [t for r in runs for t in r.get(key) or ()]
    merged["plain"], merged["hooked"] = statistics.median(merged["plain_blocks"]), statistics.median(merged["hooked_blocks"])
    merged["floors"] = {}
    for name in runs[0].get("floors") or {}:
        blocks = [t for r in runs for t in r["floors"][name]["blocks"]]
        merged["floors"][name] = {"blocks": blocks, "time": statistics.median(blocks),
                                  **{key: statistics.median(r["floors"][name][key] for r in runs) for key in ("train_cpu_added", "all_cpu_added")}}
    for key in ("train_cpu_added", "all_cpu_added"):
        merged[key] = statistics.median(r[key] for r in runs)
    # Paired: each round's block less the plain block of the same round (the variants of a
    # round run back to back), median over every run's rounds. The machine's speed drifts
    # within a run (a plain block of 3.1 ms in one half of a run, 2.0 ms in the other, on
    # this VM): a difference of medians then moves with where the medians land, while a
    # floor adds 0.1-0.2 ms a step; a paired difference leaves the drift out.
    def blocks(run: dict, name: str) -> list[float]:
        return run["hooked_blocks"] if name == "hooked" else run["floors"][name]["blocks"]

    merged["paired"] = {
        name: statistics.median(t - p for r in runs for t, p in zip(blocks(r, name), r["plain_blocks"]))
        for name in ["hooked", *(runs[0].get("floors") or {})]
    }
    merged["bytes"], merged["hooked_s"] = sum(r["bytes"] for r in runs), sum(r["hooked_s"] for r in runs)
    if all(r.get("requests") for r in runs):
        merged["requests"] = {name: statistics.mean(r["requests"][name] for r in runs) for name in runs[0]["requests"]}
    return merged


# What a configuration may write at most (save_all at every step writes about 1.5 MB a
# step per tool); below this much free space in the temporary folder a configuration is
# skipped with a message rather than filling the disk.
MIN_FREE_BYTES = 8 << 30
_kept: list[str] = []  # the runs' jobs, removed at the end
# ext4 without a journal (fs/ext4/ialloc.c, `recently_deleted`) will not reuse an inode freed
# less than 60 s ago, nor one freed less than 360 s ago while its inode table block is
# still dirty, and it reads each such inode's block on the way to a free one: a file made
# soon after thousands were removed costs several times its usual CPU. After removing the
# kept jobs, the blocks are written back (sync) and the 60 s are waited out; the 360 s
# window can still apply where new files dirty a block again, so the bench removes
# nothing while it measures unless space runs short, and says so when it does.
AGE_S = 65
def remove_kept(wait: bool) -> None:
    while _kept:
        shutil.rmtree(_kept.pop(), ignore_errors=True)
    if wait:
        os.sync()
        time.sleep(AGE_S)


def make_room(root: str) -> int:
    """Free bytes in `root`, after removing the kept jobs where fewer than MIN_FREE_BYTES."""
    free = shutil.disk_usage(root).free
    if free < MIN_FREE_BYTES and _kept:
        print(f"(space runs short: the earlier runs' jobs are removed, and {AGE_S} s waited; file creation may cost more in the next runs)", flush=True)
        remove_kept(wait=True)
        mark_removed()
        free = shutil.disk_usage(root).free
    return free


def compare(kind: str, threads: int, blocks: int, root: str, pythons: tuple[tuple[str, str | None], ...], rounds: int = 1, floor: bool = False) -> None:
    """Each tool runs `rounds` times, taking turns (stepscope, smdebug, stepscope, ...): on a
    machine where other work comes and goes (which, with training on every core, slows
    whatever runs then several times over), neither tool gets all the quiet moments."""
    free = make_room(root)
    if free < MIN_FREE_BYTES:
        print(f"{kind:5} {threads:7} skipped: {free / 2**30:.1f} GiB free in {root}, this configuration needs up to {MIN_FREE_BYTES / 2**30:.0f}")
        return
    added: dict[str, float] = {}
    paired: dict[str, float] = {}  # the same, as the median of each round's difference (_merged)
    plain: dict[str, float] = {}
    runs: dict[str, list[dict]] = {}
    requests: list[tuple[str, float, float]] = []  # (variant, write requests per step, its plain loop's)
    per_save_requests = 10
    for round_ in range(rounds):
        for impl, python in pythons:
            if python is None:
                continue
            try:
                runs.setdefault(impl, []).append(run_worker(python, impl, kind, blocks, root, threads, round_, floor and impl == "stepscope"))
            except (RuntimeError, OSError) as exc:
                print(f"{kind:5} {threads:7} {impl:9} failed: {exc}")
    for impl, _ in pythons:
        if not runs.get(impl):
            continue
        r = _merged(runs[impl])
        added[impl], plain[impl], paired[impl] = r["hooked"] - r["plain"], r["plain"], r["paired"]["hooked"]
        for name, f in r["floors"].items():
            added[name], paired[name] = f["time"] - r["plain"], r["paired"][name]
        per_save_requests = 1 if kind.endswith("-all") else 10
        if r.get("requests"):
            base = r["requests"]["plain"]
            requests += [(impl, r["requests"]["hooked"], base)] + [(name, r["requests"][name], base) for name in r["floors"]]
        rate = r["bytes"] / max(r["hooked_s"], 1e-9) / 1e6
        # The spread of the hooked blocks (interquartile range over the median): how
        # steady the added time is from block to block.
        q = statistics.quantiles(r["hooked_blocks"], n=4) if len(r["hooked_blocks"]) >= 4 else [r["hooked"]] * 3
        spread = (q[2] - q[0]) / r["hooked"]
        # CPU added per save (a save every 10th step, or every step with save_all): the
        # training thread's, and every thread's.
        per_save = 1e3 if kind.endswith("-all") else 10e3
        print(f"{kind:5} {threads:7} {impl:9} {r['plain'] * 1e3:9.3f} {r['hooked'] * 1e3:10.3f} {100 * added[impl] / r['plain']:8.1f} {100 * spread:8.1f} {rate:12.1f}"
              f" {per_save * r['train_cpu_added']:12.2f} {per_save * r['all_cpu_added']:12.2f}", flush=True)
        for name, f in r["floors"].items():
            q = statistics.quantiles(f["blocks"], n=4) if len(f["blocks"]) >= 4 else [f["time"]] * 3
            print(f"{kind:5} {threads:7} {name:12} {r['plain'] * 1e3:6.3f} {f['time'] * 1e3:10.3f} {100 * added[name] / r['plain']:8.1f} {100 * (q[2] - q[0]) / f['time']:8.1f} {'':12}"
                  f" {per_save * f['train_cpu_added']:12.2f} {per_save * f['all_cpu_added']:12.2f}", flush=True)
    if requests:
        # Block-device write requests per save, each variant's blocks less the plain ones'
        # (writeback from one block may land in the next: a rough attribution).
        print(f"{kind:5} {threads:7} write requests to the job's device per save (each an interrupt): "
              + ", ".join(f"{name} {per_save_requests * (n - base):.2f}" for name, n, base in requests), flush=True)
    if added.get("floor", 0) > 0 and "stepscope" in added:
        # The floor did the same bytes on the same loop and cores, in stepscope's processes
        # (blocks between its plain and hooked ones), so the contention the bytes cause
        # (memory traffic slows torch's threads beyond its CPU) is in it too.
        print(
            f"{kind:5} {threads:7} byte-cost limit (the floor, side by side): {added['floor'] * 1e3:.3f} ms per step "
            f"({(plain['stepscope'] + added['floor']) / plain['stepscope']:.2f}x of the plain loop); "
            f"stepscope adds {added['stepscope'] / added['floor']:.2f}x of that (goal <= 1.3: {'met' if added['stepscope'] <= 1.3 * added['floor'] else 'MISSED'})"
        )
    if paired.get("floor", 0) > 0 and "stepscope" in paired:
        print(
            f"{kind:5} {threads:7} paired (each round's block less its plain block, median): floor {paired['floor'] * 1e3:.3f} ms per step, "
            + (f"floor+layout {paired['floor+layout'] * 1e3:.3f}, " if "floor+layout" in paired else "")
            + f"stepscope {paired['stepscope'] * 1e3:.3f}: stepscope adds {paired['stepscope'] / paired['floor']:.2f}x of the floor"
            + (f", {paired['stepscope'] / paired['floor+layout']:.2f}x of the floor with the layout" if paired.get("floor+layout", 0) > 0 else "")
            + f" (goal <= 1.3: {'met' if paired['stepscope'] <= 1.3 * paired['floor'] else 'MISSED'})"
        )
    if added.get("floor+layout", 0) > 0 and "stepscope" in added:
        # The bytes and the file system's part of smdebug's layout (a folder, an event file
        # and an index file per save, each published by a rename): the limit for any tool
        # that keeps that layout, which smdebug's reader needs.
        print(
            f"{kind:5} {threads:7} with smdebug's layout (the floor and a folder, an event file and an index file per save, renamed): "
            f"{added['floor+layout'] * 1e3:.3f} ms per step; stepscope adds {added['stepscope'] / added['floor+layout']:.2f}x of that"
        )
    if rounds > 1:
        # The spread between runs (the measure): each run's hooked loop over its
        # plain one, and how far the runs lie apart (range over median) for each tool.
        spreads = {}
        for impl in runs:
            each = [statistics.median(r["hooked_blocks"]) / statistics.median(r["plain_blocks"]) for r in runs[impl]]
            spreads[impl] = (max(each) - min(each)) / statistics.median(each)
            print(f"{kind:5} {threads:7} {impl:9} runs (hooked / plain): {', '.join(f'{x:.2f}x' for x in each)}; spread between runs {100 * spreads[impl]:.1f} %")
        if "stepscope" in spreads and "smdebug" in spreads:
            verdict = "met" if spreads["stepscope"] <= spreads["smdebug"] else "MISSED"
            print(f"{kind:5} {threads:7} spread between runs, stepscope's / smdebug's: {100 * spreads['stepscope']:.1f} % / {100 * spreads['smdebug']:.1f} % (goal: no wider: {verdict})")
    if "stepscope" in added and added.get("smdebug", 0) > 0:
        ratio = added["stepscope"] / added["smdebug"]
        goal = 1 / 4 if kind.endswith("-all") else 1 / 3
        # The same over each tool's own plain loop (the first measure): the two
        # differ where the tools' processes ran their plain loops at different speeds,
        # which on this VM they do from one process to the next (1.3 or 2.1 ms a step).
        relative = (added["stepscope"] / plain["stepscope"]) / (added["smdebug"] / plain["smdebug"])
        print(f"{kind:5} {threads:7} stepscope's added time / smdebug's: {ratio:.2f} (goal <= {goal:.2f}: {'met' if ratio <= goal else 'MISSED'});"
              f" as fractions of each one's plain loop: {relative:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--blocks", type=int, default=None, help="blocks of 20 steps per variant")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the all-cores configuration (default: every core)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tool, taking turns, on one thread (default 2)")
    parser.add_argument("--core-rounds", type=int, default=4, help="runs of each tool, taking turns, on every core (default 4: the spread between runs)")
    parser.add_argument("--smdebug-python", default=os.environ.get("SMDEBUG_PYTHON"), help="python of an environment with smdebug 1.0.34")
    parser.add_argument("--no-wait", action="store_true", help=f"start at once even within {QUIET_S} s of a bench's removing its jobs")
    args = parser.parse_args()
    wait_for_quiet(not args.no_wait and not args.quick)
    blocks = args.blocks or (6 if args.quick else 30)
    rounds = 1 if args.quick else args.rounds
    core_rounds = 1 if args.quick else args.core_rounds
    print(f"weights + gradients every 10 steps, SGD, no register_optimizer, {rounds} run(s) of each tool taking turns on one thread and {core_rounds} on every core, {blocks} blocks x 20 steps each, medians;"
          f" load average {os.getloadavg()[0]:.1f}")
    print("1 thread (a core left to the writer), then training on every core (--threads), MLP 256-512-512-10, batch 64")
    if not args.smdebug_python:
        print("smdebug: not measured (no --smdebug-python / SMDEBUG_PYTHON given; see this script's docstring)")
    print(f"{'model':5} {'threads':>7} {'tool':9} {'plain ms':>9} {'hooked ms':>10} {'added %':>8} {'spread %':>8} {'written MB/s':>12}"
          f" {'train CPU ms':>12} {'all CPU ms':>12}  (CPU: added per save)")
    pythons = (("stepscope", sys.executable), ("smdebug", args.smdebug_python))
    with tempfile.TemporaryDirectory() as root:
        for kind, threads in (("mlp", 1), ("cnn", 1), ("mlp", args.threads)):
            # On every core, the floor (the bytes alone) runs beside stepscope: the limit.
            compare(kind, threads, blocks, root, pythons, rounds if threads == 1 else core_rounds, floor=kind == "mlp" and threads > 1)
        # Everything every step (about 1.5 MB a step for this MLP): fewer blocks.
        compare("mlp-all", args.threads, max(4, blocks // 3), root, pythons, core_rounds)
        remove_kept(wait=False)
    mark_removed()


if __name__ == "__main__":
    main()
