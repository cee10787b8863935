"""Step time of a PyTorch loop with the stepscope Hook against the same loop without it,
measured side by side in one process (interleaved blocks of steps, medians), on CPU:
(a) default config (losses and metrics every step, tensors on the default schedule), goal
    <= 1.01 (`--long-blocks`: the same in 1,000-step blocks, median of 5; with
    `--same-model`, one model whose hook is switched on and off between blocks);
(a') the loss every step as smdebug users ask for it (`SaveConfig(save_interval=1)`, only
    the losses collection), the same goal;
(b) weights, biases and gradients every 10 steps, goal <= 1.05;
(c) all tensors (activations included) every step, no goal.
For an MLP and a small CNN, on one intra-op thread (steadier on shared machines). Besides
wall time it reports the training thread's CPU time, which a busy machine disturbs less
(it leaves out the writer thread, whose cost the wall time shows)."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch
from torch import nn

from stepscope.config import ProfilerConfig, SaveConfig
from stepscope_torch import Hook, fastpath
from stepscope_torch.driver import drive_forward

BLOCK_STEPS = 20  # a multiple of 10: each block of config (b) holds the same number of saved steps

CONFIGS: dict[str, tuple[Callable[[str], Hook | None], float | None]] = {
    # Plain against plain: the noise floor of this machine at this moment.
    "A/A control": (lambda out: None, None),
    "a default": (lambda out: Hook(out), 1.01),
    # smdebug's way of saving the loss every step: a routine step like the default's (the
    # default collection, due at every step too, holds nothing), the same goal.
    "a' losses/1": (lambda out: Hook(out, save_config=SaveConfig(save_interval=1), include_collections=["losses"]), 1.01),
    "b w+b+g/10": (lambda out: Hook(out, save_config=SaveConfig(save_interval=10), include_collections=["weights", "biases", "gradients"]), 1.05),
    "c all/1": (lambda out: Hook(out, save_config=SaveConfig(save_interval=1), save_all=True), None),
}


def mlp() -> tuple[nn.Module, tuple[int, ...]]:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)), (64, 1, 28, 28)


def cnn() -> tuple[nn.Module, tuple[int, ...]]:
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )
    return model, (32, 1, 28, 28)


class Loop:
    """A model, its optimizer and loss, and synthetic batches; `run(n)` trains n steps."""

    def __init__(self, make_model, hook: Hook | None = None):
        torch.manual_seed(0)
        self.model, shape = make_model()
        self.loss_fn = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(1)
        self.batches = [(torch.randn(*shape, generator=generator), torch.randint(0, 10, (shape[0],), generator=generator)) for _ in range(8)]
        self.i = 0
        if hook is not None:
            hook.register_module(self.model)
            hook.register_loss(self.loss_fn)
            hook.register_optimizer(self.optimizer)

    def run(self, steps: int) -> tuple[float, float]:
        """(wall seconds, training-thread CPU seconds) per step over `steps` steps."""
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            x, y = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.optimizer.zero_grad()
            self.loss_fn(self.model(x), y).backward()
            self.optimizer.step()
        return (time.perf_counter() - wall) / steps, (time.thread_time() - cpu) / steps


def measure(make_model, make_hook, blocks: int, out: str, block_steps: int = BLOCK_STEPS) -> dict[str, tuple[float, float]]:
    """Median (wall, cpu) seconds per step of the plain and the hooked loop, in interleaved
    blocks of `block_steps` steps."""
    hook = make_hook(out)
    loops = {"plain": Loop(make_model), "hooked": Loop(make_model, hook)}
    for loop in loops.values():
        loop.run(3 * min(block_steps, 100))  # warm up (allocator, caches)
    times: dict[str, list[tuple[float, float]]] = {"plain": [], "hooked": []}
    for block in range(blocks):
        # Alternate which goes first so that drift (other load, caches) hits both alike.
        for name in ("plain", "hooked") if block % 2 == 0 else ("hooked", "plain"):
            times[name].append(loops[name].run(block_steps))
    if hook is not None:
        hook.close()
    return {name: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for name, ts in times.items()}


class Empty(nn.Module):
    """The yardstick: two calls of it are what a step where nothing is due may cost."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def nothing_due_model(hook: Hook | None = None, mechanism: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The smallest step there is (a Linear(1, 1) and its SGD), watched by `hook`, or with
    `mechanism` driven by the hook's mechanism with each part doing nothing (the model's
    class swapped, no-op optimizer step hooks). callgrind_torch_hook.py uses it too."""
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if hook is not None:
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        # The steps run under torch.no_grad (no autograd to time), where a forward in
        # training mode is taken for an evaluation (stepscope_torch.hook): say they train.
        hook.set_mode("train")
    if mechanism:

        def nothing(*args: object) -> None:
            return None

        drive_forward(model, nothing, nothing)
        optimizer.register_step_pre_hook(nothing)
        optimizer.register_step_post_hook(nothing)
    return model, optimizer


def hook_on_path(out: str, compiled: bool, **options: object) -> Hook:
    """A Hook on the compiled hot path (where _fastpath is built) or on the Python one."""
    previous = os.environ.pop(fastpath.PURE_PYTHON_ENV, None)
    if not compiled:
        os.environ[fastpath.PURE_PYTHON_ENV] = "1"
    try:
        return Hook(out, **options)  # type: ignore[arg-type]
    finally:
        os.environ.pop(fastpath.PURE_PYTHON_ENV, None)
        if previous is not None:
            os.environ[fastpath.PURE_PYTHON_ENV] = previous


def nothing_due_variants(root: str, hooks: list[Hook]) -> dict[str, Callable[[int], float]]:
    """{name: run(n) -> training-thread CPU µs per step over n steps} of the smallest step:
    plain; the yardstick (the same step with two calls of an empty nn.Module in it); the
    hook's mechanism doing nothing; the hook in its default configuration and without the
    profiler, on the compiled path (where built) and on the Python one (the hooks made are
    appended to `hooks`, for the caller to close)."""
    x = torch.ones(1, 1)

    def timed(step: Callable[[], object]) -> Callable[[int], float]:
        def run(n: int) -> float:
            start = time.thread_time_ns()
            with torch.no_grad():
                for _ in range(n):
                    step()
            return (time.thread_time_ns() - start) / n / 1e3

        return run

    def loop(hook: Hook | None = None, mechanism: bool = False) -> Callable[[int], float]:
        model, optimizer = nothing_due_model(hook, mechanism)

        def step() -> None:
            model(x)
            optimizer.step()

        return timed(step)

    model, optimizer = nothing_due_model()
    first, second = Empty(), Empty()

    def yardstick() -> None:
        model(x)
        first(x)
        second(x)
        optimizer.step()

    variants = {"plain": loop(), "two empty calls": timed(yardstick), "mechanism": loop(mechanism=True)}
    paths = (True, False) if fastpath.compiled() is not None else (False,)
    for compiled in paths:
        path = "compiled" if compiled else "python"
        hooks += [hook_on_path(f"{root}/default_{path}", compiled), hook_on_path(f"{root}/noprof_{path}", compiled, profiler_config=ProfilerConfig.disabled())]
        variants[f"default, {path}"] = loop(hooks[-2])
        variants[f"no profiler, {path}"] = loop(hooks[-1])
    return variants


def nothing_due_cost(variants: dict[str, Callable[[int], float]], rounds: int, steps: int = 200) -> dict[str, list[float]]:
    """{name: what the variant adds to the plain step, in µs, one figure per round}: in each
    round every variant runs `steps` steps, in a new random order, and is compared with the
    plain loop of the same round (paired: drift and other load hit both alike). The step is
    as small as a step gets, so what a variant adds is its own work, dispatch included."""
    for run in variants.values():
        run(3000)  # warm up: specialized bytecode, caches, the first block of the meter
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            times[name].append(variants[name](steps))
    return {name: [t - p for t, p in zip(ts, times["plain"])] for name, ts in times.items() if name != "plain"}


def _tight_loop_empty_calls(rounds: int) -> float:
    """Two calls of an empty nn.Module in a loop of nothing else (best of `rounds` blocks),
    µs: what they cost with the interpreter's caches to themselves (the yardstick the
    earlier benches used; in a real step they cost more, as the paired figure shows)."""
    x, empty = torch.ones(1, 1), Empty()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time_ns()
        for _ in range(2000):
            empty(x)
            empty(x)
        best = min(best, (time.thread_time_ns() - start) / 2000 / 1e3)
    return best


def _steady_malloc() -> None:
    """Keep glibc from returning freed memory to the kernel between steps. Otherwise the
    gradients freed by zero_grad() come back as fresh pages (page faults) every step, in a
    way that depends on which of the two interleaved loops allocated last: the control row
    (plain against plain) then shows ratios like 0.7, larger than what is measured."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
            libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        except OSError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run (fewer blocks)")
    parser.add_argument("--blocks", type=int, default=None, help=f"blocks of {BLOCK_STEPS} steps per variant")
    parser.add_argument("--nothing-due-only", action="store_true", help="only the cost of a step where nothing is due")
    parser.add_argument(
        "--long-blocks", action="store_true",
        help="only config (a), the default (losses and metrics every step), in 1,000-step blocks interleaved with the plain loop, median of 5",
    )
    parser.add_argument(
        "--same-model", action="store_true",
        help="with --long-blocks: one model, the hook switched on and off between blocks (no second copy of the model, whose memory layout alone moves step time by percents here)",
    )
    parser.add_argument("--hold", action="store_true", help="with --same-model: the held scalar steps are not written during the blocks")
    args = parser.parse_args()
    blocks = args.blocks or (6 if args.quick else 40)
    torch.set_num_threads(1)
    _steady_malloc()
    logging.getLogger("stepscope").setLevel(logging.CRITICAL)  # keep the table readable

    print(f"torch {torch.__version__}, 1 thread; compiled hot path: {'built' if fastpath.compiled() is not None else 'NOT built'}")
    if args.long_blocks:
        if args.same_model:
            same_model_blocks(blocks=args.blocks or 5, hold=args.hold)
        else:
            long_blocks(blocks=args.blocks or 5)
        return
    rounds = 60 if args.quick else 400
    with tempfile.TemporaryDirectory() as root:
        hooks: list[Hook] = []
        added = nothing_due_cost(nothing_due_variants(root, hooks), rounds)
        for hook in hooks:
            hook.close()
    yardstick = statistics.median(added.pop("two empty calls"))
    tight = _tight_loop_empty_calls(15)
    print("a step where nothing is due: what the hook adds to the smallest step, against two calls of an empty")
    print(f"  nn.Module added to the same step ({yardstick:.2f} us; {tight:.2f} us in a loop of nothing else), medians of")
    print(f"  {rounds} paired rounds (goal: ratio <= 1)")
    for name, values in added.items():
        median = statistics.median(values)
        low, _, high = statistics.quantiles(values, n=4)
        if name == "mechanism":
            goal = ""
        elif name.endswith("python"):
            goal = "  (the Python path: where the extension is not built; no goal)"
        else:
            goal = f"  goal <= 1: {'met' if median <= yardstick else 'MISSED'}"
        print(
            f"  {name:22} adds {median:5.2f} us/step (quartiles {low:5.2f} .. {high:5.2f}); ratio {median / yardstick:4.2f}"
            f" (to the calls in a loop of nothing else: {median / tight:4.2f}){goal}",
            flush=True,
        )
    if args.nothing_due_only:
        return
    print(f"{blocks} blocks x {BLOCK_STEPS} steps per variant, medians per block")
    print(f"{'model':5} {'config':12} {'plain ms':>9} {'hooked ms':>10} {'wall ratio':>10} {'cpu ratio':>10}  goal (wall)")
    with tempfile.TemporaryDirectory() as root:
        for model_name, make_model in (("mlp", mlp), ("cnn", cnn)):
            for i, (config, (make_hook, goal)) in enumerate(CONFIGS.items()):
                result = measure(make_model, make_hook, blocks, f"{root}/{model_name}{i}")
                (plain_wall, plain_cpu), (hooked_wall, hooked_cpu) = result["plain"], result["hooked"]
                ratio = hooked_wall / plain_wall
                verdict = "" if goal is None else f"<= {goal:.2f} {'met' if ratio <= goal else 'MISSED'}"
                print(
                    f"{model_name:5} {config:12} {plain_wall * 1e3:9.3f} {hooked_wall * 1e3:10.3f} {ratio:10.3f} {hooked_cpu / plain_cpu:10.3f}  {verdict}",
                    flush=True,
                )


