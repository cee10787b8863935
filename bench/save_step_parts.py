"""Where a save step's time goes on the training thread: bench_vs_smdebug.py's MLP
(256-512-512-10, batch 64, SGD, no register_optimizer) with weights and gradients saved at
every step, nothing handed to the writer, the thread's CPU clock read around the hook's
methods; and beside it, in the same process, the plain loop, for what the hook adds in all.
The parts nest (`_on_step_begin` holds `_save_parameters`, which holds the weights' batch
`capture_many`, and registers the gradient hooks); what no part holds is the step
machinery around them (the driven forward, the step's opening and closing).

`--gradients-general`: every gradient takes the general path to its snapshot, as before
`HostTransfer.capture_host` (the routine one is the default).

    python bench/save_step_parts.py [--threads 1] [--steps 500] [--collections weights,gradients] [--gradients-general]"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from typing import Any

import torch
from _quiet import mark_removed  # (this folder is the script's)
from torch import nn

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--steps", type=int, default=500, help="steps timed part by part")
    parser.add_argument("--collections", default="weights,gradients")
    parser.add_argument("--gradients-general", action="store_true", help="gradients by the general path")
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
        for kind in ("plain", "hooked"):
            model = _mlp()
            if kind == "hooked":
                hook.register_module(model)
                hook.register_loss(loss_fn)
            loops[kind] = (model, torch.optim.SGD(model.parameters(), lr=0.01))

        def run(kind: str, steps: int) -> float:
            model, optimizer = loops[kind]
            started = time.thread_time()
            for _ in range(steps):
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
            return (time.thread_time() - started) / steps

        for kind in loops:
            run(kind, 50)
        blocks: dict[str, list[float]] = {"plain": [], "hooked": []}
        for _ in range(20):  # interleaved blocks: what the hook adds in all
            for kind in blocks:
                blocks[kind].append(run(kind, 50))
        used.clear()
        hooked = run("hooked", args.steps)
        hook.close()
    mark_removed()
    added = statistics.median(blocks["hooked"]) - statistics.median(blocks["plain"])
    per = {name: seconds / args.steps * 1e3 for name, seconds in used.items()}
    print(f"save_step_parts: {args.collections} saved every step, {args.threads} thread(s), nothing handed to the writer; "
          f"{'gradients by the general path; ' if args.gradients_general else ''}hooked step {hooked * 1e3:.3f} ms of the training thread's CPU")
    print(f"  added over the plain loop (20 interleaved blocks of 50 steps, medians): {added * 1e3:.3f} ms a step")
    for name, label in PARTS:
        print(f"  {label:58} {per.get(name, 0.0):.3f} ms")
    print(f"  {'the step machinery around them (added minus the parts)':58} {added * 1e3 - sum(per.get(n, 0.0) for n in TOP):.3f} ms")


if __name__ == "__main__":
    main()
