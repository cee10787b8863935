"""The job bench_rules.py and bench_report.py measure: a 16-32-32-1 MLP's weights, biases
and their gradients (raw) and its loss every TRAIN step, an EVAL loss every 100 steps,
written with the core Writer. Not a bench itself (nox's bench session runs bench_*.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys

SHAPES = {"layers.0.weight": (32, 16), "layers.0.bias": (32,), "layers.1.weight": (32, 32), "layers.1.bias": (32,), "layers.2.weight": (1, 32), "layers.2.bias": (1,)}
BUILTIN_REGEXES = {"weights": [r"^(?!gradient).*weight"], "biases": [r"^(?!gradient).*bias"], "gradients": [r"^gradient"], "losses": [r"[Ll]oss_(?!input).*output"]}
LOSS = "MSELoss_output_0"


def mlp_steps(steps: int, rng: np.random.Generator) -> Iterator[tuple[int, ModeKeys, int, dict[str, np.ndarray]]]:
    """(global step, mode, mode step, tensors) of `steps` TRAIN steps of SGD on random
    gradients, with an EVAL step after every 100th: the loss falls as 10 / (1 + step)."""
    weights = {name: rng.standard_normal(shape).astype(np.float32) * 0.1 for name, shape in SHAPES.items()}
    global_step, eval_step = 0, 0
    for step in range(steps):
        tensors = {}
        for name, value in weights.items():
            gradient = rng.standard_normal(value.shape).astype(np.float32) * 0.01
            tensors[name] = value.copy()
            tensors[f"gradient/{name}"] = gradient
            value -= 0.1 * gradient
        tensors[LOSS] = np.float32(10.0 / (1 + step))
        yield global_step, ModeKeys.TRAIN, step, tensors
        global_step += 1
        if (step + 1) % 100 == 0:
            yield global_step, ModeKeys.EVAL, eval_step, {LOSS: np.float32(10.5 / (1 + step))}
            global_step, eval_step = global_step + 1, eval_step + 1


def write_mlp_job(out_dir: Path, steps: int, rng: np.random.Generator, after_train_step: Callable[[int, int], None] | None = None) -> None:
    """Write the job to `out_dir`; `after_train_step(global step, mode step)` runs after each
    TRAIN step is handed to the writer (the report bench adds its timeline there)."""
    with Writer(str(out_dir)) as writer:
        writer.write_collections(CollectionManager(builtin_regexes=BUILTIN_REGEXES).dumps())
        for global_step, mode, mode_step, tensors in mlp_steps(steps, rng):
            writer.write_step(global_step, mode, mode_step, tensors)
            if mode is ModeKeys.TRAIN and after_train_step is not None:
                after_train_step(global_step, mode_step)
