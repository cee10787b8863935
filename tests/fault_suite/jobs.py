"""The labelled fault suite: small real training jobs on CPU, healthy ones across model
families and ones with a planted fault, each saved the way the README tells a user to
(weights, biases, gradients and layer outputs every `SAVE_INTERVAL` steps, losses every
step), and the rules that should catch each fault.

Used by the fast subset in tests/fault_suite/test_fault_suite.py and the full table in
bench/bench_fault_suite.py. Every job is deterministic (fixed seeds) and takes about a
second on one CPU core.

Faults follow the training problems AutoTrainer (Zhang et al., ICSE 2021) and DeepDiagnosis
(Wardat et al., ICSE 2022) define: vanishing and exploding gradients, dying ReLU, saturated
activations, an oscillating loss, slow or no convergence, plus data and setup faults
(NaN input, learning rate 0, all-zero initialisation, a forgotten optimizer.step,
overfitting)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SAVE_INTERVAL = 10


@dataclass(frozen=True)
class Job:
    """One labelled job: `fault` None for healthy ones; `caught_by` the rules whose firing
    means the fault was found (any one of them); `train(out_dir)` writes the job."""

    name: str
    family: str
    train: Callable[[Path], None]
    fault: str | None = None
    caught_by: tuple[str, ...] = ()
    framework: str = "torch"
    fast: bool = False  # part of the fast subset run in the tests
    notes: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)


# --- PyTorch plumbing ------------------------------------------------------------------


def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


# How the PyTorch jobs are hooked: "quick-start" (the README's config), "defaults" (the
# same collections with no save_config: the capture defaults) or "bare" (`Hook(out_dir)`).
CONFIG_ENV = "STEPSCOPE_SUITE_CONFIG"
CONFIGS = ("quick-start", "defaults", "bare")


def _hook(out_dir: Path):
    """What the README's quick start saves, plus layer outputs for the activation rules
    (or the capture defaults: see CONFIG_ENV)."""
    import os

    from stepscope.config import Collection, SaveConfig
    from stepscope_torch import Hook

    config = os.environ.get(CONFIG_ENV, "quick-start")
    if config == "defaults":
        return Hook(str(out_dir), include_collections=["weights", "biases", "gradients", "losses", "outputs"])
    if config == "bare":
        return Hook(str(out_dir))
    return Hook(
        str(out_dir),
        save_config=SaveConfig(save_interval=SAVE_INTERVAL),
        include_collections=["weights", "biases", "gradients", "losses", "outputs"],
        collections=[Collection("losses", save_config=SaveConfig(save_interval=1))],
    )


def _loop(
    out_dir: Path,
    model,
    batches: Callable[[int], tuple],
    loss_fn,
    optimizer,
    *,
    steps: int = 300,
    val_batches: Callable[[int], tuple] | None = None,
    eval_every: int = 50,
    eval_batches: int = 2,
) -> None:
    torch = _torch()
    with _hook(out_dir) as hook:
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
        for step in range(steps):
            model.train()
            x, y = batches(step)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if val_batches is not None and (step + 1) % eval_every == 0:
                model.eval()
                with torch.no_grad():
                    for i in range(eval_batches):
                        vx, vy = val_batches(i)
                        loss_fn(model(vx), vy)
                hook.set_mode(None)


def _blobs(seed: int, n: int, features: int = 16, classes: int = 4, spread: float = 1.5, scale: float = 1.0):
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=torch.Generator().manual_seed(42))
    labels = torch.randint(0, classes, (n,), generator=g)
    x = (centres[labels] + spread * torch.randn(n, features, generator=g)) * scale
    return x, labels


def _batcher(x, y, batch: int = 32, seed: int = 0):
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    order = {"perm": torch.randperm(len(x), generator=g), "pos": 0}

    def next_batch(step: int):
        if order["pos"] + batch > len(x):
            order["perm"], order["pos"] = torch.randperm(len(x), generator=g), 0
        idx = order["perm"][order["pos"] : order["pos"] + batch]
        order["pos"] += batch
        return x[idx], y[idx]

    return next_batch


def _fixed(x, y, batch: int = 128):
    return lambda i: (x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch])


def _mlp(sizes, activation: str = "relu"):
    torch = _torch()
    nn = torch.nn
    act = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}[activation]
    layers: list = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def _classification(out_dir: Path, *, seed: int = 0, sizes=(16, 64, 32, 4), activation: str = "relu", optimizer: str = "adam",
                    lr: float = 1e-3, steps: int = 300, scale: float = 1.0, init: Callable | None = None, train_samples: int = 4096,
                    nan_batch: int | None = None, spread: float = 1.5) -> None:
    torch = _torch()
    torch.manual_seed(seed)
    model = _mlp(list(sizes), activation)
    if init is not None:
        init(model)
    x, y = _blobs(seed + 1, train_samples, sizes[0], sizes[-1], spread, scale)
    vx, vy = _blobs(seed + 2, 512, sizes[0], sizes[-1], spread, scale)
    opt = {
        "adam": lambda: torch.optim.Adam(model.parameters(), lr=lr),
        "sgd": lambda: torch.optim.SGD(model.parameters(), lr=lr),
        "momentum": lambda: torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
        "adamw": lambda: torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01),
    }[optimizer]()
    batches = _batcher(x, y, seed=seed)
    if nan_batch is not None:
        clean = batches

        def batches(step):  # noqa: F811 - one poisoned batch
            bx, by = clean(step)
            if step == nan_batch:
                bx = bx.clone()
                bx[3, 5] = float("nan")
            return bx, by

    _loop(out_dir, model, batches, torch.nn.CrossEntropyLoss(), opt, steps=steps, val_batches=_fixed(vx, vy))


# --- healthy families ------------------------------------------------------------------


def mlp_adam(out_dir: Path) -> None:
    _classification(out_dir, optimizer="adam", lr=1e-3)


def mlp_sgd_momentum(out_dir: Path) -> None:
    _classification(out_dir, optimizer="momentum", lr=0.02)


def mlp_tanh(out_dir: Path) -> None:
    _classification(out_dir, activation="tanh", optimizer="adam", lr=1e-3)


def regression_adamw(out_dir: Path) -> None:
    torch = _torch()
    torch.manual_seed(3)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 1, generator=g)
    x = torch.randn(4096, 16, generator=g)
    y = torch.sin(x @ w) + 0.1 * torch.randn(4096, 1, generator=g)
    vx = torch.randn(512, 16, generator=g)
    vy = torch.sin(vx @ w) + 0.1 * torch.randn(512, 1, generator=g)
    model = _mlp([16, 64, 64, 1])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    _loop(out_dir, model, _batcher(x, y), torch.nn.MSELoss(), opt, val_batches=_fixed(vx, vy))


def _images(seed: int, n: int):
    """8x8 RGB images whose class is the brightest channel, standardised."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 3, 8, 8, generator=g)
    labels = images.mean(dim=(2, 3)).argmax(dim=1)
    return (images - 0.5) / 0.29, labels


