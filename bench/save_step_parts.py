"""Where a save step's time goes on the training thread: bench_vs_smdebug.py's MLP
(256-512-512-10, batch 64, SGD, no register_optimizer) with weights and gradients saved at
every step, nothing handed to the writer, the thread's CPU clock read around the hook's
methods; and beside it, in the same process, the plain loop, for what the hook adds in all,
the byte floor's copy (bench_vs_smdebug.py's `Floor` on the training thread), and the
hook's mechanism with nothing else (`_BareHooks`: the same copies, in the same gradient
hooks, registered and removed at each step).
The parts nest (`_on_step_begin` holds `_save_parameters`, which holds the weights' batch
`capture_many`, and registers the gradient hooks); what no part holds is the step
machinery around them (the driven forward, the step's opening and closing).

`--gradients-general`: every gradient takes the general path to its snapshot, as before
`HostTransfer.capture_host` (the routine one is the default).

    python bench/save_step_parts.py [--threads 1] [--steps 500] [--blocks 20] [--collections weights,gradients] [--gradients-general]"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch
from _quiet import mark_removed  # (this folder is the script's)
from torch import nn

from stepscope.capture.host_arena import _ALIGN as ALIGN
from stepscope.capture.host_arena import ARENA_FROM, _copy_scan
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope_torch import Hook

# (object attribute, label): the hook's methods a save step runs, and the transfer's batch.
PARTS = (
    ("_on_step_begin", "step begins (weights saved, gradient hooks registered)"),
    ("_save_parameters", "  weights saved"),
    ("_gradient_hooks", "  gradient hooks registered"),
    ("_on_grad_accumulated", "gradient hooks (each gradient saved)"),
    ("_on_step_end", "step ends (gradient hooks removed)"),
    ("_hand_over", "hand-over to the writer"),
)
TOP = ("_on_step_begin", "_on_grad_accumulated", "_on_step_end", "_hand_over")  # (not nested in each other)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def _timed(obj: Any, name: str, used: dict[str, float]) -> None:
    method = getattr(obj, name)

    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            used[name] = used.get(name, 0.0) + time.thread_time() - started

    setattr(obj, name, timed)


_FLOOR_BUFFERS: dict[int, torch.Tensor] = {}


def _floor_copy(model: nn.Module, collections: list[str], *_: Any) -> None:
    """bench_vs_smdebug.py's byte floor on the training thread: each weight and gradient
    copied by torch into one reused buffer, and nothing else."""
    tensors = [p.detach() for p in model.parameters()] if "weights" in collections else []
    tensors += [p.grad for p in model.parameters()] if "gradients" in collections else []
    size = sum(t.numel() * t.element_size() for t in tensors)
    buffer = _FLOOR_BUFFERS.get(size)
    if buffer is None:
        buffer = _FLOOR_BUFFERS[size] = torch.empty(size, dtype=torch.uint8)
    at = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        buffer[at:at + n].view(t.dtype).view(t.shape).copy_(t)
        at += n


class _BareHooks:
    """The hook's mechanism with nothing else: at each step the weights copied and a
    post-accumulate hook registered on each parameter that copies its gradient (both into
    one reused buffer, by `_encode.copy_scan` where a snapshot is as large as the arena's,
    as the hook copies them), the hooks removed after the step. What stepscope's Python
    adds on the training thread is the hook's figure less this one."""

    def __init__(self, model: nn.Module, collections: list[str]) -> None:
        self.params = list(model.parameters())
        self.weights, self.gradients = "weights" in collections, "gradients" in collections
        self.buffer = np.empty(sum(p.numel() * p.element_size() + ALIGN for p in self.params) * 2, np.uint8)
        self.at, self.handles, self.scans = 0, [], []

    def begin(self) -> None:
        self.at, self.scans = 0, []
        if self.weights:
            for p in self.params:
                self._copy(p.detach())
        if self.gradients:
            self.handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]

    def end(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _on_grad(self, param: torch.Tensor) -> None:
        self._copy(param.grad)

    def _copy(self, tensor: torch.Tensor) -> None:
        source = tensor.numpy()
        n = source.nbytes
        copy = self.buffer[self.at:self.at + n].view(source.dtype).reshape(source.shape)
        if n >= ARENA_FROM and _copy_scan is not None:
            self.scans.append(_copy_scan(copy, source, source.dtype.itemsize))
        else:
            np.copyto(copy, source)
        self.at += -(-n // ALIGN) * ALIGN


def _opcodes(run: Any, steps: int) -> dict[str, float]:
    """Python opcodes per step that stepscope's own functions run in `run(steps)` (the
    training thread's; by function, `package/module.py:line:name`), and those of this
    script's `_BareHooks` under the key of each of its functions."""
    counts: dict[str, int] = {}
    bare = [f.__code__ for f in vars(_BareHooks).values() if callable(f)]
    for code in bare:  # (and the comprehensions inside them: code objects of their own)
        bare += [c for c in code.co_consts if isinstance(c, type(code))]

    def trace(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        path = code.co_filename.replace("\\", "/")
        if event == "call":
            frame.f_trace_lines = False
            frame.f_trace_opcodes = True
        elif event == "opcode" and ("/stepscope/" in path or "/stepscope_torch/" in path or code in bare):
            key = f"{path.rsplit('/src/', 1)[-1]}:{code.co_firstlineno}:{code.co_name}"
            counts[key] = counts.get(key, 0) + 1
        return trace

    sys.settrace(trace)
    try:
        run(steps)
    finally:
        sys.settrace(None)
    return {key: n / steps for key, n in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--steps", type=int, default=500, help="steps timed part by part")
    parser.add_argument("--blocks", type=int, default=20, help="interleaved blocks of 50 steps of each loop")
    parser.add_argument("--collections", default="weights,gradients")
    parser.add_argument("--gradients-general", action="store_true", help="gradients by the general path")
    parser.add_argument("--opcodes", type=int, default=20, metavar="STEPS", help="steps whose Python opcodes are counted (0: none)")
    args = parser.parse_args()
    if args.gradients_general:
        from stepscope_torch import model_tensors

        model_tensors.host_tensor = lambda tensor: False
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)
    loss_fn = nn.CrossEntropyLoss()
    used: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as out:
        hook = Hook(out, save_config=SaveConfig(save_interval=1), include_collections=args.collections.split(","), profiler_config=ProfilerConfig.disabled())
        hook._runtime.writer._put = lambda job, nbytes: True  # (nothing handed to the writer)
        for name, _ in PARTS:
            _timed(hook, name, used)
        loops = {}
        bare = None
        for kind in ("plain", "floor", "bare", "hooked"):
            model = _mlp()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            if kind == "hooked":
                hook.register_module(model)
                hook.register_loss(loss_fn)
            elif kind == "floor":
                optimizer.register_step_pre_hook(functools.partial(_floor_copy, model, args.collections.split(",")))
            elif kind == "bare":
                bare = _BareHooks(model, args.collections.split(","))
            loops[kind] = (model, optimizer)

        def run(kind: str, steps: int) -> float:
            model, optimizer = loops[kind]
            around = bare if kind == "bare" else None
            started = time.thread_time()
            for _ in range(steps):
                if around is not None:
                    around.begin()
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
                if around is not None:
                    around.end()
            return (time.thread_time() - started) / steps

        for kind in loops:
            run(kind, 50)
        blocks: dict[str, list[float]] = {kind: [] for kind in loops}
        for _ in range(args.blocks):  # interleaved blocks: what the hook adds in all
            for kind in blocks:
                blocks[kind].append(run(kind, 50))
        used.clear()
        metered = hook._meter.hook_s
        hooked = run("hooked", args.steps)
        metered = (hook._meter.hook_s - metered) / args.steps
        opcodes = {kind: _opcodes(functools.partial(run, kind), args.opcodes) for kind in ("bare", "hooked")} if args.opcodes else {}
        hook.close()
    mark_removed()
    added = statistics.median(blocks["hooked"]) - statistics.median(blocks["plain"])
    floor = statistics.median(blocks["floor"]) - statistics.median(blocks["plain"])
    bare_added = statistics.median(blocks["bare"]) - statistics.median(blocks["plain"])
    per = {name: seconds / args.steps * 1e3 for name, seconds in used.items()}
    print(f"save_step_parts: {args.collections} saved every step, {args.threads} thread(s), nothing handed to the writer; "
          f"{'gradients by the general path; ' if args.gradients_general else ''}hooked step {hooked * 1e3:.3f} ms of the training thread's CPU")
    print(f"  added over the plain loop ({args.blocks} interleaved blocks of 50 steps, medians): {added * 1e3:.3f} ms a step")
    print(f"  the byte floor's copy alone (each tensor into one reused buffer by torch): {floor * 1e3:.3f} ms a step; the hook {added / floor:.2f}x of it" if floor > 0 else
          f"  the byte floor's copy alone: {floor * 1e3:.3f} ms a step (within the noise)")
    print(f"  the cost meter's hook time (what the report shows; wall time, the parts' wrappers in it): {metered * 1e3:.3f} ms a step")
    print(f"  the hook's mechanism alone (copies in gradient hooks, nothing else): {bare_added * 1e3:.3f} ms a step; stepscope's own part {(added - bare_added) * 1e3:.3f} ms")
    for name, label in PARTS:
        print(f"  {label:58} {per.get(name, 0.0):.3f} ms")
    print(f"  {'the step machinery around them (added minus the parts)':58} {added * 1e3 - sum(per.get(n, 0.0) for n in TOP):.3f} ms")
    if opcodes:
        ours = opcodes["hooked"]
        print(f"Python opcodes a save step ({args.opcodes} steps; a count the machine's load cannot move): stepscope's own {sum(ours.values()):.0f} "
              f"(the bench's bare hooks {sum(opcodes['bare'].values()):.0f}); the functions with the most:")
        for key, count in sorted(ours.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {count:7.0f}  {key}")


if __name__ == "__main__":
    main()
