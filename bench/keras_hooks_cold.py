"""The Keras callback's two batch hooks called outside `fit`, hot and after a sweep of memory
that empties the CPU's caches (as a framework step does before them inside `fit`): the cost
of a loss-only step under the capture defaults as Python run from cold caches.

    python bench/keras_hooks_cold.py [--steps 500] [--sweep-mb 48] [--path compiled|python|driver]

Prints the median microseconds of `on_train_batch_begin` and `on_train_batch_end` per step,
hot (one step after another) and cold (the sweep between the calls, not timed). Their ratio
says how much of the hooks' time inside `fit` (bench_keras_callback.py's `hooks us`) is
cache misses rather than work: the count of objects and calls a step touches, not its
arithmetic. `--path` picks who runs those steps: the compiled routine batches (the default),
their Python twin, or the step driver (capture/routine_batches.py)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from bench_keras_callback import dense_model  # noqa: E402 (this folder, as the script runs from it)

from stepscope.capture import routine_batches  # noqa: E402
from stepscope.compiled import PURE_PYTHON_ENV  # noqa: E402
from stepscope_tf import StepscopeCallback  # noqa: E402


def _timed(callback: StepscopeCallback, steps: int, first: int, sweep: np.ndarray | None) -> tuple[float, float]:
    """Median ns of the begin and end hooks over `steps` steps numbered from `first`."""
    begins, ends = [], []
    for i in range(first, first + steps):
        if sweep is not None:
            sweep += 1.0
        start = time.perf_counter_ns()
        callback.on_train_batch_begin(i)
        begins.append(time.perf_counter_ns() - start)
        if sweep is not None:
            sweep += 1.0
        start = time.perf_counter_ns()
        callback.on_train_batch_end(i, {"loss": 2.3 + i * 1e-4})
        ends.append(time.perf_counter_ns() - start)
    return statistics.median(begins), statistics.median(ends)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="steps per measurement")
    parser.add_argument("--sweep-mb", type=int, default=48, help="memory swept between the calls (more than the last-level cache)")
    parser.add_argument("--path", choices=("compiled", "python", "driver"), default="compiled", help="who runs the loss-only steps")
    args = parser.parse_args()
    if args.path == "python":
        os.environ[PURE_PYTHON_ENV] = "1"  # (read when the callback is made)
    elif args.path == "driver":
        routine_batches.arm = lambda batches, hook, mode: None  # never armed: every batch takes the step driver's path
    root = tempfile.mkdtemp(prefix="keras_hooks_cold_")
    try:
        model = dense_model(256)
        rng = np.random.RandomState(0)
        x, y = rng.randn(320, 256).astype("float32"), rng.randint(0, 10, 320)
        callback = StepscopeCallback(os.path.join(root, "job"))
        # A real fit first (the callback attaches, the dense schedule's first steps pass),
        # then the hooks alone, past the dense schedule: loss-only steps.
        model.fit(x, y, batch_size=64, verbose=0, callbacks=[callback])
        callback.set_model(model)
        sweep = np.ones(args.sweep_mb << 18, dtype=np.float32)
        first = 1000
        _timed(callback, 100, first, None)  # warm-up
        hot = _timed(callback, args.steps, first + 100, None)
        cold = _timed(callback, args.steps, first + 100 + args.steps, sweep)
        callback.close()
        print(f"keras {keras.__version__}; the callback's batch hooks per loss-only step on the {args.path} path "
              f"({callback._routine.steps} steps run by {type(callback._routine).__name__}), medians of {args.steps} steps (us)")
        print(f"{'':6}{'begin':>8}{'end':>8}{'total':>8}")
        for name, (begin, end) in (("hot", hot), ("cold", cold)):
            print(f"{name:6}{begin / 1e3:8.1f}{end / 1e3:8.1f}{(begin + end) / 1e3:8.1f}")
        print(f"cold / hot: {(cold[0] + cold[1]) / (hot[0] + hot[1]):.1f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
