"""Keras step time with StepscopeCallback against without it, side by side in one process:
fits of the same model alternate between the configurations (interleaved, so drift of the
machine hits all alike) and the median step time of each is compared.

Configurations: "without (A/A)" (a second model without the callback: the noise floor of
the ratios on this machine), "empty batch hooks" (a callback whose batch hooks do nothing:
what Keras charges any callback that has them), default (`StepscopeCallback(out_dir)`: losses and metrics
every step, tensors on the default schedule, system monitor and step timeline on),
weights+gradients every 10 steps, everything every step.
Goals: ratio <= 1.01 (default) and <= 1.05 (weights+gradients every 10 steps).

The wall ratios of a 2-core machine shared with others move by more than the goal (see the
A/A line), so the callback's own time in its batch hooks is measured too (timers around
them, a fraction of a microsecond each): what it takes from the training thread at each
step, as a share of the step without it. It leaves out what having batch hooks costs Keras
(it hands such callbacks its logs as Python numbers) and what the writer's thread takes."""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from stepscope.config import SaveConfig  # noqa: E402
from stepscope_tf import StepscopeCallback  # noqa: E402

GOALS = {"default": 1.01, "weights+gradients /10": 1.05}


class _HookTimer:
    """Seconds spent in a callback's train batch hooks, timed around each call (the hooks
    are replaced on the instance: Keras decides which hooks a callback has by its class)."""

    def __init__(self, callback: keras.callbacks.Callback):
        self.seconds = 0.0
        for name in ("on_train_batch_begin", "on_train_batch_end"):
            setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook):
        def timed(batch, logs=None):
            start = time.perf_counter()
            try:
                return hook(batch, logs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


class _EmptyBatchHooks(keras.callbacks.Callback):
    """A callback whose batch hooks do nothing: what any callback with batch hooks costs
    in Keras (which then hands it the logs as Python numbers at every step)."""

    def on_train_batch_begin(self, batch, logs=None):
        pass

    def on_train_batch_end(self, batch, logs=None):
        pass


class _Clock(keras.callbacks.Callback):
    """Times the batch loop of one fit; no batch hooks, so Keras's dispatch is unchanged."""

    def on_train_begin(self, logs=None):
        self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def on_train_end(self, logs=None):
        self.elapsed = time.perf_counter() - self.start
        # CPU time of the whole process (TF's threads, stepscope's writer and monitor
        # included): a second view, less sensitive to other processes on a busy machine.
        self.cpu = time.process_time() - self.cpu_start


def dense_model(width: int) -> keras.Model:
    """The benches' Keras model: Dense `width` x3 (relu) and a 10-way head, Adam, fixed seed."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((width,))
    hidden = inputs
    for i in range(3):
        hidden = keras.layers.Dense(width, activation="relu", name=f"dense_{i}")(hidden)
    outputs = keras.layers.Dense(10, name="head")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _configs(root: str) -> dict[str, StepscopeCallback | None]:
    return {
        "without": None,
        "without (A/A)": None,
        "empty batch hooks": _EmptyBatchHooks(),
        "default": StepscopeCallback(os.path.join(root, "default")),
        "weights+gradients /10": StepscopeCallback(
            os.path.join(root, "wg10"), save_config=SaveConfig(save_interval=10), include_collections=["weights", "biases", "gradients"]
        ),
        "all every step": StepscopeCallback(os.path.join(root, "all"), save_config=SaveConfig(save_interval=1), save_all=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (a smoke run)")
    parser.add_argument("--width", type=int, default=256, help="units per Dense layer")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    steps, rounds = (50, 3) if args.quick else (200, 7)

    rng = np.random.RandomState(0)
    x = rng.randn(steps * args.batch, args.width).astype("float32")
    y = rng.randint(0, 10, size=len(x))
    root = tempfile.mkdtemp(prefix="bench_keras_")
    configs = _configs(root)
    models = {name: dense_model(args.width) for name in configs}
    times: dict[str, list[float]] = {name: [] for name in configs}
    timers = {name: _HookTimer(callback) for name, callback in configs.items() if callback is not None}
    own: dict[str, list[float]] = {name: [] for name in timers}
    cpu: dict[str, list[float]] = {name: [] for name in configs}
    try:
        for name, model in models.items():  # warm-up: tracing, first-step saves
            extra = [configs[name]] if configs[name] else []
            model.fit(x[: 5 * args.batch], y[: 5 * args.batch], batch_size=args.batch, epochs=1, verbose=0, callbacks=extra)
        order = random.Random(0)
        for _ in range(rounds):
            # A new order each round, and garbage and dirty pages settled before each fit:
            # what one fit leaves behind is not always paid by the same next configuration.
            for name in order.sample(list(models), len(models)):
                model = models[name]
                gc.collect()
                os.sync()
                clock = _Clock()
                timer = timers.get(name)
                before = timer.seconds if timer is not None else 0.0
                extra = [configs[name]] if configs[name] else []
                model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[clock, *extra])
                times[name].append(clock.elapsed / steps)
                cpu[name].append(clock.cpu / steps)
                if timer is not None:
                    own[name].append((timer.seconds - before) / steps)
    finally:
        for callback in configs.values():
            if isinstance(callback, StepscopeCallback):
                callback.close()
        shutil.rmtree(root, ignore_errors=True)

    base, cpu_base = statistics.median(times["without"]), statistics.median(cpu["without"])
    print(f"keras {keras.__version__}, backend {keras.backend.backend()}, {steps} steps x {rounds} rounds, Dense {args.width} x3, batch {args.batch}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'configuration':<24}{'step ms':>9}{'ratio':>8}{'cpu ms':>9}{'ratio':>8}{'hooks us':>10}{'ratio':>8}  goal (wall ratio; hooks' ratio)")
    for name in configs:
        median, cpu_median = statistics.median(times[name]), statistics.median(cpu[name])
        ratio = median / base
        hooks, hooks_ratio = "", ""
        own_ratio = None
        if name in own:
            own_s = statistics.median(own[name])
            own_ratio = (base + own_s) / base
            hooks, hooks_ratio = f"{own_s * 1e6:>10.1f}", f"{own_ratio:>8.3f}"
        goal = GOALS.get(name)
        verdict = ""
        if goal is not None:
            verdict = f"<= {goal:.2f} {'ok' if ratio <= goal else 'MISSED'}; {'ok' if own_ratio is not None and own_ratio <= goal else 'MISSED'}"
        print(f"{name:<24}{median * 1e3:>9.3f}{ratio:>8.3f}{cpu_median * 1e3:>9.3f}{cpu_median / cpu_base:>8.3f}{hooks:>10}{hooks_ratio:>8}  {verdict}")


if __name__ == "__main__":
    main()
