"""Real training runs for the rule tests: small torch models trained on CPU, saved through
core's HookBase (the same path the framework plugins use), each planting the condition
one rule looks for, plus healthy controls. Runs are made once per session."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from stepscope.capture.hook import HookBase
from stepscope.config import Collection, ProfilerConfig, SaveConfig
from stepscope.modes import ModeKeys

torch = pytest.importorskip("torch")
nn = torch.nn

BUILTIN_REGEXES = {
    "weights": [r"^(?!gradient).*weight"],
    "biases": [r"^(?!gradient).*bias"],
    "gradients": [r"^gradient"],
    "losses": [r"[Ll]oss_(?!input).*output"],
}
LOSS_NAME = "MSELoss_output_0"


class HandDrivenHook(HookBase):
    """A hook over host values, its steps driven by hand: what the torch plugin does,
    without its torch hooks."""

    framework = "pytorch"
    builtin_regexes = BUILTIN_REGEXES


class Recorder:
    """Saves what a torch hook saves (parameters, gradients, loss, activations, data) through
    HookBase, for loops that drive the steps themselves."""

    def __init__(self, out_dir: Path, save_interval: int = 1, control_poll_s: float = 2.0, reduction_config=None):
        self.core = HandDrivenHook(
            str(out_dir),
            save_config=SaveConfig(save_interval=save_interval), reduction_config=reduction_config,
            include_collections=["weights", "biases", "gradients"],
            collections=[Collection("activations"), Collection("data")],
            profiler_config=ProfilerConfig.disabled(), control_poll_s=control_poll_s,
        )

    def begin(self, mode: ModeKeys = ModeKeys.TRAIN) -> None:
        self.core.begin_step(mode)

    def parameters(self, model: nn.Module) -> None:
        for name, param in model.named_parameters():
            self.core.save_value(name, param.detach().numpy().copy(), ("weights" if name.endswith("weight") else "biases",))

    def gradients(self, model: nn.Module) -> None:
        for name, param in model.named_parameters():
            if param.grad is not None:
                self.core.save_value(f"gradient/{name}", param.grad.detach().numpy().copy(), ("gradients",))

    def loss(self, value: torch.Tensor, name: str = LOSS_NAME) -> None:
        self.core.save_value(name, np.float32(value.item()), ("losses",))

    def tensor(self, name: str, value, collection: str = "activations") -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().numpy().copy()
        self.core.save_value(name, value, (collection,))

    def end(self) -> None:
        self.core.end_step(raise_on_stop=False)  # the loop reads stop_requested

    def close(self) -> None:
        self.core.close()


class MLP(nn.Module):
    """Linear layers with an activation between them; `forward` also returns each
    activation's input and output under smdebug-style names."""

    def __init__(self, sizes: list[int], activation: str = "relu"):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.activation = activation
        self.fn = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[activation]

    def forward(self, x):
        seen = {}
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                seen[f"layers.{i}.{self.activation}_input_0"] = x
                x = self.fn(x)
                seen[f"layers.{i}.{self.activation}_output_0"] = x
        return x, seen


def regression_data(seed: int, n: int, features: int = 16, scale: float = 10.0):
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=torch.Generator().manual_seed(7))
    y = scale * torch.sin(x @ w / 2) + x[:, :1]
    return x, y


