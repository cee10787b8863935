"""Types of the compiled hot path (_fastpath.c; fastpath.py says what it is for)."""

from collections.abc import Callable, Mapping
from typing import Any

class Words:
    def extend(self, record: tuple[int, ...] | list[int], /) -> None: ...
    def take(self) -> list[int]: ...
    def __len__(self) -> int: ...

class Counters:
    """fastpath.TorchCounters in C (the same fields), and the torch entry points of a step."""

    step: Any
    idle: Any
    global_step: int
    mode: Any
    begun: Any
    next_due: Any
    closed: bool
    failsafe: Any
    profiler_failsafe: Any
    notify: bool
    detailed: Any
    meter_at: int
    now: Callable[[], Any] | None
    log_append: Callable[[Any], Any] | None
    timing: bool
    last_end: Any
    train_ends: int
    stop_check_at: int
    explicit_mode: Any
    drives_optimizer: bool
    train_at: int
    routine: int
    handed_over: int
    scalar_steps: int
    loss_armed: bool

    def __init__(self, failsafe: Any, profiler_failsafe: Any, notify: bool, train: Any, eval: Any, codes: Mapping[str, int]) -> None: ...
    def attach(self, begin: Callable[..., Any], end: Callable[..., Any], pre: Callable[..., Any], post: Callable[..., Any], meter_block: Callable[..., Any], /) -> None: ...
    def forward(self, model: Any, original: Callable[..., Any], /) -> Any: ...
    def loss_forward(self, model: Any, original: Callable[..., Any], before: Callable[[Any], object], after: Callable[[Any, tuple[Any, ...], Any], object], /) -> Any: ...
    def setup_scalar_steps(self, step_type: type, adopt: Callable[[bool], object], plain_scalars: dict[Any, type], strided: Any, held_types: tuple[type, ...], array_type: type, max_values: int, max_bytes: int, /) -> None: ...
    def arm_scalar_run(self, step: Any, first: int, until: float, optimizer: Any, release: Callable[[], object], hold_steps: int, hold_s: float, /) -> None: ...
    def disarm_scalar_run(self) -> None: ...
    def take_held(self) -> list[tuple[int, Any, int, dict[str, Any], dict[str, Any]]]: ...
    def held_age(self) -> float | None: ...
    def optimizer_pre(self, *args: Any) -> None: ...
    def optimizer_post(self, *args: Any) -> None: ...
    def log_words(self) -> Words: ...
