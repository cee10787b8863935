"""Configuration model: which steps to save (SaveConfig), how to reduce (ReductionConfig),
which tensors form a collection (Collection). Pure, framework-free, validated at construction."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .exceptions import ConfigError, ConfigTypeError
from .modes import ALL_MODES, ModeKeys

DEFAULT_SAVE_INTERVAL = 500

# The schedule of a hook given no save_config (see `default_save_config`): every step at
# first, then every 10 steps, then every 100, then every DEFAULT_SAVE_INTERVAL.
DENSE_START_STEPS = (*range(0, 10), *range(10, 100, 10), *range(100, 1000, 100))

# Reductions a user can ask for; norms are kept apart as smdebug did ("l1", "l2").
REDUCTIONS = ("min", "max", "mean", "std", "variance", "sum", "prod")
NORMS = ("l1", "l2")


def _int_field(owner: str, name: str, value: Any, minimum: int | None = 0, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{owner}.{name} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{owner}.{name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ConfigError(f"{owner}.{name} must be >= {minimum}, got {value!r}")
    return number


def _int_tuple(owner: str, name: str, value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if isinstance(value, int):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise ConfigError(f"{owner}.{name} must be a list of integers, got {value!r}") from None
    return tuple(sorted({int(_int_field(owner, name, item) or 0) for item in items}))


@dataclass(frozen=True)
class SaveConfigMode:
    """When to save in one mode: every `save_interval` mode steps in [start_step, end_step),
    plus every step listed in `save_steps`."""

    save_interval: int = DEFAULT_SAVE_INTERVAL
    save_steps: tuple[int, ...] = ()
    start_step: int = 0
    end_step: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "save_interval", _int_field("SaveConfig", "save_interval", self.save_interval, minimum=1))
        set_(self, "save_steps", _int_tuple("SaveConfig", "save_steps", self.save_steps))
        set_(self, "start_step", _int_field("SaveConfig", "start_step", self.start_step))
        set_(self, "end_step", _int_field("SaveConfig", "end_step", self.end_step, allow_none=True))
        if self.end_step is not None and self.end_step < self.start_step:
            raise ConfigError(f"SaveConfig.end_step ({self.end_step}) must be >= start_step ({self.start_step})")
        set_(self, "_save_steps_set", frozenset(self.save_steps))

    def should_save(self, step: int) -> bool:
        if step in self._save_steps_set:  # type: ignore[attr-defined]
            return True
        if step < self.start_step or (self.end_step is not None and step >= self.end_step):
            return False
        return step % self.save_interval == 0

    def next_save_step(self, step: int) -> int | None:
        """The first step >= `step` that is saved, or None when none is left."""
        # save_steps is sorted (see _int_tuple): one bisection, not a scan of a list that
        # may hold a million steps, on the training thread at every step.
        at = bisect.bisect_left(self.save_steps, step)
        candidates = [self.save_steps[at]] if at < len(self.save_steps) else []
        first = max(step, self.start_step)
        first += (-first) % self.save_interval
        if self.end_step is None or first < self.end_step:
            candidates.append(first)
        return min(candidates) if candidates else None

    def to_json(self) -> dict[str, Any]:
        return {
            "save_interval": self.save_interval,
            "save_steps": list(self.save_steps),
            "start_step": self.start_step,
            "end_step": self.end_step,
        }


class SaveConfig:
    """Per-mode save schedules. The keyword arguments set every mode; `mode_save_configs`
    overrides single modes, e.g. {ModeKeys.EVAL: SaveConfigMode(save_interval=1)}.

    Given `mode_save_configs` and no keyword argument, the modes it does not name (or names
    with None) are unset, as in smdebug: a collection's SaveConfig takes them from the
    hook's (`merged`); anywhere else they save every `DEFAULT_SAVE_INTERVAL` steps."""

    def __init__(
        self,
        save_interval: int | None = None,
        save_steps: Iterable[int] = (),
        start_step: int | None = None,
        end_step: int | None = None,
        mode_save_configs: Mapping[ModeKeys | str, SaveConfigMode | Mapping[str, Any] | None] | None = None,
    ):
        steps: Any = save_steps or ()  # SaveConfigMode takes a list or smdebug's "1,2,3"
        given = save_interval is not None or bool(steps) or start_step is not None or end_step is not None
        default = SaveConfigMode(DEFAULT_SAVE_INTERVAL if save_interval is None else save_interval, steps, 0 if start_step is None else start_step, end_step)
        self._modes: dict[ModeKeys, SaveConfigMode] = {mode: default for mode in ALL_MODES}
        unset = set(ALL_MODES) if mode_save_configs is not None and not given else set()
        for key, value in (mode_save_configs or {}).items():
            try:
                mode = ModeKeys.parse(key)
            except ValueError as exc:
                raise ConfigError(f"SaveConfig.mode_save_configs: {exc}") from None
            if value is None:
                continue
            if isinstance(value, Mapping):
                value = SaveConfigMode(**{**default.to_json(), **value})
            if not isinstance(value, SaveConfigMode):
                raise ConfigError(f"SaveConfig.mode_save_configs[{mode.name}] must be a SaveConfigMode, got {value!r}")
            self._modes[mode] = value
            unset.discard(mode)
        self._unset = frozenset(unset)

    def merged(self, default: SaveConfig) -> SaveConfig:
        """This schedule with its unset modes taken from `default` (a collection's from the
        hook's, as smdebug's merge_default_save_config does)."""
        if not self._unset:
            return self
        new = SaveConfig()
        new._modes = {mode: default._modes[mode] if mode in self._unset else config for mode, config in self._modes.items()}
        return new

    def for_mode(self, mode: ModeKeys | str) -> SaveConfigMode:
        return self._modes[ModeKeys.parse(mode)]

    def should_save(self, step: int, mode: ModeKeys | str = ModeKeys.TRAIN) -> bool:
        """`step` is the mode step (steps count from 0 in each mode)."""
        return self._modes[ModeKeys.parse(mode)].should_save(step)

    def with_mode(self, mode: ModeKeys | str, config: SaveConfigMode) -> SaveConfig:
        new = SaveConfig()
        new._modes = dict(self._modes)
        new._modes[ModeKeys.parse(mode)] = config
        new._unset = self._unset - {ModeKeys.parse(mode)}
        return new

    def to_json(self) -> dict[str, Any]:
        return {mode.name: self._modes[mode].to_json() for mode in ALL_MODES}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SaveConfig:
        return cls(mode_save_configs={mode: SaveConfigMode(**value) for mode, value in data.items()})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SaveConfig) and self._modes == other._modes and self._unset == other._unset

    def __repr__(self) -> str:
        modes = set(self._modes.values())
        if len(modes) == 1:
            return f"SaveConfig({next(iter(modes))})"
        return f"SaveConfig({ {m.name: c for m, c in self._modes.items()} })"


