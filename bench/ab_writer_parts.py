"""Where a save's time goes with training on every core: in ONE process, blocks of the plain
loop and of the hooked loop in two variants, A (as shipped) and B (one part of the writer
changed or switched off), taken in a new random order each round, medians over the rounds.
One process because this machine's plain loop runs at 1.3 or 2.1 ms per step from one
process to the next; two variants of one hook because a part switched off can then be
compared with itself switched on, between neighbouring blocks. Each hooked block ends when
the writer has written it (its time counted in the block).

    python bench/ab_writer_parts.py aa          # A against A: the resolution
    python bench/ab_writer_parts.py capture     # B: steps captured, never handed to the writer
    python bench/ab_writer_parts.py --every 1 capture
    python bench/ab_writer_parts.py --save-all --every 1 publish   # everything, every step

Parts: `aa`, `capture` (B hands nothing to the writer: capture on the training thread
alone), `listener` (B: no step listener, the black box's), `publish` (B: nothing published,
framing kept), `events` (B: no event file written), `index` (B: no index file written),
`direct` (B: no direct writes), `frame_array` (B: each array's record framed in Python, not
in one call of `_encode.frame_array`), `pauses` (B: the framer never pauses for the GIL), `arena`
(B: snapshots copied into fresh arrays, not the reused memory of capture/host_arena.py),
`copy_scan` (B: snapshots copied by numpy and their CRC read again by the writer, not taken
in the copy), `nocrc` (B: no CRC and no black box: smdebug's placeholder CRC), `nice` and
`idle` (B: the writer's threads at nice 19, or SCHED_IDLE: when they run, not what they do),
`stream` (B: the snapshot's copy and the staging copy store through the caches, not around them),
`place` (B: no padding records, so that every byte of an event file is staged for its direct
write, none written from the snapshot's own memory), `direct_c` (B: an event file's direct
write made from Python, several calls, not in one call of `_publish.publish_direct`; nor
its folder walks and index file in one call), `files_c` (B: a step's two files published by
the Python path, its folders walked from Python and each file one C call, not the whole
step in one call of `_publish.publish_files`), `hugepages` (B: the snapshots' arena and the
staging buffer in shared memory of small pages, as `mmap(-1, n)` gives it, not private
memory that asks for transparent huge pages: `direct_io.device_memory`), `torchcopy` (B: a
float tensor's snapshot copied by torch's `copy_`, on the intra-op threads as the floor
copies, its CRC and finite check left to the writer's framing), `grad_general` (B: every
gradient hook takes the general path to its snapshot, as before `HostTransfer.capture_host`),
`finite` (B: the black box judges float
arrays under 1 KiB itself, as before the framing pass took them from 9 bytes),
`frame_values` (B: a step's values framed in a Python loop around `_encode.frame_array`, not
in one call of `_encode.frame_values`), `floorwrite` (B: the event file written as
bench_vs_smdebug.py's floor writes its bytes: copied into one reused buffer, one O_DIRECT
write; the file's tail is not valid, nothing reads it), and two calibrations, `burn` and
`burn_nogil` (B: the writer thread spends BURN_S more CPU per save, holding the GIL or
not): what a part's CPU on the writer thread costs the wall time.
Weights + gradients (or everything: `--save-all`) of an MLP 256-512-512-10 every `--every`
steps (default 10), SGD, `--threads` torch threads (default: every core), profiler side off."""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import tempfile
import threading
import time

import torch
from _quiet import mark_removed  # (this folder is the script's)
from torch import nn

from stepscope.capture import host_arena
from stepscope.capture.host_arena import HostArena
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope_torch import Hook

PARTS = ("aa", "handoff", "frame_array", "capture", "listener", "publish", "events", "index", "direct", "pauses", "arena", "nice", "idle", "nocrc", "copy_scan", "stream",
         "place", "direct_c", "finite", "burn", "burn_nogil", "floorwrite", "frame_values", "files_c", "hugepages",
         "torchcopy", "grad_general")
