"""The PyTorch part of the demo job: a small classifier trained on CPU with synthetic data,
once with the Lightning callback and once with a plain loop and the Hook; then what was
saved is read back with stepscope.create_trial and printed.

Run alone with `python demo/torch_demo.py [out_root]`; demo/run_demo.py calls `run`."""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch
from torch import nn

import stepscope
from stepscope.config import Collection, ReductionConfig, SaveConfig

FEATURES, CLASSES = 20, 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def _dataset(n: int, seed: int) -> torch.utils.data.TensorDataset:
    """Points around one centre per class: learnable, so the loss visibly falls."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(42)) * 0.5
    labels = torch.randint(0, CLASSES, (n,), generator=generator)
    return torch.utils.data.TensorDataset(centres[labels] + 1.5 * torch.randn(n, FEATURES, generator=generator), labels)


def _options() -> dict:
    """What both runs save: weights, biases, gradients every 10 steps with a few reductions,
    losses and metrics every step (the loss rules judge trends in windows of saved losses),
    ReLU outputs (chosen by module name) every 50."""
    return dict(
        save_config=SaveConfig(save_interval=10),
        reduction_config=ReductionConfig(reductions=("mean", "std"), norms=("l2",), save_raw_tensor=True),
        include_collections=["weights", "biases", "gradients"],
        collections=[
            # Scalars: their raw values, not the reductions asked for the tensors above.
            Collection("losses", save_config=SaveConfig(save_interval=1), reduction_config=ReductionConfig()),
            Collection("metrics", save_config=SaveConfig(save_interval=1), reduction_config=ReductionConfig()),
            Collection("relu_outputs", include_regex=[r"^[13]_output_0$"], save_config=SaveConfig(save_interval=50)),
        ],
    )


def train_plain(out_dir: str, epochs: int = 3) -> None:
    from stepscope_torch import Hook

    model, loss_fn = _model(), nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    train = torch.utils.data.DataLoader(_dataset(2048, 1), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    val = torch.utils.data.DataLoader(_dataset(256, 2), batch_size=64)
    with Hook(out_dir, **_options()) as hook:
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
        for _ in range(epochs):
            model.train()
            for x, y in train:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
            model.eval()
            correct = 0
            with torch.no_grad():
                for x, y in val:
                    correct += int((model(x).argmax(1) == y).sum())
            hook.save_scalar("val_accuracy", correct / len(val.dataset))  # lands in the last EVAL step


def train_lightning(out_dir: str, epochs: int = 3) -> None:
    import lightning.pytorch as pl

    from stepscope_torch import StepscopeCallback

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _model()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            loss = nn.functional.cross_entropy(self(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self(x), y))
            self.log("val_accuracy", (self(x).argmax(1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    options = _options()
    # Lightning's module names its layers net.0, net.2, ...
    options["collections"][2] = Collection("relu_outputs", include_regex=[r"^net\.[13]_output_0$"], save_config=SaveConfig(save_interval=50))
    callback = StepscopeCallback(out_dir, **options)
    trainer = pl.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )
    trainer.fit(
        Classifier(),
        torch.utils.data.DataLoader(_dataset(2048, 1), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)),
        torch.utils.data.DataLoader(_dataset(256, 2), batch_size=64),
    )
    callback.close()


def describe(out_dir: str) -> None:
    """Print what a job saved, read back the way any analysis would."""
    trial = stepscope.create_trial(out_dir)
    train_steps = trial.steps(mode="train")
    eval_steps = trial.steps(mode="eval")
    print(f"  {out_dir}")
    print(f"  workers {trial.workers()}, complete: {trial.is_complete()}")
    print(f"  steps saved: {len(trial.steps())} (TRAIN mode steps {train_steps[:4]}...{train_steps[-1]}, EVAL {len(eval_steps)})")
    for name, collection in sorted(trial.collections().items()):
        if collection.tensor_names:
            names = sorted(collection.tensor_names)
            print(f"  collection {name:15} {len(names):3} tensors, e.g. {', '.join(names[:3])}")
    losses = [n for n in trial.tensor_names(collection="losses")]
    if losses:
        loss = trial.tensor(losses[0])
        steps = loss.steps(mode="train")
        values = [float(loss.value(s, mode="train")) for s in steps]
        print(f"  {losses[0]}: TRAIN step {steps[0]} {values[0]:.3f} -> step {steps[-1]} {values[-1]:.3f}")
    grad = trial.tensor("gradient/0.weight" if trial.has_tensor("gradient/0.weight") else "gradient/net.0.weight")
    first, last = grad.steps(mode="train")[0], grad.steps(mode="train")[-1]
    print(
        f"  {grad.name}: l2 norm at TRAIN step {first} {grad.reduction_value(first, 'l2', mode='train'):.4f}, "
        f"at step {last} {grad.reduction_value(last, 'l2', mode='train'):.4f}"
    )
    for metric in ("val_accuracy", "val_loss"):
        if trial.has_tensor(metric):
            tensor = trial.tensor(metric)
            values = [round(float(tensor.value(s, mode="eval")), 3) for s in tensor.steps(mode="eval")]
            print(f"  {metric} after each validation: {values}")


def run(out_root: str) -> list[str]:
    """Train both ways under `out_root`; returns the two jobs' folders."""
    out_dirs = []
    for label, train in (("lightning", train_lightning), ("plain-loop", train_plain)):
        out_dir = os.path.join(out_root, f"torch-{label}")
        start = time.perf_counter()
        train(out_dir)
        print(f"[torch demo] {label}: trained in {time.perf_counter() - start:.1f} s; saved:")
        describe(out_dir)
        out_dirs.append(out_dir)
    return out_dirs


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="stepscope-demo-"))