def default_save_config() -> SaveConfig:
    """What a hook saves when it is given no save_config: tensors at steps 0-9, then every
    10 steps to 100, every 100 to 1,000, then every 500 (smdebug's interval) for good:
    28 saved steps in the first 1,000 and one per 500 after, so short and long jobs alike
    give the rules several points. Written in the collections file as smdebug's fields
    (save_steps plus save_interval 500), so it reads back with the same meaning. A
    SaveConfig given explicitly, or by an smdebug JSON configuration, keeps its own."""
    return SaveConfig(save_interval=DEFAULT_SAVE_INTERVAL, save_steps=DENSE_START_STEPS)


# Losses and metrics are scalars: a hook given no save_config saves them every step, which
# the loss rules need to judge trends (see docs/rules.md).
SCALARS_SAVE_CONFIG = SaveConfig(save_interval=1)


def _name_tuple(field_name: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise ConfigTypeError(f"ReductionConfig.{field_name} must be a list of names or a comma-separated string, got {value!r}")
    names = tuple(dict.fromkeys(str(v) for v in value))
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ConfigError(f"ReductionConfig.{field_name}: unknown {bad!r}; valid: {', '.join(allowed)}")
    return names


@dataclass(frozen=True)
class ReductionConfig:
    """What to save for a tensor instead of (or beside) its raw value."""

    reductions: tuple[str, ...] = ()
    abs_reductions: tuple[str, ...] = ()
    norms: tuple[str, ...] = ()
    abs_norms: tuple[str, ...] = ()
    save_raw_tensor: bool = False
    save_shape: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "reductions", _name_tuple("reductions", self.reductions, REDUCTIONS))
        set_(self, "abs_reductions", _name_tuple("abs_reductions", self.abs_reductions, REDUCTIONS))
        set_(self, "norms", _name_tuple("norms", self.norms, NORMS))
        set_(self, "abs_norms", _name_tuple("abs_norms", self.abs_norms, NORMS))
        for flag in ("save_raw_tensor", "save_shape"):
            set_(self, flag, parse_bool(f"ReductionConfig.{flag}", getattr(self, flag)))

    @property
    def is_empty(self) -> bool:
        return not (self.reductions or self.abs_reductions or self.norms or self.abs_norms)

    def requested(self) -> list[tuple[str, bool]]:
        """(reduction name, applied to abs) pairs, in a stable order."""
        return (
            [(n, False) for n in self.reductions]
            + [(n, True) for n in self.abs_reductions]
            + [(n, False) for n in self.norms]
            + [(n, True) for n in self.abs_norms]
        )

    @classmethod
    def from_smdebug_string(cls, reductions: str, save_raw_tensor: Any = False, save_shape: Any = False) -> ReductionConfig:
        """smdebug's comma list: "min,max,abs_mean,l2_norm,abs_l1_norm"."""
        kinds: dict[str, list[str]] = {"reductions": [], "abs_reductions": [], "norms": [], "abs_norms": []}
        for raw in (reductions or "").split(","):
            item = raw.strip()
            if not item:
                continue
            is_abs = item.startswith("abs_")
            base = item[4:] if is_abs else item
            base = base[: -len("_norm")] if base.endswith("_norm") else base
            if base in NORMS:
                kinds["abs_norms" if is_abs else "norms"].append(base)
            elif base in REDUCTIONS:
                kinds["abs_reductions" if is_abs else "reductions"].append(base)
            else:
                valid = list(REDUCTIONS) + [f"{n}_norm" for n in NORMS]
                raise ConfigError(f"reductions: unknown {item!r}; valid: {', '.join(valid)} (each also with abs_)")
        return cls(save_raw_tensor=save_raw_tensor, save_shape=save_shape, **{k: tuple(v) for k, v in kinds.items()})

    def to_smdebug_string(self) -> str:
        parts = [("abs_" if is_abs else "") + (f"{n}_norm" if n in NORMS else n) for n, is_abs in self.requested()]
        return ",".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"save_raw_tensor": self.save_raw_tensor, "reductions": self.to_smdebug_string(), "save_shape": self.save_shape}


def parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", ""):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{name} must be true or false, got {value!r}")


class CollectionName:
    """Names of the built-in collections."""

    WEIGHTS = "weights"
    BIASES = "biases"
    GRADIENTS = "gradients"
    LOSSES = "losses"
    METRICS = "metrics"
    INPUTS = "inputs"
    OUTPUTS = "outputs"
    OPTIMIZER_VARIABLES = "optimizer_variables"
    ALL = "all"
    DEFAULT = "default"


BUILTIN_COLLECTIONS = (
    CollectionName.WEIGHTS,
    CollectionName.BIASES,
    CollectionName.GRADIENTS,
    CollectionName.LOSSES,
    CollectionName.METRICS,
    CollectionName.INPUTS,
    CollectionName.OUTPUTS,
    CollectionName.OPTIMIZER_VARIABLES,
    CollectionName.ALL,
    CollectionName.DEFAULT,
)

# Collections that only make sense while training (smdebug skipped them in EVAL/PREDICT).
TRAIN_ONLY_COLLECTIONS = frozenset({CollectionName.GRADIENTS, CollectionName.OPTIMIZER_VARIABLES})
# Collections saved whatever the user included (cheap and always wanted).
ALWAYS_SAVED_COLLECTIONS = frozenset({CollectionName.LOSSES, CollectionName.METRICS})
# What a step may have due and still be routine: the always-saved collections, and the
# default collection (what a user hands `save_tensor`, plus what `include_regex` adds to it).
# Under a save_config of every step the default collection is due at every step and holds
# nothing at most of them: such a step saves a loss or two, as a step of the capture
# defaults does, and is held with them (held_steps.py; a large value is not held). Plugins
# that skip walking the model at such steps first check that no model tensor belongs to them.
ROUTINE_COLLECTIONS = ALWAYS_SAVED_COLLECTIONS | {CollectionName.DEFAULT}

