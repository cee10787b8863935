"""What a job saved, counted on the training side, against what the default rules need to
judge it: at close the hook says in one line when the job saved too little (a 50-step job
with losses saved once) and records it in `stepscope-status/<worker>_evidence.json`.
The counts mirror the rules' own needs (stepscope.rules; kept here as numbers because the
training side imports nothing of the analysis side)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..modes import ModeKeys

# LossNotDecreasing's shortest judgement: 6 windows of 5 saved TRAIN losses.
MIN_TRAIN_LOSSES = 30
# VanishingGradient's persistence (patience) in the default set.
MIN_GRADIENT_STEPS = 3
TOO_LITTLE_DATA = "too little data"


class SavedEvidence:
    """Counts the saved TRAIN steps holding a loss, holding a gradient, and the saved EVAL
    steps holding a loss. `note` runs once per written step (names are that step's tensors)."""

    def __init__(self, loss_names: set[str], gradient_names: set[str] | None = None):
        # The losses and gradients collections' names (sets that grow as tensors come):
        # two set tests per written step, no scan of the step's names.
        self._loss_names = loss_names
        self._gradient_names = gradient_names if gradient_names is not None else set()
        self.train_losses = 0
        self.train_gradients = 0
        self.eval_losses = 0

    def note(self, mode: ModeKeys, tensors: Mapping[str, Any] | Iterable[str]) -> None:
        has_loss = not self._loss_names.isdisjoint(tensors)
        if mode == ModeKeys.TRAIN:
            self.train_losses += has_loss
            self.train_gradients += not self._gradient_names.isdisjoint(tensors)
        elif mode == ModeKeys.EVAL:
            self.eval_losses += has_loss

    def shortfall(self, gradients: bool = False) -> str | None:
        """One line naming what the default rules lack, or None when nothing is short.
        `gradients`: the job included the gradients collection (otherwise not counted)."""
        short, advice = [], []
        if self.train_losses < MIN_TRAIN_LOSSES:
            short.append(f"{self.train_losses} TRAIN steps with a loss (the loss rules need {MIN_TRAIN_LOSSES})")
            advice.append("save the loss every step with hook.save_loss or register_loss")
        if gradients and self.train_gradients < MIN_GRADIENT_STEPS:
            short.append(f"{self.train_gradients} TRAIN steps with gradients (VanishingGradient needs {MIN_GRADIENT_STEPS})")
            advice.append("save gradients more often with a smaller save_interval")
        if not short:
            return None
        # Only the advice for what is short: a job that saved its loss every step is not told to.
        return ("this job saved " + " and ".join(short) + "; stepscope check will say 'not enough data' for those rules ("
                + ", ".join(advice) + ", or train longer)")

    def to_json(self) -> dict[str, int]:
        return {"train_loss_steps": self.train_losses, "train_gradient_steps": self.train_gradients, "eval_loss_steps": self.eval_losses}


__all__ = ["SavedEvidence", "MIN_TRAIN_LOSSES", "MIN_GRADIENT_STEPS", "TOO_LITTLE_DATA"]
