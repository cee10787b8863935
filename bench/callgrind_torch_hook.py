"""Instructions a step where nothing is due costs the training thread, counted by valgrind's
callgrind: the same comparison as `bench_torch_hook.py --nothing-due-only` (the hook's
added cost against two calls of an empty nn.Module), in a unit other load on the machine
cannot change. Time on a shared machine moves with what else runs (caches, the other
hyperthread); instruction counts do not, so this is the figure to compare across commits.
Instructions are not time (a cache miss costs more than an add), so the time ratio of
bench_torch_hook.py on a quiet machine stays the goal's measure.

Needs valgrind, a C compiler and valgrind's headers (`apt-get install valgrind gcc`): a
tiny library built on the fly lets the measured process switch counting on and off around
each variant, so that importing torch (billions of instructions) is not counted. Takes
about a minute. Not run by `nox -s bench` (which runs the bench_*.py scripts).

`--default-config`: instead, a small training step (Linear-ReLU-Linear, CrossEntropyLoss,
Adam) plain and with the hook in its default configuration (the loss saved every step),
past the dense start of the tensor schedule (steps 1,200 on), the held steps' hand-over to
the writer included (every 100 steps; count a multiple of 100), the closing flush not (it
drains the step timeline on the calling thread, which its flush thread does in training):
what a step that saves only the loss costs the training thread. `--model mlp`: the same with
bench_torch_hook.py's MLP (784-512-256-10, batch 64), the model of its 1.01 goal (about
about 8 minutes for `--steps 10`: valgrind runs its kernels far slower than the small
model's, so the count leaves out the release of the held steps every 100 steps, about 1-2 k
instructions per step by the small model's count; the hook is numbered past the dense
start, not run through it)."""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_CONTROL_C = """
#include <valgrind/callgrind.h>
void measure_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void measure_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
void measure_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
"""
VARIANTS = (
    "plain", "two empty calls in the step", "mechanism", "default, compiled", "no profiler, compiled",
    "default, python", "no profiler, python", "two empty calls alone",
)


def _child(control: str, steps: int) -> None:
    """Run in the measured process: each variant's steps between two dumps."""
    import logging

    import torch
    from bench_torch_hook import Empty, hook_on_path, nothing_due_model  # (this folder is the script's)

    from stepscope.config import ProfilerConfig
    from stepscope_torch import Hook, fastpath

    lib = ctypes.CDLL(control)
    logging.getLogger("stepscope").setLevel(logging.CRITICAL)
    torch.set_num_threads(1)
    x = torch.ones(1, 1)
    out = tempfile.mkdtemp()

    def loop(hook: Hook | None = None, mechanism: bool = False):
        model, optimizer = nothing_due_model(hook, mechanism)

        def run(n: int) -> None:
            with torch.no_grad():
                for _ in range(n):
                    model(x)
                    optimizer.step()

        return run

    empty = Empty()

    def empty_calls(n: int) -> None:
        for _ in range(n):
            empty(x)
            empty(x)

    model, optimizer = nothing_due_model()

    def with_empty_calls(n: int) -> None:
        with torch.no_grad():
            for _ in range(n):
                model(x)
                empty(x)
                empty(x)
                optimizer.step()

    compiled = fastpath.compiled() is not None
    runs = {
        "plain": loop(),
        "two empty calls in the step": with_empty_calls,
        "mechanism": loop(mechanism=True),
        # (Without the extension both paths are the Python one: the figures say so.)
        "default, compiled": loop(hook_on_path(f"{out}/default_c", compiled)),
        "no profiler, compiled": loop(hook_on_path(f"{out}/noprof_c", compiled, profiler_config=ProfilerConfig.disabled())),
        "default, python": loop(hook_on_path(f"{out}/default_py", False)),
        "no profiler, python": loop(hook_on_path(f"{out}/noprof_py", False, profiler_config=ProfilerConfig.disabled())),
        "two empty calls alone": empty_calls,
    }
    assert list(runs) == list(VARIANTS)
    for run in runs.values():
        run(300)  # warm up: specialized bytecode, caches, the first block of the meter
    lib.measure_start()
    for name, run in runs.items():
        lib.measure_dump(f"before {name}".encode())
        run(steps)
        lib.measure_dump(f"after {name}".encode())
    lib.measure_stop()
    os._exit(0)  # no teardown to count or wait for


DEFAULT_VARIANTS = ("plain training step", "default config")