# Losses and metrics are saved whole, whatever reduction_config the hook was given (as
# smdebug does: its scalar collections are NON_REDUCTION_COLLECTIONS): a hook asked for the
# norms of everything still keeps the loss itself, which the loss rules read.
SCALARS_REDUCTION_CONFIG = ReductionConfig(save_raw_tensor=True)


def _strings(where: str, value: Any) -> tuple[str, ...]:
    """One string or a list/tuple/set of strings, as a tuple; ConfigTypeError otherwise."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(isinstance(v, str) for v in value):
        raise ConfigTypeError(f"{where} must be a string or a list of strings, got {value!r}")
    return tuple(value)


def _compile_regexes(owner: str, patterns: Iterable[str]) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ConfigError(f"{owner}.include_regex: bad regular expression {pattern!r}: {exc}") from None
    return tuple(compiled)


@dataclass
class Collection:
    """A named group of tensors, chosen by regex over tensor names or by explicit names.
    `save_config`/`reduction_config` of None mean "use the hook's"."""

    name: str
    include_regex: tuple[str, ...] = ()
    tensor_names: set[str] = field(default_factory=set)
    save_config: SaveConfig | None = None
    reduction_config: ReductionConfig | None = None
    save_histogram: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"Collection.name must be a non-empty string, got {self.name!r}")
        where = f"Collection({self.name!r})"
        self.include_regex = _strings(f"{where}.include_regex", self.include_regex)
        self._patterns = _compile_regexes(where, self.include_regex)
        self.tensor_names = set(_strings(f"{where}.tensor_names", self.tensor_names))
        for field_name, kind in (("save_config", SaveConfig), ("reduction_config", ReductionConfig)):
            value = getattr(self, field_name)
            if value is not None and not isinstance(value, kind):
                raise ConfigTypeError(f"{where}.{field_name} must be a {kind.__name__} or None, got {value!r}")
        if not isinstance(self.save_histogram, bool):
            raise ConfigTypeError(f"{where}.save_histogram must be True or False, got {self.save_histogram!r}")

    def include(self, *patterns: str) -> None:
        self._patterns += _compile_regexes(f"Collection({self.name!r})", patterns)
        self.include_regex += tuple(patterns)

    def add_tensor_name(self, name: str) -> None:
        self.tensor_names.add(name)

    def matches(self, tensor_name: str) -> bool:
        return tensor_name in self.tensor_names or any(p.search(tensor_name) for p in self._patterns)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "include_regex": list(self.include_regex),
            "tensor_names": sorted(self.tensor_names),
            "reduction_config": (self.reduction_config or ReductionConfig()).to_json(),
            "save_config": self.save_config.to_json() if self.save_config else {},
            "save_histogram": self.save_histogram,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Collection:
        rc = data.get("reduction_config") or {}
        save = data.get("save_config") or {}
        return cls(
            name=data["name"],
            include_regex=tuple(data.get("include_regex") or ()),
            tensor_names=set(data.get("tensor_names") or ()),
            save_config=SaveConfig.from_json(save) if save else None,
            reduction_config=ReductionConfig.from_smdebug_string(
                rc.get("reductions", ""), rc.get("save_raw_tensor", False), rc.get("save_shape", False)
            )
            if rc
            else None,
            save_histogram=parse_bool("save_histogram", data.get("save_histogram", True)),
        )

    def with_defaults(self, save_config: SaveConfig, reduction_config: ReductionConfig) -> Collection:
        return replace(
            self,
            save_config=self.save_config.merged(save_config) if self.save_config else save_config,
            reduction_config=self.reduction_config or reduction_config,
            tensor_names=set(self.tensor_names),
        )


_MONITOR_INTERVALS_MS = (100, 200, 500, 1000, 5000, 60000)


def _float_field(owner: str, name: str, value: Any, minimum: float | None = None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{owner}.{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{owner}.{name} must be a number, got {value!r}") from None
    if number != number or (minimum is not None and number < minimum):
        raise ConfigError(f"{owner}.{name} must be a number >= {minimum}, got {value!r}")
    return number


@dataclass(frozen=True)
class ProfilingWindow:
    """When a detailed profiler runs: `num_steps` steps from `start_step` (global steps), or
    `duration_s` seconds from `start_time` (Unix time, seconds). Exactly one of the two forms."""

    start_step: int | None = None
    num_steps: int | None = None
    start_time: float | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "start_step", _int_field("ProfilingWindow", "start_step", self.start_step, allow_none=True))
        set_(self, "num_steps", _int_field("ProfilingWindow", "num_steps", self.num_steps, minimum=1, allow_none=True))
        set_(self, "start_time", _float_field("ProfilingWindow", "start_time", self.start_time, minimum=0.0))
        set_(self, "duration_s", _float_field("ProfilingWindow", "duration_s", self.duration_s, minimum=0.0))
        by_step = self.start_step is not None or self.num_steps is not None
        by_time = self.start_time is not None or self.duration_s is not None
        if by_step == by_time:
            raise ConfigError(f"ProfilingWindow needs either start_step and num_steps or start_time and duration_s, got {self!r}")
        if by_step and (self.start_step is None or self.num_steps is None):
            raise ConfigError(f"ProfilingWindow by steps needs both start_step and num_steps, got {self!r}")
        if by_time and (self.start_time is None or not self.duration_s):
            raise ConfigError(f"ProfilingWindow by time needs start_time and a duration_s > 0, got {self!r}")

    @property
    def by_step(self) -> bool:
        return self.start_step is not None

    def covers(self, step: int, now_s: float) -> bool:
        """Whether a step starting at `now_s` (Unix seconds) is inside the window."""
        if self.start_step is not None and self.num_steps is not None:
            return self.start_step <= step < self.start_step + self.num_steps
        assert self.start_time is not None and self.duration_s is not None
        return self.start_time <= now_s < self.start_time + self.duration_s

    def is_over(self, step: int, now_s: float) -> bool:
        """Whether the window can no longer cover any later step."""
        if self.start_step is not None and self.num_steps is not None:
            return step >= self.start_step + self.num_steps
        assert self.start_time is not None and self.duration_s is not None
        return now_s >= self.start_time + self.duration_s

    def to_json(self) -> dict[str, Any]:
        if self.by_step:
            return {"start_step": self.start_step, "num_steps": self.num_steps}
        return {"start_time": self.start_time, "duration_s": self.duration_s}

    @classmethod
    def parse(cls, value: Any, owner: str = "ProfilerConfig") -> ProfilingWindow:
        """A window from a ProfilingWindow, a mapping of its fields, a (start_step,
        num_steps) pair, or smdebug's "start_step"/"num_steps"/"start_unix_time"/"duration" keys."""
        if isinstance(value, ProfilingWindow):
            return value
        if isinstance(value, Mapping):
            keys = {"StartStep": "start_step", "NumSteps": "num_steps", "StartTimeInSecSinceEpoch": "start_time", "start_unix_time": "start_time",
                    "Duration": "duration_s", "duration": "duration_s", "DurationInSeconds": "duration_s"}
            fields: dict[str, Any] = {keys.get(str(k), str(k)): v for k, v in value.items()}
            unknown = set(fields) - {"start_step", "num_steps", "start_time", "duration_s"}
            if unknown:
                raise ConfigError(f"{owner}: unknown profiling window field(s) {sorted(unknown)!r}")
            return cls(**fields)
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return cls(start_step=value[0], num_steps=value[1])
        raise ConfigError(f"{owner}: a profiling window must be a ProfilingWindow, a mapping or (start_step, num_steps), got {value!r}")