class Switch:
    """The hook of a `Loop` taken off and put back between blocks, without touching what the
    loop trains: the model's and the loss module's classes swapped back to their own, the
    optimizer's step hooks set aside. Plain and hooked blocks then run the same model, the
    same tensors at the same addresses; two copies of a model differ by several percent in
    step time on this machine (memory layout), more than the goal's 1 %. (The hook sees a
    gap in its steps, which the loop does not mind.)"""

    def __init__(self, loop: Loop) -> None:
        self.optimizer = loop.optimizer
        self.driven = {module: type(module) for module in (loop.model, loop.loss_fn)}
        self.hooks = (self.optimizer._optimizer_step_pre_hooks, self.optimizer._optimizer_step_post_hooks)

    def off(self) -> None:
        for module, driven in self.driven.items():
            module.__class__ = driven.__mro__[1]  # (drive_forward's class is a subclass of the module's own)
        self.optimizer._optimizer_step_pre_hooks, self.optimizer._optimizer_step_post_hooks = type(self.hooks[0])(), type(self.hooks[1])()

    def on(self) -> None:
        for module, driven in self.driven.items():
            module.__class__ = driven
        self.optimizer._optimizer_step_pre_hooks, self.optimizer._optimizer_step_post_hooks = self.hooks


def same_model_blocks(blocks: int, block_steps: int = 1000, hold: bool = False) -> None:
    """Config (a) against the plain loop on ONE model (`Switch`): blocks of the plain loop,
    the hooked loop and the plain loop again (the A/A row), in a new random order each
    round, medians per block; with each row the training thread's voluntary context
    switches per step (on Linux: its waits, for the GIL above all). `hold`: the held
    scalar steps are not written during the blocks (what the writer's background work
    costs the training thread is then left out)."""
    make_hook, goal = CONFIGS["a default"]
    assert goal is not None
    held_note = ", held steps not written during the blocks" if hold else ""
    print(f"default config, one model with the hook switched on and off{held_note}, {blocks} rounds x {block_steps} steps per variant; medians per block")
    with tempfile.TemporaryDirectory() as root:
        for model_name, make_model in (("mlp", mlp), ("cnn", cnn)):
            hook = make_hook(f"{root}/{model_name}-same")
            assert hook is not None
            if hold and hook._runtime.held is not None:
                hook._runtime.held.max_steps, hook._runtime.held.max_s = 1 << 40, 1e9  # (before the runs are armed)
            loop = Loop(make_model, hook)
            switch = Switch(loop)
            loop.run(1300)  # past the schedule's dense start
            times: dict[str, list[tuple[float, float]]] = {"plain": [], "plain again": [], "hooked": []}
            waits: dict[str, list[float]] = {name: [] for name in times}
            order = random.Random(0)
            for _ in range(blocks):
                names = list(times)
                order.shuffle(names)
                for name in names:
                    (switch.on if name == "hooked" else switch.off)()
                    switches = _voluntary_switches()
                    times[name].append(loop.run(block_steps))
                    waits[name].append((_voluntary_switches() - switches) / block_steps)
                    if hold and name == "hooked":
                        hook.flush()  # (outside the block's time)
            switch.on()
            hook.close()
            print(f"{model_name:5} voluntary context switches per step: " + ", ".join(f"{n} {statistics.median(w):.3f}" for n, w in waits.items()))
            (plain_wall, plain_cpu) = (statistics.median(t[i] for t in times["plain"]) for i in (0, 1))
            for label in ("plain again", "hooked"):
                wall, cpu = (statistics.median(t[i] for t in times[label]) for i in (0, 1))
                _long_row(model_name, label, (plain_wall, plain_cpu), (wall, cpu), goal if label == "hooked" else None, "(A/A: the resolution)")


