"""StepscopeCallback in a real Hugging Face Trainer: a small BERT classifier built from a
config (random weights, no download), trained on CPU with gradient accumulation. Saved
values are compared with what a callback of the test read from the model itself and with
what the Trainer logged."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import stepscope
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.modes import ModeKeys

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class Recorder(transformers.TrainerCallback):
    """What the model and optimizer held at each update, read without stepscope."""

    def __init__(self):
        self.weights, self.grads, self.lrs, self.logs, self.losses = [], [], [], [], []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.register_forward_hook(lambda module, args, output: self.losses[-1].append(output.loss.item()) if module.training else None)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
        self.losses.append([])

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        self.lrs.append(optimizer.param_groups[0]["lr"])

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append((state.global_step, dict(logs or {})))


def tiny_bert():
    config = transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=3,
    )
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 40, (n, 8), generator=generator)
        self.labels = (self.ids[:, 0] % 3).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": self.labels[i]}


def test_trainer_with_gradient_accumulation(tmp_path):
    from stepscope_torch.hf import StepscopeCallback

    out_dir = str(tmp_path / "job")
    callback = StepscopeCallback(
        out_dir, save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"],
        profiler_config=ProfilerConfig(system_monitor=False),
    )
    recorder = Recorder()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=8,
        learning_rate=1e-3, logging_steps=1, eval_strategy="steps", eval_steps=4, per_device_eval_batch_size=8,
        report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0,
    )
    trainer = transformers.Trainer(
        model=tiny_bert(), args=args, train_dataset=Tokens(64, 1), eval_dataset=Tokens(16, 2), callbacks=[recorder, callback],
    )
    trainer.train()
    trial = stepscope.create_trial(out_dir)  # readable when train() returns
    callback.close()
    trial = stepscope.create_trial(out_dir)

    assert trial.steps(mode=ModeKeys.TRAIN) == list(range(8))  # one per update, not per micro-batch
    assert len(trial.steps(mode=ModeKeys.EVAL)) == 2  # the two evaluations
    names = set(trial.tensor_names())
    assert "bert.encoder.layer.1.attention.self.query.weight" in names and "gradient/classifier.weight" in names
    for mode_step in (0, 3, 7):
        step = trial.global_step(ModeKeys.TRAIN, mode_step)
        for name, value in recorder.weights[mode_step].items():
            if name in names:
                np.testing.assert_array_equal(trial.tensor(name).value(step), value.numpy(), err_msg=name)
        for name, value in recorder.grads[mode_step].items():
            np.testing.assert_array_equal(trial.tensor(f"gradient/{name}").value(step), value.numpy(), err_msg=name)
        assert float(trial.tensor("learning_rate").value(step)) == pytest.approx(recorder.lrs[mode_step], rel=1e-6)
    train_logs = {step: logs for step, logs in recorder.logs if "loss" in logs}
    for mode_step in range(8):
        step = trial.global_step(ModeKeys.TRAIN, mode_step)
        assert len(recorder.losses[mode_step]) == 2  # two micro-batches
        saved = float(trial.tensor("loss_output_0").value(step))
        assert saved == pytest.approx(np.mean(recorder.losses[mode_step]), rel=1e-6)
        assert float(trial.tensor("grad_norm").value(step)) == pytest.approx(train_logs[mode_step + 1]["grad_norm"], rel=1e-5)
    eval_logs = [logs for _, logs in recorder.logs if "eval_loss" in logs]
    assert len(eval_logs) == 2
    for mode_step, logs in enumerate(eval_logs):
        assert float(trial.tensor("eval_loss").value(mode_step, mode=ModeKeys.EVAL)) == pytest.approx(logs["eval_loss"], rel=1e-6)
        assert float(trial.tensor("loss_output_0").value(mode_step, mode=ModeKeys.EVAL)) == pytest.approx(logs["eval_loss"], rel=1e-6)
    assert trial.is_complete()
    assert trial.failed_workers() == {}
