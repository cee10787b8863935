"""The public-scripts suite in one place: which programs there are (and which public script
each mirrors), which faults each is run with, and which rules catch each fault.

A run is (program, capture config, fault or None). A finding on a healthy run is a false
positive; on a faulty run, a rule in the fault's `caught_by` that fires is a true positive
(the fault was caught), and a fault no such rule caught is a miss."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from .capture import CONFIGS


@dataclass(frozen=True)
class Fault:
    """A planted fault: what it is and the rules whose firing means it was found."""

    name: str
    description: str
    caught_by: tuple[str, ...]


# The expected rules for every planted fault: the rules that name the problem (a rule that
# only sees a consequence, such as DeadRelu after a NaN batch, is not listed).
FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("divergence", "learning rate far too high: the loss climbs far above its start or turns NaN",
              ("LossDivergence", "ExplodingTensor", "LossNotDecreasing", "WeightUpdateRatio")),
        Fault("chance_level", "labels shuffled: the model can do no better than chance (it may memorise the training set)",
              ("ChanceLevelLoss", "LossNotDecreasing", "Overfit")),
        Fault("lr_zero", "learning rate 0: nothing trains", ("LossNotDecreasing", "WeightUpdateRatio", "ChanceLevelLoss")),
        Fault("slow_lr", "learning rate 1000 times too small: the loss creeps down", ("SlowConvergence", "LossNotDecreasing")),
        Fault("overfit", "a big model on a tiny training set, many epochs: validation loss rises", ("Overfit",)),
        Fault("exploding_one_network", "one of two networks gets a learning rate 1e4 too high and blows up",
              ("ExplodingTensor", "WeightUpdateRatio", "LossDivergence")),
        Fault("vanishing", "a deep sigmoid stack: gradients vanish towards the input", ("VanishingGradient",)),
        Fault("dead_relu", "a ReLU layer's bias initialised to -20: its units never fire", ("DeadRelu",)),
        Fault("nan_input", "one input batch holds a NaN", ("ExplodingTensor",)),
        Fault("zero_init", "every parameter initialised to 0", ("AllZero",)),
    )
}


@dataclass(frozen=True)
class Program:
    """One training program modelled on a public script (`mirrors`: repository and path)."""

    name: str
    kind: str
    mirrors: str
    framework: str  # torch, lightning, hf (the Hugging Face Trainer) or keras
    faults: tuple[str, ...]
    fast_fault: str | None = None  # the fault the tests' fast subset runs (None: not in it)
    # A defect or property of the published script itself, which the rules should find on
    # every run (its findings are true positives, not false ones).
    defect: Fault | None = None

    def train(self) -> Callable:
        """The program's `train(out_dir, config, fault)`."""
        return importlib.import_module(f"{__package__}.{self.name}").train


