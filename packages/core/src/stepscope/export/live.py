"""The hook's live TensorBoard output (`tensorboard_dir=`): every saved step of a worker as
TensorBoard scalars and histograms while the job runs. Registered with the training side
as the hook output "tensorboard" (stepscope.capture.hook_outputs), which imports it only
when a hook asks for it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..capture.hook_outputs import OutputRequest
from ..modes import ModeKeys


class LiveTensorBoard:
    """A writer-thread listener writing this worker's run(s) under `logdir`."""

    def __init__(self, logdir: str, worker: str, several_workers: bool):
        self.logdir, self.worker, self.several = logdir, worker, several_workers
        self.writer: Any = None

    def attach(self, writer: Any) -> None:
        from .tb_writer import TensorBoardWriter

        self.writer = TensorBoardWriter(self.logdir)
        writer.step_listeners.append(self)

    def __call__(self, step: int, mode: ModeKeys, mode_step: int, arrays: dict[str, np.ndarray]) -> None:
        from .tensorboard import run_name, summary_values

        values, _, _ = summary_values(arrays)
        if values:
            self.writer.add_values(run_name(mode, self.worker, self.several), step, values)
            self.writer.flush()  # TensorBoard shows live values only once they are on disk

    def close(self, store: Any = None, writer: Any = None) -> None:
        if self.writer is not None:
            self.writer.close()


def live_tensorboard(request: OutputRequest) -> LiveTensorBoard:
    """The "tensorboard" hook output's factory: `request.setting` is the folder."""
    return LiveTensorBoard(str(request.setting), request.worker, request.several_workers)