def cnn_batchnorm(out_dir: Path) -> None:
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(4)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3),
    )
    x, y = _images(5, 4096)
    vx, vy = _images(6, 512)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    _loop(out_dir, model, _batcher(x, y), nn.CrossEntropyLoss(), opt, val_batches=_fixed(vx, vy))


def _sequences(seed: int, n: int, length: int = 12, vocab: int = 30):
    """Token sequences; the label says whether token 1 occurs more often than token 2."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (n, length), generator=g)
    labels = ((tokens == 1).sum(1) > (tokens == 2).sum(1)).long()
    return tokens, labels


class _RNNClassifier:
    @staticmethod
    def build(kind: str):
        torch = _torch()
        nn = torch.nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(30, 16)
                self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(16, 32, batch_first=True)
                self.head = nn.Linear(32, 2)

            def forward(self, tokens):
                out, _ = self.rnn(self.embed(tokens))
                return self.head(out[:, -1])

        return Model()


def _rnn(out_dir: Path, kind: str) -> None:
    torch = _torch()
    torch.manual_seed(7)
    model = _RNNClassifier.build(kind)
    x, y = _sequences(8, 4096)
    vx, vy = _sequences(9, 512)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    _loop(out_dir, model, _batcher(x, y), torch.nn.CrossEntropyLoss(), opt, val_batches=_fixed(vx, vy))


def lstm(out_dir: Path) -> None:
    _rnn(out_dir, "lstm")


def gru(out_dir: Path) -> None:
    _rnn(out_dir, "gru")


def transformer(out_dir: Path) -> None:
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(10)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(30, 32)
            layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
            self.head = nn.Linear(32, 2)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)).mean(dim=1))

    model = Model()
    x, y = _sequences(11, 4096)
    vx, vy = _sequences(12, 512)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _loop(out_dir, model, _batcher(x, y), nn.CrossEntropyLoss(), opt, val_batches=_fixed(vx, vy))


def embedding_bag(out_dir: Path) -> None:
    """A large vocabulary: most embedding rows get no gradient in a step (sparse use)."""
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(13)
    g = torch.Generator().manual_seed(13)
    tokens = torch.randint(0, 2000, (4096, 8), generator=g)
    labels = (tokens % 2 == 0).sum(1).gt(4).long()
    model = nn.Sequential(nn.EmbeddingBag(2000, 16, mode="mean"), nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    vt, vl = tokens[:512], labels[:512]
    _loop(out_dir, model, _batcher(tokens, labels), nn.CrossEntropyLoss(), opt, val_batches=_fixed(vt, vl))


def frozen_backbone(out_dir: Path) -> None:
    """Fine-tuning: the first layers are frozen on purpose, only the head trains."""
    torch = _torch()
    torch.manual_seed(20)
    model = _mlp([16, 64, 32, 4])
    for p in list(model[0].parameters()) + list(model[2].parameters()):
        p.requires_grad_(False)
    x, y = _blobs(21, 4096)
    vx, vy = _blobs(22, 512)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    _loop(out_dir, model, _batcher(x, y), torch.nn.CrossEntropyLoss(), opt, val_batches=_fixed(vx, vy))


def lightning_mlp(out_dir: Path) -> None:
    torch = _torch()
    import lightning.pytorch as pl

    from stepscope.config import Collection, SaveConfig
    from stepscope_torch import StepscopeCallback

    torch.manual_seed(14)
    x, y = _blobs(15, 2048)
    vx, vy = _blobs(16, 256)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _mlp([16, 64, 32, 4])
            self.loss = torch.nn.CrossEntropyLoss()

        def training_step(self, batch, _):
            return self.loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch, _):
            return self.loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    # In-memory data served as ready batches: loading costs nothing next to the step, as in a
    # well-configured pipeline (a per-sample DataLoader with num_workers=0 would spend most
    # of these tiny steps collating, which the Dataloader rule rightly reports).
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train = torch.utils.data.DataLoader([(x[order[i : i + 32]], y[order[i : i + 32]]) for i in range(0, len(x), 32)], batch_size=None)
    val = torch.utils.data.DataLoader([(vx[i : i + 128], vy[i : i + 128]) for i in range(0, len(vx), 128)], batch_size=None)
    callback = StepscopeCallback(
        str(out_dir), save_config=SaveConfig(save_interval=SAVE_INTERVAL),
        include_collections=["weights", "biases", "gradients", "losses", "outputs"],
        collections=[Collection("losses", save_config=SaveConfig(save_interval=1))],
    )
    trainer = pl.Trainer(
        max_epochs=4, callbacks=[callback], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0, val_check_interval=32,
    )
    trainer.fit(Module(), train, val)


def keras_mlp(out_dir: Path, dead_bias: float | None = None) -> None:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    from stepscope.config import Collection, SaveConfig
    from stepscope_tf import StepscopeCallback

    keras.utils.set_random_seed(17)
    x, y = (t.numpy() for t in _blobs(18, 4096))
    vx, vy = (t.numpy() for t in _blobs(19, 512))
    first = {"bias_initializer": keras.initializers.Constant(dead_bias)} if dead_bias is not None else {}
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu", **first), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with StepscopeCallback(
        str(out_dir), save_config=SaveConfig(save_interval=SAVE_INTERVAL), include_collections=["weights", "biases", "gradients", "losses", "outputs"],
        collections=[Collection("losses", save_config=SaveConfig(save_interval=1))],
    ) as callback:
        model.fit(x, y, batch_size=32, epochs=3, validation_data=(vx, vy), callbacks=[callback], verbose=0)


def keras_dead_relu(out_dir: Path) -> None:
    keras_mlp(out_dir, dead_bias=-50.0)


# --- planted faults --------------------------------------------------------------------


def _zero_init(model) -> None:
    torch = _torch()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()


def _dead_bias(model) -> None:
    torch = _torch()
    with torch.no_grad():
        model[0].bias.fill_(-20.0)


def vanishing_sigmoid(out_dir: Path) -> None:
    _classification(out_dir, sizes=(16,) + (32,) * 10 + (4,), activation="sigmoid", optimizer="sgd", lr=0.05)


def exploding_lr(out_dir: Path) -> None:
    _classification(out_dir, optimizer="sgd", lr=50.0, scale=3.0)


def nan_input(out_dir: Path) -> None:
    _classification(out_dir, nan_batch=137)


def lr_zero(out_dir: Path) -> None:
    _classification(out_dir, optimizer="sgd", lr=0.0)


def stale_optimizer(out_dir: Path) -> None:
    """The optimizer holds the parameters of a model built before the one that trains (a
    re-instantiated model): steps run, the trained model never changes."""
    torch = _torch()
    torch.manual_seed(0)
    old = _mlp([16, 64, 32, 4])
    model = _mlp([16, 64, 32, 4])
    x, y = _blobs(1, 4096)
    vx, vy = _blobs(2, 512)
    opt = torch.optim.Adam(old.parameters(), lr=1e-3)
    _loop(out_dir, model, _batcher(x, y), torch.nn.CrossEntropyLoss(), opt, val_batches=_fixed(vx, vy))


def dead_relu(out_dir: Path) -> None:
    _classification(out_dir, init=_dead_bias, optimizer="adam", lr=1e-3)


def saturated_tanh(out_dir: Path) -> None:
    _classification(out_dir, activation="tanh", scale=100.0, optimizer="sgd", lr=1e-3)


def oscillating_lr(out_dir: Path) -> None:
    _classification(out_dir, optimizer="momentum", lr=1.5, spread=3.0)


def zero_init(out_dir: Path) -> None:
    _classification(out_dir, init=_zero_init, optimizer="sgd", lr=0.05)


def overfit_tiny(out_dir: Path) -> None:
    """A big MLP memorising 64 samples of hard (overlapping) classes; validation on fresh data."""
    _classification(out_dir, sizes=(16, 256, 256, 4), optimizer="adam", lr=3e-3, train_samples=64, spread=4.0, steps=400)


# --- held out: written after the rules' thresholds were set, never tuned on --------------


def shuffled_labels(out_dir: Path) -> None:
    """Labels drawn independently of the inputs (a shuffled label column): nothing to learn."""
    torch = _torch()
    torch.manual_seed(30)
    x, _ = _blobs(31, 4096)
    y = torch.randint(0, 4, (4096,), generator=torch.Generator().manual_seed(32))
    vx, _ = _blobs(33, 512)
    vy = torch.randint(0, 4, (512,), generator=torch.Generator().manual_seed(34))
    model = _mlp([16, 64, 32, 4])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _loop(out_dir, model, _batcher(x, y), torch.nn.CrossEntropyLoss(), opt, val_batches=_fixed(vx, vy))


def shuffled_labels_memorised(out_dir: Path) -> None:
    """Shuffled labels on 256 samples and a wide MLP: training memorises them (its loss
    falls), validation stays at chance level."""
    torch = _torch()
    torch.manual_seed(35)
    x, _ = _blobs(36, 256)
    y = torch.randint(0, 4, (256,), generator=torch.Generator().manual_seed(37))
    vx, _ = _blobs(38, 512)
    vy = torch.randint(0, 4, (512,), generator=torch.Generator().manual_seed(39))
    model = _mlp([16, 256, 256, 4])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    _loop(out_dir, model, _batcher(x, y), torch.nn.CrossEntropyLoss(), opt, steps=400, val_batches=_fixed(vx, vy), eval_every=40)


def _cnn():
    nn = _torch().nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3),
    )


def overfit_tiny_cnn(out_dir: Path) -> None:
    """A CNN memorising 48 noisy-label images (a third of the labels wrong); validation on fresh, clean ones."""
    torch = _torch()
    torch.manual_seed(40)
    x, y = _images(41, 48)
    flip = torch.rand(48, generator=torch.Generator().manual_seed(42)) < 0.33
    y = torch.where(flip, (y + 1) % 3, y)
    vx, vy = _images(43, 512)
    model = _cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _loop(out_dir, model, _batcher(x, y, batch=16), torch.nn.CrossEntropyLoss(), opt, steps=400, val_batches=_fixed(vx, vy), eval_every=40)


def diverging_cnn(out_dir: Path) -> None:
    """SGD+momentum at lr 3 and batch 8: the loss climbs to twice its start and back."""
    torch = _torch()
    torch.manual_seed(0)
    x, y = _images(5, 4096)
    vx, vy = _images(6, 512)
    model = _cnn()
    opt = torch.optim.SGD(model.parameters(), lr=3.0, momentum=0.9)
    _loop(out_dir, model, _batcher(x, y, batch=8), torch.nn.CrossEntropyLoss(), opt, val_batches=_fixed(vx, vy))


class _SlowDataset:
    """Samples that take 1 ms each to produce (decoding, augmentation), loaded in the
    training process (num_workers=0)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        import time

        time.sleep(0.001)
        return self.x[i], self.y[i]