def active_window(windows: tuple[ProfilingWindow, ...], step: int, now_s: float) -> int | None:
    """Index of the first window covering `step` at `now_s`, or None: a pure schedule the
    plugins call at every step start (a few comparisons; nothing when there are no windows)."""
    for index, window in enumerate(windows):
        if window.covers(step, now_s):
            return index
    return None


@dataclass(frozen=True)
class ProfilerConfig:
    """What the hooks record beside tensors: system metrics (one monitor per node unless
    `monitor_every_rank`), the per-step phase timeline, and, only inside their windows,
    detailed traces (torch.profiler / tf.profiler: CPU ops, kernels, memcpy, syncs; see
    docs/traces.md), a Python profile (cProfile) and data-loader timing."""

    system_monitor: bool = True
    monitor_interval_ms: int = 500
    monitor_every_rank: bool = False
    step_timeline: bool = True
    detailed_windows: tuple[ProfilingWindow, ...] = ()
    python_window: ProfilingWindow | None = None
    dataloader_window: ProfilingWindow | None = None
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False
    # CUDA only: inside each detailed window, the caching allocator's history with stacks
    # (torch.cuda.memory._record_memory_history, at most `memory_history_entries` entries),
    # published at the window's end as an allocator snapshot (docs/traces.md).
    memory_history: bool = False
    memory_history_entries: int = 100_000
    # Steps profiled before each detailed window and thrown away (torch.profiler's
    # schedule(warmup=...)): the profiler's start-up (CUPTI initialisation) lands there.
    warmup_steps: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "warmup_steps", _int_field("ProfilerConfig", "warmup_steps", self.warmup_steps, minimum=0))
        interval = _int_field("ProfilerConfig", "monitor_interval_ms", self.monitor_interval_ms, minimum=1)
        if interval not in _MONITOR_INTERVALS_MS:
            raise ConfigError(f"ProfilerConfig.monitor_interval_ms must be one of {_MONITOR_INTERVALS_MS}, got {self.monitor_interval_ms!r}")
        object.__setattr__(self, "monitor_interval_ms", interval)
        object.__setattr__(self, "memory_history_entries", _int_field("ProfilerConfig", "memory_history_entries", self.memory_history_entries, minimum=1))
        for flag in ("system_monitor", "monitor_every_rank", "step_timeline", "record_shapes", "profile_memory", "with_stack", "memory_history"):
            object.__setattr__(self, flag, parse_bool(f"ProfilerConfig.{flag}", getattr(self, flag)))
        windows: Any = self.detailed_windows
        if isinstance(windows, (ProfilingWindow, Mapping)) or (isinstance(windows, (tuple, list)) and len(windows) == 2 and all(isinstance(v, int) for v in windows)):
            windows = (windows,)
        try:
            parsed = tuple(ProfilingWindow.parse(w, "ProfilerConfig.detailed_windows") for w in windows)
        except TypeError:
            raise ConfigError(f"ProfilerConfig.detailed_windows must be a list of windows, got {windows!r}") from None
        object.__setattr__(self, "detailed_windows", parsed)
        for name in ("python_window", "dataloader_window"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, ProfilingWindow.parse(value, f"ProfilerConfig.{name}"))

    @property
    def detailed(self) -> bool:
        """Whether anything beyond metrics and the step timeline may ever run."""
        return bool(self.detailed_windows or self.python_window or self.dataloader_window)

    @classmethod
    def disabled(cls) -> ProfilerConfig:
        return cls(system_monitor=False, step_timeline=False)

    @classmethod
    def from_sagemaker(cls, profiling_parameters: Mapping[str, Any], **overrides: Any) -> ProfilerConfig:
        """From SageMaker Profiler's `ProfilingParameters` (what its ProfilerConfig put in the
        job's configuration): ProfilingIntervalInMilliseconds and the Detailed/Python/
        DataloaderProfilingConfig entries, each a JSON string or mapping with StartStep and
        NumSteps or StartTimeInSecSinceEpoch and DurationInSeconds (smdebug's own defaults
        are not guessed: an entry without a window is a ConfigError naming it)."""
        import json

        fields: dict[str, Any] = {}
        interval = profiling_parameters.get("ProfilingIntervalInMilliseconds")
        if interval is not None:
            fields["monitor_interval_ms"] = interval
        targets = {"DetailedProfilingConfig": "detailed_windows", "PythonProfilingConfig": "python_window", "DataloaderProfilingConfig": "dataloader_window"}
        for key, target in targets.items():
            value = profiling_parameters.get(key)
            if value in (None, "", "{}"):
                continue
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError:
                    raise ConfigError(f"ProfilingParameters.{key} is not JSON: {value!r}") from None
            if not isinstance(value, Mapping):
                raise ConfigError(f"ProfilingParameters.{key} must be a mapping, got {value!r}")
            window = {k: v for k, v in value.items() if k in ("StartStep", "NumSteps", "StartTimeInSecSinceEpoch", "DurationInSeconds")}
            if not window:
                raise ConfigError(f"ProfilingParameters.{key} has no window (StartStep/NumSteps or StartTimeInSecSinceEpoch/DurationInSeconds): {value!r}")
            parsed = ProfilingWindow.parse(window, f"ProfilingParameters.{key}")
            fields[target] = (parsed,) if target == "detailed_windows" else parsed
        fields.update(overrides)
        return cls(**fields)