def train_regression(
    out_dir: Path,
    *,
    seed: int = 0,
    sizes=(16, 32, 32, 1),
    activation: str = "relu",
    steps: int = 40,
    lr: float = 0.01,
    init: Callable[[nn.Module], None] | None = None,
    frozen: bool = False,
    train_samples: int = 512,
    eval_every: int | None = 10,
    eval_steps: int = 2,
    eval_samples: int = 2048,
    random_targets: bool = False,
    optimizer: str = "sgd",
    stall_at: int | None = None,
    stall_s: float = 0.0,
    nan_at: int | None = None,
    save_activations: bool = True,
) -> Path:
    """Full-batch training of an MLP on a smooth regression task, saving every step."""
    torch.manual_seed(seed)
    model = MLP(list(sizes), activation)
    if init is not None:
        init(model)
    x, y = regression_data(seed, train_samples)
    vx, vy = regression_data(seed + 500, eval_samples)
    if random_targets:
        y = torch.randn_like(y)
        vy = torch.randn_like(vy)
    params = [p for p in model.parameters() if not frozen]
    opt = None
    if params:
        opt = torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr)
    loss_fn = nn.MSELoss()
    rec = Recorder(out_dir)
    for step in range(steps):
        if stall_at is not None and step == stall_at:
            time.sleep(stall_s)
        rec.begin(ModeKeys.TRAIN)
        out, seen = model(x)
        loss = loss_fn(out, y)
        if opt is not None:
            opt.zero_grad()
        loss.backward()
        if nan_at is not None and step == nan_at:
            with torch.no_grad():
                model.layers[0].weight.grad[0, 0] = float("nan")
        rec.parameters(model)
        rec.gradients(model)
        rec.loss(loss)
        if save_activations:
            for name, value in seen.items():
                rec.tensor(name, value)
        if opt is not None:
            opt.step()
        rec.end()
        if eval_every and (step + 1) % eval_every == 0:
            with torch.no_grad():
                for _ in range(eval_steps):
                    rec.begin(ModeKeys.EVAL)
                    out, _ = model(vx)
                    rec.loss(loss_fn(out, vy))
                    rec.end()
    rec.close()
    return out_dir


def train_classifier(out_dir: Path, *, seed: int = 0, weights=(1, 1, 1), merge_classes: bool = False, steps: int = 20, eval_steps: int = 3, batch: int = 64) -> Path:
    """Mini-batch training of a linear classifier on Gaussian blobs (3 classes; `weights`
    sets the class frequencies; `merge_classes` makes classes 1 and 2 the same blob).
    Saves labels and logits ("labels", "predictions") in TRAIN and EVAL steps."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    centers = np.array([[4.0, 0.0], [-4.0, 3.0], [-4.0, -3.0]])
    if merge_classes:
        centers[2] = centers[1]
    probs = np.asarray(weights, dtype=float) / sum(weights)

    def batch_of(n):
        labels = rng.choice(3, size=n, p=probs)
        points = centers[labels] + rng.standard_normal((n, 2))
        return torch.tensor(points, dtype=torch.float32), torch.tensor(labels)

    model = nn.Linear(2, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    rec = Recorder(out_dir)
    for mode, count in ((ModeKeys.TRAIN, steps), (ModeKeys.EVAL, eval_steps)):
        for _ in range(count):
            x, labels = batch_of(batch)
            rec.begin(mode)
            logits = model(x)
            loss = loss_fn(logits, labels)
            if mode == ModeKeys.TRAIN:
                opt.zero_grad()
                loss.backward()
                opt.step()
            rec.loss(loss, "CrossEntropyLoss_output_0")
            rec.tensor("labels", labels.numpy(), "data")
            rec.tensor("predictions", logits, "data")
            rec.end()
    rec.close()
    return out_dir


def _input_step(rec: Recorder, opt: torch.optim.Optimizer, forward, inputs: torch.Tensor, labels: torch.Tensor, name: str, value) -> None:
    """One recorded SGD step on the cross-entropy of `forward(inputs)`, saving the loss and
    the model's input `value` as `name` (collection "data"), for the input rules."""
    rec.begin()
    loss = nn.functional.cross_entropy(forward(inputs), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    rec.loss(loss, "CrossEntropyLoss_output_0")
    rec.tensor(name, value, "data")
    rec.end()


def train_images(out_dir: Path, *, normalized: bool, seed: int = 0, steps: int = 10, batch: int = 64) -> Path:
    """A small CNN on random 3x8x8 images whose class is the brightest channel; images are
    in [0, 1] or normalized to mean 0. Saves the input as "model_input_0"."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = Recorder(out_dir)
    for _ in range(steps):
        images = torch.rand(batch, 3, 8, 8)
        labels = images.mean(dim=(2, 3)).argmax(dim=1)
        if normalized:
            images = (images - 0.5) / 0.29
        _input_step(rec, opt, model, images, labels, "model_input_0", images)
    rec.close()
    return out_dir


def train_tokens(out_dir: Path, *, padding: float, seed: int = 0, steps: int = 10, batch: int = 32, length: int = 20) -> Path:
    """An embedding-bag classifier over token sequences whose tail is padding (token 0):
    `padding` is the padded fraction. Saves the embedding's input as "embedding0_input_0"."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    embed = nn.Embedding(50, 8, padding_idx=0)
    head = nn.Linear(8, 2)
    opt = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1)
    rec = Recorder(out_dir)
    keep = int(round(length * (1 - padding)))

    def forward(tokens: torch.Tensor) -> torch.Tensor:
        return head(embed(tokens).mean(dim=1))

    for _ in range(steps):
        tokens = rng.integers(1, 50, size=(batch, length))
        tokens[:, keep:] = 0
        labels = torch.tensor((tokens[:, 0] > 25).astype(np.int64))
        _input_step(rec, opt, forward, torch.tensor(tokens), labels, "embedding0_input_0", tokens)
    rec.close()
    return out_dir