def slow_data(out_dir: Path) -> None:
    torch = _torch()
    torch.manual_seed(0)
    model = _mlp([16, 64, 32, 4])
    x, y = _blobs(1, 4096)
    loader = torch.utils.data.DataLoader(_SlowDataset(x, y), batch_size=32, shuffle=True, num_workers=0, generator=torch.Generator().manual_seed(0))
    batches = iter(())

    def next_batch(step):
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _loop(out_dir, model, next_batch, torch.nn.CrossEntropyLoss(), opt, steps=120)


JOBS: list[Job] = [
    Job("mlp_adam", "MLP, Adam", mlp_adam, fast=True),
    Job("mlp_sgd_momentum", "MLP, SGD+momentum", mlp_sgd_momentum),
    Job("mlp_tanh", "tanh MLP, Adam", mlp_tanh),
    Job("regression_adamw", "regression MLP, AdamW", regression_adamw),
    Job("cnn_batchnorm", "CNN with BatchNorm, SGD", cnn_batchnorm, fast=True),
    Job("lstm", "LSTM, Adam", lstm),
    Job("gru", "GRU, Adam", gru),
    Job("transformer", "transformer encoder, AdamW", transformer),
    Job("embedding_bag", "sparse embeddings, Adam", embedding_bag),
    Job("frozen_backbone", "fine-tuning a head, frozen layers", frozen_backbone),
    Job("lightning_mlp", "Lightning MLP, Adam", lightning_mlp, framework="lightning"),
    Job("keras_mlp", "Keras MLP with validation", keras_mlp, framework="keras"),
    Job("vanishing_sigmoid", "12-layer sigmoid MLP", vanishing_sigmoid, "vanishing gradients", ("VanishingGradient",), fast=True),
    Job("exploding_lr", "MLP, SGD lr 50", exploding_lr, "exploding learning rate", ("ExplodingTensor", "WeightUpdateRatio")),
    Job("nan_input", "MLP, one NaN input batch", nan_input, "NaN in an input batch", ("ExplodingTensor",), fast=True),
    Job("lr_zero", "MLP, SGD lr 0", lr_zero, "learning rate 0", ("LossNotDecreasing", "WeightUpdateRatio"), fast=True),
    Job("stale_optimizer", "MLP, optimizer over another model", stale_optimizer, "parameters never updated", ("LossNotDecreasing", "WeightUpdateRatio")),
    Job("dead_relu", "MLP, first-layer bias -20", dead_relu, "dead ReLUs", ("DeadRelu",), fast=True),
    Job("saturated_tanh", "tanh MLP, inputs x100", saturated_tanh, "saturated tanh", ("SaturatedActivation",)),
    Job("oscillating_lr", "MLP, SGD+momentum lr 1.5", oscillating_lr, "oscillating loss (learning rate too large)", ("LossNotDecreasing", "ExplodingTensor", "WeightUpdateRatio")),
    Job("zero_init", "MLP, all-zero initialisation", zero_init, "all-zero initialisation", ("AllZero",)),
    Job("overfit_tiny", "MLP on 64 samples", overfit_tiny, "overfitting on tiny data", ("Overfit",)),
    Job("keras_dead_relu", "Keras MLP, first-layer bias -50", keras_dead_relu, "dead ReLUs (Keras)", ("DeadRelu",), framework="keras"),
    Job("slow_data", "MLP, 1 ms per sample, no workers", slow_data, "data loading bottleneck", ("Dataloader",)),
    # Held out (tags "held-out"): planted after the thresholds were chosen.
    Job("shuffled_labels", "MLP, labels independent of inputs", shuffled_labels, "learning on shuffled labels", ("ChanceLevelLoss",), fast=True, tags=("held-out",)),
    Job("shuffled_labels_memorised", "wide MLP, 256 shuffled-label samples", shuffled_labels_memorised, "shuffled labels memorised", ("ChanceLevelLoss", "Overfit"), tags=("held-out",)),
    Job("overfit_tiny_cnn", "CNN on 48 noisy-label images", overfit_tiny_cnn, "overfitting on tiny data", ("Overfit",), fast=True, tags=("held-out",)),
    Job("diverging_cnn", "CNN, SGD+momentum lr 3, batch 8", diverging_cnn, "loss diverging far above its start", ("LossDivergence",), tags=("held-out",)),
]


def by_name(name: str) -> Job:
    for job in JOBS:
        if job.name == name:
            return job
    raise KeyError(name)


def check(out_dir: Path) -> list:
    """The default `stepscope check` over a job: its reports (nothing written)."""
    from stepscope import create_trial
    from stepscope.rules import default_rules, run_rules

    trial = create_trial(str(out_dir))
    return run_rules(default_rules(trial))


def judge(job: Job, reports: list) -> dict:
    """What the default set said about `job`: the rules that fired, and whether that is
    right (no finding on a healthy job; a right rule among the findings on a faulty one)."""
    fired = sorted(r.rule for r in reports if r.fired)
    if job.fault is None:
        ok = not fired
    else:
        ok = any(rule in fired for rule in job.caught_by)
    first = next((r.summary() for r in reports if r.fired), "")
    return {"job": job.name, "family": job.family, "fault": job.fault or "-", "fired": fired, "ok": ok, "first": first}


__all__ = ["JOBS", "Job", "by_name", "check", "judge", "SAVE_INTERVAL", "CONFIG_ENV", "CONFIGS"]
