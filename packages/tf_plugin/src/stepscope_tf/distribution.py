"""Which worker this process is, for tf.distribute jobs.

One process is one stepscope worker (`worker_<rank>`), whatever the number of replicas
(devices) it drives: MirroredStrategy on one host is `worker_0`. Multi-worker jobs are
described by TF_CONFIG; the chief (or worker 0 when there is no chief) is rank 0."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from stepscope.exceptions import ConfigError


def rank_from_tf_config(tf_config: Mapping[str, Any] | str | None = None) -> tuple[int, int]:
    """(rank, world_size) from TF_CONFIG (the environment's when None); (0, 1) without one.

    Ranks: chief 0, then the `worker` tasks in order. Parameter servers and evaluators
    do not train and are not counted in world_size."""
    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG") or None
    if not tf_config:
        return 0, 1
    if isinstance(tf_config, str):
        try:
            tf_config = json.loads(tf_config)
        except ValueError as exc:
            raise ConfigError(f"TF_CONFIG is not valid JSON: {exc}") from None
    if not isinstance(tf_config, Mapping):
        raise ConfigError(f"TF_CONFIG must be a JSON object, got {tf_config!r}")
    cluster = tf_config.get("cluster") or {}
    task = tf_config.get("task") or {}
    chiefs = len(cluster.get("chief") or ())
    workers = len(cluster.get("worker") or ())
    world = max(chiefs + workers, 1)
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if kind == "chief":
        return 0, world
    if kind == "worker":
        return chiefs + index, world
    # ps / evaluator: ranks after the training workers, so they never pose as rank 0.
    return world + index, world