PROGRAMS: list[Program] = [
    Program("torch_mnist", "CNN classifier, Adadelta + StepLR, functional NLL loss", "pytorch/examples mnist/main.py", "torch",
            ("chance_level", "dead_relu", "divergence")),
    Program("torch_imagenet_resnet18", "ResNet-18 (BatchNorm, residual), SGD momentum + weight decay", "pytorch/examples imagenet/main.py (--arch resnet18 --dummy)",
            "torch", ("divergence", "lr_zero", "nan_input")),
    Program("torch_dcgan", "DCGAN: two conv networks, two Adam optimizers, BCE", "pytorch/examples dcgan/main.py", "torch",
            ("exploding_one_network", "zero_init")),
    Program("torch_word_language_model", "2-layer LSTM language model, hand-written SGD, gradient clipping", "pytorch/examples word_language_model/main.py",
            "torch", ("divergence", "chance_level", "slow_lr"), fast_fault="chance_level"),
    Program("torch_vae", "variational autoencoder, Adam, BCE + KL (sum)", "pytorch/examples vae/main.py", "torch",
            ("zero_init", "lr_zero", "vanishing"),
            # Measured here: 2 % of fc1's 400 ReLUs off at initialisation, 52 % within 100 Adam steps on
            # the synthetic digits, and 64 % on real handwritten digits (the UCI digits that scikit-learn
            # ships, upscaled to 28x28 like MNIST's 20x20 box); the same units stay off to the end.
            defect=Fault("published_defect", "about half of the encoder's 400 ReLUs die within its first 100 Adam steps (lr 1e-3) and stay "
                         "dead while the loss falls: half the hidden layer is wasted", ("DeadRelu",))),
    Program("torch_gat", "graph attention network, full batch, Adam, NLL; parameters named W and a", "pytorch/examples gat/main.py",
            "torch", ("chance_level", "zero_init")),
    Program("torch_gcn", "graph convolutional network, sparse products, F.relu, full batch, Adam, NLL", "pytorch/examples gcn/main.py",
            # In the fast subset: a real run of the per-set judgement (the training nodes and
            # then the validation nodes evaluated after each update).
            "torch", ("chance_level", "lr_zero"), fast_fault="chance_level"),
    Program("lightning_gan", "GAN, manual optimization, two optimizers", "Lightning-AI/pytorch-lightning examples/pytorch/domain_templates/generative_adversarial_net.py",
            "lightning", ("exploding_one_network", "nan_input"), fast_fault="exploding_one_network"),
    Program("lightning_ppo", "PPO actor-critic, manual optimization, two optimizers", "Lightning-AI/pytorch-lightning examples/pytorch/domain_templates/reinforce_learn_ppo.py",
            "lightning", ("exploding_one_network", "lr_zero"),
            # Measured here: the median TRAIN step waits 6.3 ms of 24.5 ms (25.9 %) in its data phase,
            # 2 ms of 6-7 ms on quiet steps (21-26 % across runs): the rollout's transitions are
            # yielded one at a time and collated per batch, as much time as the two networks' updates.
            # On a quieter machine (2026-12-06): 3.1-3.4 ms median steps waiting 0.8 ms, and every
            # 16th step waiting 130-340 ms for the next rollout, 65-76 % of the TRAIN time.
            defect=Fault("published_defect", "the rollout reaches the networks through a DataLoader one transition at a time "
                         "(an IterableDataset yielding each, collated per batch): every 16th step waits for a whole rollout, "
                         "most of the TRAIN time goes to data", ("Dataloader", "StepOutlier"))),
    Program("lightning_autoencoder", "MLP autoencoder, Adam, MSE, validation", "Lightning-AI/pytorch-lightning examples/pytorch/basics/autoencoder.py",
            "lightning", ("lr_zero", "dead_relu")),
    Program("lightning_transformer", "encoder-decoder transformer language model, SGD, gradient clipping", "Lightning-AI/pytorch-lightning examples/pytorch/basics/transformer.py",
            "lightning", ("lr_zero", "divergence")),
    Program("hf_text_classifier", "BERT sequence classifier trained by the Hugging Face Trainer (AdamW, linear decay)",
            "huggingface/transformers examples/pytorch/text-classification/run_glue.py", "hf", ("chance_level", "lr_zero")),
    Program("keras_text_transformer", "transformer block text classifier (attention)", "keras-team/keras-io examples/nlp/text_classification_with_transformer.py",
            "keras", ("chance_level", "overfit"), fast_fault="chance_level"),
    Program("keras_timeseries_transformer", "transformer encoder for time series (attention, Conv1D feed-forward)",
            "keras-team/keras-io examples/timeseries/timeseries_classification_transformer.py", "keras", ("divergence", "chance_level"),
            # Keras 3's LayerNormalization over a size-1 axis returns its beta and passes a zero gradient
            # (checked here on keras.layers.LayerNormalization); the pooled features are then the series'
            # mean, 0 for standardised series, so the model cannot beat chance either.
            defect=Fault("published_defect", "LayerNormalization over the one feature of a (batch, time, 1) series outputs a constant and "
                         "passes no gradient: the attention and Conv1D layers of every block never train, and the model stays at chance",
                         ("VanishingGradient", "WeightUpdateRatio", "ChanceLevelLoss", "LossNotDecreasing"))),
    Program("keras_mnist_convnet", "CNN classifier, Adam, one-hot cross-entropy", "keras-team/keras-io examples/vision/mnist_convnet.py", "keras",
            ("dead_relu", "divergence", "nan_input")),
]


def expected_rules(run: Run) -> tuple[set[str], set[str]]:
    """The rules that should fire on `run`: those of its planted fault, and those of its
    program's published defect."""
    program = by_name(run.program)
    planted = set(FAULTS[run.fault].caught_by) if run.fault else set()
    return planted, set(program.defect.caught_by) if program.defect else set()


def by_name(name: str) -> Program:
    for program in PROGRAMS:
        if program.name == name:
            return program
    raise KeyError(f"no program {name!r}; known: {', '.join(p.name for p in PROGRAMS)}")


@dataclass(frozen=True)
class Run:
    program: str
    config: str
    fault: str | None

    @property
    def label(self) -> str:
        return f"{self.program}/{self.config}/{self.fault or 'healthy'}"


def runs(programs: list[Program] | None = None, configs: tuple[str, ...] = CONFIGS, faults: bool = True,
         fault_configs: tuple[str, ...] = CONFIGS) -> list[Run]:
    """Every run of the suite: each program healthy under each capture configuration, and
    with each of its faults under each of `fault_configs`."""
    out = []
    for program in programs if programs is not None else PROGRAMS:
        for config in configs:
            out.append(Run(program.name, config, None))
            if faults and config in fault_configs:
                out += [Run(program.name, config, fault) for fault in program.faults]
    return out


def _validate() -> None:
    for program in PROGRAMS:
        unknown = [f for f in program.faults if f not in FAULTS]
        if unknown or (program.fast_fault is not None and program.fast_fault not in program.faults):
            raise ValueError(f"{program.name}: unknown fault(s) {unknown or [program.fast_fault]}")


_validate()

__all__ = ["FAULTS", "PROGRAMS", "Fault", "Program", "Run", "by_name", "expected_rules", "runs"]