def _voluntary_switches() -> int:
    """This thread's voluntary context switches so far (0 where getrusage cannot say)."""
    import resource

    who = getattr(resource, "RUSAGE_THREAD", None)
    return resource.getrusage(who).ru_nvcsw if who is not None else 0


def _long_row(model_name: str, label: str, plain: tuple[float, float], other: tuple[float, float], goal: float | None, control: str) -> None:
    """One row of the long-block tables: (wall, cpu) seconds per step of the plain loop and
    of the other; judged against `goal`, or printed as a control row."""
    ratio = other[0] / plain[0]
    verdict = f"goal <= {goal:.2f} {'met' if ratio <= goal else 'MISSED'}" if goal is not None else control
    print(
        f"{model_name:5} {label:11} plain {plain[0] * 1e3:.3f} ms, other {other[0] * 1e3:.3f} ms: wall ratio {ratio:.3f}, "
        f"cpu ratio {other[1] / plain[1]:.3f}, added {(other[0] - plain[0]) * 1e6:.1f} us/step  {verdict}",
        flush=True,
    )


def long_blocks(blocks: int, block_steps: int = 1000) -> None:
    """Config (a) against the plain loop in long blocks: what a job pays per step over
    stretches of many steps, the writer thread and the schedule's rare tensor steps included.
    Each model's plain loop is first timed against a second plain loop (an A/A row): two
    loops that do the same differ by this much on this machine at this moment, the
    resolution of the ratio below it."""
    make_hook, goal = CONFIGS["a default"]
    assert goal is not None
    print(f"default config, {blocks} blocks x {block_steps} steps per loop, interleaved; medians per block")
    with tempfile.TemporaryDirectory() as root:
        for model_name, make_model in (("mlp", mlp), ("cnn", cnn)):
            for label, make in (("A/A control", CONFIGS["A/A control"][0]), ("default", make_hook)):
                result = measure(make_model, make, blocks, f"{root}/{model_name}-long", block_steps)
                _long_row(model_name, label, result["plain"], result["hooked"], goal if label == "default" else None, "(plain against plain)")


if __name__ == "__main__":
    main()
