"""What each built-in rule checks, why it usually fires and what to change: the text of
`stepscope check --explain RULE`, of reports and of the web UI. Repairs follow the usual
fixes for each training problem (as AutoTrainer and DeepDiagnosis catalogue them)."""

from __future__ import annotations

from .report import Explanation

_LR_DOWN = "Lower the learning rate (by 3-10x), or add a warm-up."
_CLIP = "Clip gradients (torch.nn.utils.clip_grad_norm_, Keras clipnorm) to bound each update."

EXPLANATIONS: dict[str, Explanation] = {
    # --- tensor rules ---------------------------------------------------------------------
    "ExplodingTensor": Explanation(
        "A tensor (loss, weight, gradient, activation, input) holds NaN or infinite values.",
        ("A learning rate so large that weights diverge", "A NaN or inf in an input batch (bad sample, division by zero in preprocessing)",
         "log/sqrt/division of zero in the loss or the model", "Overflow in float16 without loss scaling"),
        (_LR_DOWN, _CLIP, "Check the input batch of the first NaN step for NaN/inf (torch.isfinite, np.isfinite) and clean the data",
         "Add an epsilon inside log/sqrt/divisions; use the framework's fused losses (CrossEntropyLoss on logits)",
         "With mixed precision, use a GradScaler / LossScaleOptimizer"),
    ),
    "VanishingGradient": Explanation(
        "The gradient of a weight is negligible: its mean |g| is tiny compared with what is "
        "normal for that kind of parameter, so those layers no longer learn.",
        ("Saturating activations (sigmoid, tanh) in a deep network", "Weights initialised too small", "A learning-rate schedule that decayed to nearly zero"),
        ("Use ReLU/GELU-family activations in hidden layers", "Use He/Kaiming or Glorot initialisation",
         "Add normalisation (BatchNorm, LayerNorm) or residual connections", "Make the network shallower"),
    ),
    "WeightUpdateRatio": Explanation(
        "The size of a weight's update relative to the weight (||w_t - w_prev|| / ||w_prev||) is "
        "far too large (training diverges) or far too small (training has stopped).",
        ("Learning rate far too large or zero", "Frozen parameters the optimizer was meant to train", "Gradients that vanish or explode"),
        ("Aim for update/weight ratios around 1e-3; scale the learning rate accordingly",
         "Check that every parameter you mean to train is in the optimizer and has requires_grad", _CLIP),
    ),
    "AllZero": Explanation(
        "A tensor is (almost) entirely zero; in the default set, a weight that stays all-zero over several saved steps.",
        ("All-zero weight initialisation: every unit computes the same thing and gets no gradient", "A layer whose inputs are all zero (dead units upstream)", "A bug that overwrites the weights"),
        ("Initialise weights randomly (He/Kaiming for ReLU, Glorot for tanh/sigmoid); only biases may start at zero", "Check the layers upstream for dead activations"),
    ),
    "UnchangedTensor": Explanation(
        "A tensor did not change over several saved training steps.",
        ("Learning rate 0", "Parameters left out of the optimizer or frozen by mistake", "Gradients that are all zero"),
        ("Check the optimizer's parameter groups and the learning-rate schedule", "Check requires_grad / trainable flags"),
    ),
    "LossNotDecreasing": Explanation(
        "The loss stopped improving. In the default set: over a window that is long compared "
        "with the loss noise, the median loss is no lower than the best earlier window's median "
        "by a margin the noise can explain, before the loss ever improved substantially.",
        ("Learning rate 0 or far too small", "Learning rate so large the loss oscillates instead of descending", "Frozen model, or an optimizer that was never stepped",
         "Labels that do not match the inputs (shuffled separately)"),
        ("Try a learning rate 3-10x larger (or smaller if the loss oscillates); run a learning-rate range test",
         "Check that optimizer.step() runs and that zero_grad() is not called between backward and step",
         "Check a batch of inputs against its labels"),
    ),
    "LossDivergence": Explanation(
        "The training loss rose far above where it started (its median over a window is well over 1.5x its value at "
        "initialisation): the optimisation diverges, even if it later recovers.",
        ("A learning rate too large for the batch size (e.g. lr 0.1 at batch 8)", "No warm-up for a large learning rate", "Exploding gradients in one layer",
         "Data that changes distribution mid-run (an unshuffled dataset)"),
        (_LR_DOWN, "Scale the learning rate with the batch size (linear scaling rule) and warm it up over the first steps", _CLIP,
         "Shuffle the training data"),
    ),
    "ChanceLevelLoss": Explanation(
        "A classifier's cross-entropy stays at chance level, ln K for K classes: the model predicts no better than "
        "uniform guessing. On the training loss: it learns nothing. On the validation loss (or one of the sets a script "
        "evaluates after each epoch) while the training loss falls: it memorises the training set and nothing generalises.",
        ("Labels shuffled, misaligned with their inputs, or unrelated to them", "Learning rate 0 or an optimizer that holds other parameters",
         "Inputs that do not reach the model (all zeros, a constant, a broken pipeline)", "A loss applied to the wrong outputs (probabilities where logits are expected)"),
        ("Check a batch by hand: do the labels match the inputs? Train on a handful of samples: the loss must fall to near 0",
         "Check the learning rate and that optimizer.step() updates the model you train",
         "Check the inputs' statistics (mean, std, any NaN) right before the model",
         "Use CrossEntropyLoss on logits (no softmax before it)"),
    ),
    "SlowConvergence": Explanation(
        "The training loss keeps falling but has come down only a little (under 10 % of its start) over the whole run: training converges, slowly.",
        ("A learning rate far too small", "Inputs not normalised (features on very different scales)", "Poor initialisation or a too-deep network without normalisation"),
        ("Raise the learning rate (by 3-10x) or use an adaptive optimizer (Adam)", "Standardise the inputs (zero mean, unit variance)",
         "Add normalisation layers; use He/Kaiming or Glorot initialisation", "Train longer, if the budget allows"),
    ),
    "Overfit": Explanation(
        "The model fits the training data at the expense of validation data. In the default set: "
        "over `patience` evaluations the validation loss trends up while the training loss trends "
        "down (robust Theil-Sen slopes), and the gap between them widened.",
        ("Too little training data for the model's size", "Too many epochs", "No regularisation"),
        ("Stop early at the best validation loss (checkpoint it)", "Add data or augmentation",
         "Add weight decay, dropout, or use a smaller model"),
    ),
    "Overtraining": Explanation(
        "Neither the training nor the validation loss improved by `delta` for a number of steps: training goes on without gain.",
        ("Training longer than the model needs", "A learning rate decayed too far"),
        ("Stop training earlier (early stopping on the validation loss)", "Use a learning-rate schedule that restarts or decays more slowly"),
    ),
    "DeadRelu": Explanation(
        "Most units of a ReLU layer output zero for (almost) every sample of the batch, so they get no gradient and never recover.",
        ("Large negative biases (initialisation or after a too-large update)", "Learning rate too large: one big step pushes pre-activations below zero for good",
         "Inputs not normalised"),
        ("Lower the learning rate", "Initialise biases at zero (or small positive) and weights with He/Kaiming",
         "Use LeakyReLU/GELU or add BatchNorm before the activation", "Normalise the inputs"),
    ),
    "SaturatedActivation": Explanation(
        "Most units of a tanh or sigmoid layer receive inputs so large that the activation is flat (saturated) there, so their gradient vanishes.",
        ("Inputs not scaled (raw pixel values, large features)", "Weights initialised too large", "Learning rate too large"),
        ("Standardise the inputs (zero mean, unit variance)", "Use Glorot/Xavier initialisation", "Add normalisation before the activation, or use ReLU-family activations"),
    ),
    "PoorWeightInitialization": Explanation(
        "Early in training, activation variances differ widely across layers, gradients have almost no spread, or the loss makes no progress: signs of a bad initialisation.",
        ("Weights initialised with the wrong scale", "All-zero or constant initialisation"),
        ("Use He/Kaiming (ReLU) or Glorot (tanh/sigmoid) initialisation", "Add normalisation layers"),
    ),
    "ClassImbalance": Explanation(
        "Over the labels seen, the largest class outnumbers the smallest by more than `threshold_imbalance`, or some class is mostly mispredicted.",
        ("Imbalanced training data", "A sampler or a filter that drops classes"),
        ("Re-balance with a weighted sampler or class weights in the loss", "Collect more data of the rare classes", "Report per-class metrics, not only accuracy"),
    ),
    "Confusion": Explanation(
        "The confusion matrix of a step has a class predicted right less than `min_diag` of the time, or one class taken for another too often.",
        ("Classes that look alike or labels that are noisy", "A model that has not learned yet"),
        ("Inspect the confused pairs; add data or features that tell them apart", "Check label quality"),
    ),
    "StalledTrainingRule": Explanation(
        "No step was saved for longer than `threshold` seconds.",
        ("A hang (deadlock in data loading or collective communication)", "A crashed worker", "A save interval far longer than expected"),
        ("Look at the job's logs and stack traces (py-spy dump)", "Check data-loader workers and distributed timeouts"),
    ),
    "TensorVariance": Explanation(
        "A tensor's variance is outside [min_threshold, max_threshold].",
        ("Exploding or collapsing activations or weights",),
        ("Check initialisation, normalisation and learning rate",),
    ),
    "SimilarAcrossRuns": Explanation(
        "A tensor differs between this run and another one at the same step.",
        ("Non-determinism (seeds, cuDNN algorithms, data order)", "A code or data change between the runs"),
        ("Fix seeds and set deterministic algorithms to compare runs exactly",),
    ),
    "CheckInputImages": Explanation(
        "Input images are not normalised: a channel's mean over the images seen is far from 0.",
        ("Raw pixel values fed to the model",),
        ("Normalise inputs per channel (subtract the mean, divide by the std)",),
    ),
    "NLPSequenceRatio": Explanation(
        "A token (padding by default) makes up too large a share of the input sequences.",
        ("Sequences padded to a length far beyond most samples",),
        ("Bucket sequences by length, or pad to the longest in each batch",),
    ),
    # --- profiler rules -------------------------------------------------------------------
    "CPUBottleneck": Explanation(
        "GPUs sat idle while the CPU was saturated for a large share of the job.",
        ("Data preprocessing on the CPU cannot keep up", "Too few data-loading workers"),
        ("Use more data-loader workers or move preprocessing to the GPU", "Cache or pre-process the dataset"),
    ),
    "IOBottleneck": Explanation(
        "GPUs sat idle while the CPUs waited on IO for a large share of the job.",
        ("Reading data from slow storage",),
        ("Use faster storage or local caches, larger files, prefetching",),
    ),
    "LowGPUUtilization": Explanation(
        "A GPU's utilization was low (p95 under threshold) or fluctuated (p5 near zero). Reports \"no data\" on jobs without GPU samples.",
        ("Small batches or a small model", "Input pipeline stalls", "Synchronisation between steps"),
        ("Increase the batch size", "Profile the input pipeline", "Overlap data loading with compute (pin_memory, prefetch)"),
    ),
    "GPUMemoryIncrease": Explanation(
        "GPU memory use kept rising between windows (a leak or growing caches). \"no data\" without GPU samples.",
        ("Tensors kept alive across steps (e.g. accumulating the loss tensor instead of loss.item())",),
        ("Keep only Python numbers of step results; free references", "Check the caching allocator's stats"),
    ),
    "BatchSize": Explanation(
        "CPU, GPU and GPU memory were all under-used: the machine idles. \"no data\" without GPU samples.",
        ("A batch size too small for the hardware",),
        ("Increase the batch size (and scale the learning rate), or use a smaller instance",),
    ),
    "LoadBalancing": Explanation(
        "GPUs of the job had very different utilization. \"no data\" with fewer than two GPUs.",
        ("Uneven data sharding", "One rank doing extra work (logging, evaluation)"),
        ("Balance the work per rank; move rank-0-only work off the critical path",),
    ),
    "StepOutlier": Explanation(
        "Steps that took much longer than the usual step of their rank and mode (mean + `stddev` std).",
        ("Checkpointing, evaluation or garbage collection inside the step", "Stragglers in distributed training"),
        ("Move periodic work out of the training step or make it asynchronous",),
    ),
    "MaxInitializationTime": Explanation(
        "The first step started long after the job did.",
        ("Slow data download or dataset indexing at start", "Slow model construction or compilation"),
        ("Stream or cache the data; build and compile once",),
    ),
    "Dataloader": Explanation(
        "Data loading holds training back. In the default set: waiting for data takes a meaningful "
        "share (>= 25 %, and >= 5 ms) of step time. SageMaker's form judges the worker count against the cores.",
        ("Too few data-loading workers (num_workers=0 loads in the training process)", "Expensive per-sample preprocessing", "Slow storage"),
        ("Raise DataLoader(num_workers=...) towards the number of cores; set pin_memory=True and persistent_workers=True",
         "Pre-process once and cache; use tf.data prefetch/AUTOTUNE in Keras"),
    ),
    "OverallSystemUsage": Explanation("Percentiles of CPU, GPU, memory, IO, disk and network per node; never fires."),
    # --- trace rules (rules.traces) -----------------------------------------------------
    "HighLaunchLatency": Explanation(
        "Kernels wait long after their launch call returns before they run: p95 launch delay per step above the threshold.",
        ("The GPU queue is full: the host runs far ahead of a busy stream", "Synchronous work between launches on another stream", "Too many tiny kernels queued behind large ones"),
        ("Look at the merged timeline (stepscope timeline) around the slowest launches", "Overlap or reorder streams; use CUDA graphs for fixed-shape steps"),
    ),
    "SmallKernelsDominating": Explanation(
        "Most kernels of a step are tiny, so launch overhead rather than GPU work sets the step time.",
        ("Small batches or layers", "Many elementwise operations that are not fused", "Python-level loops over tensors"),
        ("Compile the model (torch.compile, XLA / jit_compile=True) to fuse kernels", "Use CUDA graphs", "Raise the batch size"),
    ),
    "ManySyncsPerStep": Explanation(
        "The host waits for the GPU many times per step: each synchronize empties the GPU's queue.",
        ("loss.item(), .cpu(), .numpy() or printing tensors inside the step", "Metrics computed on the host every step", "torch.cuda.synchronize() calls left from debugging"),
        ("Accumulate metrics on the GPU and read them every N steps", "Remove explicit synchronize calls; use non_blocking copies"),
    ),
    "MemcpyBoundStep": Explanation(
        "Copies between host and device take a large share of the step.",
        ("Batches copied from pageable memory", "Copies not overlapped with compute", "Tensors moved back and forth between CPU and GPU"),
        ("DataLoader(pin_memory=True) and .to(device, non_blocking=True)", "Keep tensors on the GPU; prefetch the next batch on a side stream"),
    ),
    "RankStraggler": Explanation(
        "One rank is slower than the others in the same steps, and in synchronous training every rank waits for it.",
        (
            "A slower or throttled GPU (thermal or power limits, a different model, ECC errors)",
            "More work on that rank: an uneven data shard, longer sequences, its own extra logging or checkpointing",
            "Its host is busy: data loading, another process on the node, a slower disk or network",
        ),
        (
            "Compare the rank's GPU clocks, temperature and utilization with its peers' (system metrics)",
            "Balance the data across ranks (bucket by sequence length); move checkpointing and logging off the step",
            "stepscope profile JOB --rank R for the rank's detail; stepscope sql JOB for the ranks side by side",
        ),
    ),
    # --- memory rules (rules.memory) ----------------------------------------------------
    "MemoryNearLimit": Explanation(
        "A step's memory peak comes close to the device's memory: a slightly larger input or more fragmentation ends in an out-of-memory error.",
        ("A batch size or sequence length at the edge of what fits", "Activations of a deep model kept for the backward pass", "Optimizer state and gradients in full precision"),
        (
            "Activation checkpointing (torch.utils.checkpoint) for the largest blocks",
            "A smaller batch with gradient accumulation to keep the effective batch",
            "Mixed precision (bf16/fp16 autocast), or sharded optimizer state (ZeRO / FSDP)",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to waste less of the reserved memory",
        ),
    ),
    "MemoryGrowth": Explanation(
        "Each step leaves memory allocated behind it: the job grows until it runs out of memory.",
        (
            "A list or dict that keeps every step's outputs or losses (append(loss) instead of append(loss.item()))",
            "Tensors kept with their autograd graph (store .detach() values)",
            "A cache keyed by something that changes every step",
        ),
        (
            "Free the references: store loss.item() / tensor.detach().cpu(), clear per-step lists",
            "The operator named in the evidence allocated the bytes that were kept",
            "Record an allocator snapshot (torch.cuda.memory._record_memory_history) to see the stacks of the kept blocks",
        ),
    ),
    "MemoryFragmentation": Explanation(
        "At the memory peak the caching allocator holds much more memory than the tensors use: reserved segments are split into blocks too small for the requests.",
        ("Tensor sizes that change every step (variable sequence lengths, dynamic shapes)", "Large temporary buffers interleaved with long-lived tensors"),
        (
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments that grow instead of new ones)",
            "Pad inputs to a few fixed sizes (bucketing)",
            "Allocate long-lived buffers first, or set max_split_size_mb for large blocks",
        ),
    ),
    "RankMemoryImbalance": Explanation(
        "One rank needs much more memory than the others: it sets the batch size every rank can use, and fails first.",
        ("Rank 0 doing extra work (evaluation, logging, checkpoint gathering)", "Uneven pipeline stages or sharding", "Uneven inputs (longer sequences on one rank)"),
        ("Move rank-0-only work off the training step, or spread it", "Balance stages / shards; bucket inputs by length across ranks"),
    ),
}

GENERIC = Explanation("A user-defined rule.")


def explanation_for(name: str) -> Explanation:
    return EXPLANATIONS.get(name, GENERIC)


__all__ = ["EXPLANATIONS", "explanation_for"]