def _scale_init(factor: float):
    def init(model: nn.Module) -> None:
        with torch.no_grad():
            for layer in model.layers:
                nn.init.kaiming_normal_(layer.weight)
                layer.weight.mul_(factor)
                layer.bias.zero_()
    return init


def _dead_bias(model: nn.Module) -> None:
    with torch.no_grad():
        model.layers[0].bias.fill_(-100.0)


RUNS: dict[str, Callable[[Path], Path]] = {
    "healthy": lambda d: train_regression(d),
    "healthy_same_seed": lambda d: train_regression(d),
    "healthy_other_seed": lambda d: train_regression(d, seed=1),
    "vanishing": lambda d: train_regression(d, sizes=(16,) + (16,) * 12 + (1,), activation="sigmoid", steps=12, eval_every=None),
    "exploding": lambda d: train_regression(d, lr=50.0, steps=12, eval_every=None),
    "dead_relu": lambda d: train_regression(d, init=_dead_bias, steps=12, eval_every=None),
    "saturated": lambda d: train_regression(d, activation="tanh", init=_scale_init(1000.0), steps=12, eval_every=None),
    "tanh_healthy": lambda d: train_regression(d, activation="tanh", steps=12, eval_every=None),
    "poor_init": lambda d: train_regression(d, sizes=(16, 32, 32, 32, 1), init=_scale_init(4.0), lr=1e-9, steps=12, eval_every=None),
    "frozen": lambda d: train_regression(d, frozen=True, steps=25, eval_every=None),
    "nan_gradient": lambda d: train_regression(d, steps=10, nan_at=5, eval_every=None),
    "overfit": lambda d: train_regression(
        d, sizes=(16, 256, 256, 1), train_samples=16, random_targets=True, optimizer="adam", lr=0.01, steps=60, eval_every=10, eval_samples=512
    ),
    "stalled": lambda d: train_regression(d, steps=8, stall_at=4, stall_s=1.5, eval_every=None),
    "imbalanced": lambda d: train_classifier(d, weights=(95, 5, 0)),
    "balanced": lambda d: train_classifier(d),
    "confused": lambda d: train_classifier(d, merge_classes=True),
    "images_raw": lambda d: train_images(d, normalized=False),
    "images_normalized": lambda d: train_images(d, normalized=True),
    "tokens_padded": lambda d: train_tokens(d, padding=0.8),
    "tokens_dense": lambda d: train_tokens(d, padding=0.2),
}


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """`runs("healthy")` -> path of that training run, trained on first use."""
    made: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("runs")

    def get(name: str) -> Path:
        if name not in made:
            torch.set_num_threads(1)
            made[name] = RUNS[name](root / name)
        return made[name]

    return get


@pytest.fixture
def trial_of(runs):
    """`trial_of("healthy")` -> a fresh Trial of that run (rules keep state per trial use)."""
    from stepscope import create_trial

    return lambda name: create_trial(str(runs(name)))


@pytest.fixture(scope="session")
def training():
    """The helpers above, for tests that train in their own loop (importlib import mode
    keeps conftest modules out of `import`)."""
    import types

    return types.SimpleNamespace(MLP=MLP, Recorder=Recorder, HandDrivenHook=HandDrivenHook, regression_data=regression_data, torch=torch, train_regression=train_regression)