BLOCK = 20
BURN_S = 300e-6  # the `burn` parts' extra CPU per save
# sha256 of this many bytes takes about BURN_S here (sized at the start: `_burn_bytes`)
BURN_BYTES = b""


def _skipping(write_many, skipped):
    """`store.write_many` that reports the files `skipped` picks as published unwritten (and
    writes each other one by a call of its own)."""

    def write(files, published=None):
        for i, (key, data) in enumerate(files):
            if not skipped(key):
                write_many([(key, data)])
            if published is not None:
                published(i)

    return write


def plain_and_hooked(hook: Hook) -> dict[str, tuple[nn.Module, nn.Module, torch.optim.Optimizer]]:
    """The MLP 256-512-512-10 twice, with the same first weights: (model, loss module, SGD)
    of a plain loop, and of one registered with `hook`. (bench/save_cycle.py's too.)"""
    loops = {}
    for name in ("plain", "hooked"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        loss_fn = nn.CrossEntropyLoss()
        if name == "hooked":
            hook.register_module(model)
            hook.register_loss(loss_fn)
        loops[name] = (model, loss_fn, torch.optim.SGD(model.parameters(), lr=0.01))
    return loops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("--every", type=int, default=10, help="save interval (steps)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--save-all", action="store_true", help="save everything (save_all), not weights and gradients")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    global BURN_BYTES
    if args.part == "burn_nogil":
        probe = bytes(1 << 20)
        start = time.thread_time()
        for _ in range(20):
            hashlib.sha256(probe)
        per_byte = (time.thread_time() - start) / (20 << 20)
        BURN_BYTES = bytes(int(BURN_S / per_byte))
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as out:
        saved = {"save_all": True} if args.save_all else {"include_collections": ["weights", "gradients"]}
        hook = Hook(out, save_config=SaveConfig(save_interval=args.every), profiler_config=ProfilerConfig.disabled(), **saved)
        writer = hook._runtime.writer
        shipped = {"put": writer._put, "publish": writer._publish_step, "write_many": writer.store.write_many,
                   "listeners": list(writer.step_listeners), "pause": writer._framer._yield_every_s,
                   "frame_array": writer._framer.frame_array, "frame_values": writer._framer.frame_values}  # fmt: skip
        writer.store._direct.allowed()  # (decided now, so that the variants can set it)
        direct = writer.store._direct._allowed
        changed = {
            "capture": lambda: setattr(writer, "_put", lambda job, nbytes: True),
            "listener": lambda: writer.step_listeners.clear(),
            "publish": lambda: setattr(writer, "_publish_step", lambda job, parts, index: None),
            "events": lambda: setattr(writer.store, "write_many", _skipping(shipped["write_many"], lambda key: key.endswith(".tfevents"))),
            "index": lambda: setattr(writer.store, "write_many", _skipping(shipped["write_many"], lambda key: key.startswith("index/"))),
            "direct": lambda: setattr(writer.store._direct, "_allowed", False),
            "handoff": lambda: setattr(writer, "_publish_inline", False),
            "pauses": lambda: setattr(writer._framer, "_yield_every_s", float("inf")),
            "frame_array": lambda: setattr(writer._framer, "frame_array", None),
            "frame_values": lambda: setattr(writer._framer, "frame_values", None),
            "place": lambda: setattr(writer.store, "data_alignment", lambda: 0),
        }

        threads = [t.native_id for t in threading.enumerate() if t.name.startswith(("stepscope-writer", "stepscope-publisher"))]

        def scheduled(policy: int, nice: int) -> None:
            for tid in threads:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, tid, nice)

        def no_crc() -> None:
            writer._framer._placeholder_crc = True
            writer.step_listeners.clear()

        changed["nocrc"] = no_crc
        copy_scan = host_arena._copy_scan
        changed["copy_scan"] = lambda: setattr(host_arena, "_copy_scan", None)
        from stepscope.capture import step_framing
        from stepscope.compiled import load_extension

        switches = [m.streaming_stores for m in (step_framing._encode, load_extension("stepscope.store", "_publish")) if hasattr(m, "streaming_stores")]
        changed["stream"] = lambda: [switch(False) for switch in switches]
        from stepscope.store import local

        publish_direct, publish_files = local._publish_direct, local._publish_files
        changed["direct_c"] = lambda: [setattr(local, name, None) for name in ("_publish_direct", "_publish_files")]
        changed["files_c"] = lambda: setattr(local, "_publish_files", None)
        floor_buffers: list = []
        import numpy as np

        def stage(buffer, at, v):
            np.frombuffer(buffer, np.uint8, v.nbytes, at)[:] = np.frombuffer(v, np.uint8)

        def floor_write(folder_fd, tmp, name, views, staging, flags, align, place_from, prealloc_from):
            # As the floor writes: every byte copied into one reused buffer, one write of it
            # (rounded up to the block: the file's tail is not valid; the bench reads nothing).
            import mmap
            size = sum(v.nbytes for v in views)
            rounded = -(-size // 4096) * 4096
            if not floor_buffers or len(floor_buffers[0]) < rounded:
                floor_buffers[:] = [mmap.mmap(-1, rounded)]
            buffer = floor_buffers[0]
            at = 0
            for v in views:
                stage(buffer, at, v)
                at += v.nbytes
            fd = os.open(tmp, flags | os.O_DIRECT, 0o644, dir_fd=folder_fd)
            try:
                os.write(fd, memoryview(buffer)[:rounded])
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
            return 0

        # (the event file by the Python path, which calls `_publish_direct`)
        changed["floorwrite"] = lambda: [setattr(local, "_publish_direct", floor_write), setattr(local, "_publish_files", None)]

        finite_from = step_framing._FINITE_FROM
        changed["finite"] = lambda: setattr(step_framing, "_FINITE_FROM", step_framing.events.SMALL_TENSOR_BYTES + 1)
        # Calibration: B spends BURN_S more of the writer thread's CPU per save, holding the
        # GIL (Python) or not (hashing in C): what a part's CPU there costs the wall time.
        def burning(hold_gil: bool):
            def publish(job, parts, index):
                if hold_gil:
                    end = time.thread_time() + BURN_S
                    while time.thread_time() < end:
                        pass
                else:
                    hashlib.sha256(BURN_BYTES)
                return shipped["publish"](job, parts, index)
            return publish

        changed["burn"] = lambda: setattr(writer, "_publish_step", burning(True))
        changed["burn_nogil"] = lambda: setattr(writer, "_publish_step", burning(False))
        changed["nice"] = lambda: scheduled(os.SCHED_OTHER, 19)
        changed["idle"] = lambda: scheduled(os.SCHED_IDLE, 0)

        arenas = {"shipped": hook._transfer._arena, "fresh": HostArena(keep_bytes=0)}
        changed["arena"] = lambda: setattr(hook._transfer, "_arena", arenas["fresh"])
        import mmap

        from stepscope.store import direct_io

        small_staging = memoryview(mmap.mmap(-1, direct_io.BUFFER_BYTES))

        def small_pages() -> None:
            host_arena.device_memory = lambda size: mmap.mmap(-1, size)  # (the blocks this arena maps)
            arenas.setdefault("small pages", HostArena())
            hook._transfer._arena = arenas["small pages"]
            local.staging_buffer = lambda: small_staging

        changed["hugepages"] = small_pages
        from stepscope_torch import transfer

        snapshot = transfer._snapshot

        def torch_copy(arena, tensor, raw):
            # torch's copy_ (on the intra-op threads, as the floor copies) into the arena; the
            # CRC and the finite check then taken by the writer's framing, as for any array.
            if tensor.dtype not in (torch.float32, torch.float64) or tensor.numel() * tensor.element_size() < host_arena.ARENA_FROM:
                return snapshot(arena, tensor, raw)
            copy = arena.empty(tuple(tensor.shape), np.float32 if tensor.dtype == torch.float32 else np.float64)
            torch.from_numpy(copy).copy_(tensor)
            return copy

        changed["torchcopy"] = lambda: setattr(transfer, "_snapshot", torch_copy)
        from stepscope_torch import model_tensors

        host_tensor = model_tensors.host_tensor
        changed["grad_general"] = lambda: setattr(model_tensors, "host_tensor", lambda tensor: False)

        def as_shipped() -> None:
            hook._transfer._arena = arenas["shipped"]
            writer._put, writer._publish_step = shipped["put"], shipped["publish"]
            writer.store.write_many = shipped["write_many"]
            writer.step_listeners[:] = shipped["listeners"]
            writer.store._direct._allowed = direct
            writer._framer._yield_every_s = shipped["pause"]
            writer._framer.frame_array = shipped["frame_array"]
            writer._framer.frame_values = shipped["frame_values"]
            writer._publish_inline = True
            vars(writer.store).pop("data_alignment", None)
            scheduled(os.SCHED_OTHER, 0)
            writer._framer._placeholder_crc = False
            host_arena._copy_scan = copy_scan
            local._publish_direct, local._publish_files = publish_direct, publish_files
            host_arena.device_memory, local.staging_buffer = direct_io.device_memory, direct_io.staging_buffer
            step_framing._FINITE_FROM = finite_from
            transfer._snapshot = snapshot
            model_tensors.host_tensor = host_tensor
            for switch in switches:
                switch(True)

        def variant(name: str) -> None:
            writer.flush()  # the other variant's writing is done before this one changes anything
            as_shipped()
            if name == "B" and args.part in changed:
                changed[args.part]()

        loops = plain_and_hooked(hook)
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

        # CPU clocks of the training thread and of stepscope's threads: what each variant
        # costs in CPU, which moves less with the machine's load than the wall time.
        clocks = {"training": time.CLOCK_THREAD_CPUTIME_ID}
        clocks.update((t.name, time.pthread_getcpuclockid(t.ident)) for t in threading.enumerate() if t.name.startswith("stepscope-") and t.ident)
        cpu: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}

        def run(name: str, steps: int, variant_name: str | None = None) -> float:
            model, loss_fn, optimizer = loops[name]
            before = {k: time.clock_gettime(c) for k, c in clocks.items()}
            start = time.perf_counter()
            for _ in range(steps):
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
            if name == "hooked":
                writer.flush()
            elapsed = (time.perf_counter() - start) / steps
            if variant_name is not None:
                for k, c in clocks.items():
                    cpu[variant_name].setdefault(k, []).append((time.clock_gettime(c) - before[k]) / steps)
            return elapsed

        for name in ("A", "B"):
            variant(name)
            run("hooked", 2 * BLOCK)
        run("plain", 2 * BLOCK)
        times: dict[str, list[float]] = {"plain": [], "A": [], "B": []}
        order = random.Random(0)
        for _ in range(args.rounds):
            names = list(times)
            order.shuffle(names)
            for name in names:
                if name != "plain":
                    variant(name)
                times[name].append(run("plain" if name == "plain" else "hooked", BLOCK, None if name == "plain" else name))
        as_shipped()
        hook.close()
    plain = statistics.median(times["plain"])
    added = {name: statistics.median(times[name]) - plain for name in ("A", "B")}
    print(f"{args.part}: {'everything' if args.save_all else 'weights + gradients'} every {args.every} steps, {args.threads} thread(s), {args.rounds} rounds of {BLOCK}-step blocks; plain {plain * 1e3:.3f} ms/step")
    print(f"  added per step: A (as shipped) {added['A'] * 1e3:+.3f} ms, B ({args.part}) {added['B'] * 1e3:+.3f} ms; A - B {(added['A'] - added['B']) * 1e3:+.3f} ms")
    # (the training thread's CPU includes the plain loop's; the difference is the variants')
    for thread in cpu["A"]:
        a, b = (statistics.median(cpu[v][thread]) * 1e3 for v in ("A", "B"))
        if a or b:
            print(f"  CPU per hooked step, {thread}: A {a:.3f} ms, B {b:.3f} ms; A - B {a - b:+.3f} ms")


if __name__ == "__main__":
    try:
        main()
    finally:
        # Its job is removed: the benches that compare a hooked loop with a plain one wait
        # (A and B here suffer alike from a recent removal, so this one does not).
        mark_removed()