def _child_default_config(control: str, steps: int, model_name: str = "small") -> None:
    """Run in the measured process: a plain and a hooked training step, each between two dumps."""
    import logging

    import torch
    from torch import nn

    from stepscope_torch import Hook

    lib = ctypes.CDLL(control)
    logging.getLogger("stepscope").setLevel(logging.CRITICAL)
    torch.set_num_threads(1)

    def loop(hooked: bool):
        torch.manual_seed(0)
        if model_name == "mlp":
            from bench_torch_hook import mlp  # (this folder is the script's)

            model, shape = mlp()
            x, y = torch.randn(*shape), torch.randint(0, 10, (shape[0],))
        else:
            model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
        loss_fn = nn.CrossEntropyLoss()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        hook = Hook(tempfile.mkdtemp()) if hooked else None
        if hook is not None:
            hook.register_module(model)
            hook.register_loss(loss_fn)
            hook.register_optimizer(optimizer)

        def run(n: int) -> None:
            for _ in range(n):
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()

        return run, hook

    runs = dict(zip(DEFAULT_VARIANTS, (loop(False), loop(True))))
    for run, hook in runs.values():
        if model_name == "mlp":
            # Under valgrind 1,200 MLP steps take many minutes: the hook is numbered past the
            # schedule's dense start instead (a resumed job's way), then warmed up.
            if hook is not None:
                hook.load_state_dict({"global_step": 1200, "mode_steps": {"TRAIN": 1200}})
            run(10)
        else:
            run(1200)  # past the schedule's dense start: from here on only the loss is due
        if hook is not None:
            hook.flush()
    lib.measure_start()
    for name, (run, hook) in runs.items():
        lib.measure_dump(f"before {name}".encode())
        run(steps)
        lib.measure_dump(f"after {name}".encode())
        if hook is not None:
            # Not counted: flush() drains the step timeline on the calling thread (in training
            # its flush thread does), a cost per flush that would swamp a short count.
            hook.flush()
    lib.measure_stop()
    os._exit(0)


def _build_control(where: Path) -> str | None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source, library = where / "control.c", where / "libcontrol.so"
    source.write_text(_CONTROL_C)
    built = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], capture_output=True, text=True)
    return str(library) if built.returncode == 0 else None


def _main_thread_totals(where: Path) -> dict[str, int]:
    """{dump name: instructions} of the main thread's dumps (files out.<dump>-01)."""
    totals = {}
    for path in where.glob("out.*-01"):
        text = path.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if trigger and total:
            totals[trigger.group(1)] = int(total.group(1))
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="steps counted per variant")
    parser.add_argument("--default-config", action="store_true", help="a training step with the default config instead (see above)")
    parser.add_argument("--model", choices=("small", "mlp"), default="small", help="with --default-config: the model (see above)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.default_config:
            _child_default_config(args.child, args.steps, args.model)
        else:
            _child(args.child, args.steps)
        return
    if shutil.which("valgrind") is None:
        print("skipped: valgrind is not installed (apt-get install valgrind)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        control = _build_control(where)
        if control is None:
            print("skipped: cannot build the callgrind control library (a C compiler and valgrind/callgrind.h are needed)")
            return
        command = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
            f"--callgrind-out-file={where}/out", sys.executable, __file__, "--child", control, "--steps", str(args.steps),
        ] + (["--default-config", "--model", args.model] if args.default_config else [])
        done = subprocess.run(command, capture_output=True, text=True)
        totals = _main_thread_totals(where)
        if any(f"after {v}" not in totals for v in (DEFAULT_VARIANTS if args.default_config else VARIANTS)):
            print(f"no counts (valgrind exit {done.returncode}):\n{done.stderr[-2000:]}")
            sys.exit(1)
    if args.default_config:
        plain, hooked = (totals[f"after {v}"] / args.steps for v in DEFAULT_VARIANTS)
        model = "the MLP" if args.model == "mlp" else "the small model"
        print(f"instructions per step of {model} (training thread, callgrind, {args.steps} steps each, past the schedule's dense start): plain {plain:,.0f},")
        print(f"  default config {hooked:,.0f}: the hook adds {hooked - plain:,.0f} ({hooked / plain:.3f}x)")
        return
    per_step = {v: totals[f"after {v}"] / args.steps for v in VARIANTS}
    in_step = per_step["two empty calls in the step"] - per_step["plain"]
    alone = per_step["two empty calls alone"]
    print(f"instructions per step (training thread, callgrind, {args.steps} steps each); two empty nn.Module calls add {in_step:,.0f}")
    print(f"  to the step ({alone:,.0f} in a loop of nothing else)")
    for variant in VARIANTS[2:-1]:
        added = per_step[variant] - per_step["plain"]
        goal = "" if variant == "mechanism" or variant.endswith("python") else f" (goal <= 1: {'met' if added <= in_step else 'MISSED'})"
        print(f"  {variant:22} adds {added:8,.0f}; ratio to two empty calls {added / in_step:5.2f} (alone: {added / alone:5.2f}){goal}")


if __name__ == "__main__":
    main()
