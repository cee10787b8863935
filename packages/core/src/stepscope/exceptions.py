"""The read side's exceptions, in one hierarchy (configuration errors included)."""

from __future__ import annotations


class StepscopeError(Exception):
    """Base of every error stepscope raises on purpose."""


class ConfigError(StepscopeError, ValueError):
    """A configuration value is wrong; the message names the field and the value."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration value has the wrong type (`Collection(save_config=5)`); names the
    field, the type it needs and the value given."""


class UnsupportedValue(ConfigError):
    """A value the record format cannot hold and no faithful conversion gives (a meta or
    nested tensor, say): the hook drops it with a warning naming it and this reason."""


class UnknownName(ConfigError, KeyError):
    """A name the user gave (collection, rule, ...) does not exist; lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TensorUnavailable(StepscopeError, KeyError):
    """No tensor of this name was saved in this trial."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"tensor {self.name!r} was not saved in this trial"


class TensorUnavailableForStep(StepscopeError, KeyError):
    """The tensor exists, but not at this step (or mode, or worker)."""

    def __init__(self, name: str, step: int, mode=None, worker: str | None = None, reason: str = ""):
        super().__init__(name)
        self.name, self.step, self.mode, self.worker, self.reason = name, step, mode, worker, reason

    def __str__(self) -> str:
        where = f"step {self.step}"
        if self.mode is not None:
            where += f" (mode {getattr(self.mode, 'name', self.mode)})"
        if self.worker is not None:
            where += f" on {self.worker}"
        extra = f": {self.reason}" if self.reason else ""
        return f"tensor {self.name!r} is not available at {where}{extra}"


class _StepMissing(StepscopeError, KeyError):
    """A step (of a mode) a reader asked for and did not find; `_why` says what became of it."""

    _why = ""

    def __init__(self, step: int, mode=None):
        super().__init__(step)
        self.step, self.mode = step, mode

    def __str__(self) -> str:
        mode = f" in mode {getattr(self.mode, 'name', self.mode)}" if self.mode is not None else ""
        return f"step {self.step}{mode} {self._why}"


class StepUnavailable(_StepMissing):
    """The step was never saved and the job has finished, so it never will be."""

    _why = "was not saved"


class StepNotYetAvailable(_StepMissing):
    """The step is not there yet, but the job is still running and may write it."""

    _why = "is not available yet (the job is still running)"


class NoMoreData(StepscopeError):
    """The job has ended and there is nothing more to read."""


class CorruptRecord(StepscopeError):
    """A file could not be decoded; names the file and the byte offset."""

    def __init__(self, path: str, offset: int | None, reason: str):
        self.path, self.offset, self.reason = path, offset, reason
        at = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{path}{at}: {reason}")


class OutputError(StepscopeError, OSError):
    """A file the command line writes (report, timeline, export) could not be written, or
    its path is not a regular file; names the path. The earlier file is left unchanged."""


class StoreError(StepscopeError, OSError):
    """The store could not read or write an object; names the key or URL."""


class StoreUnavailable(StoreError):
    """The store did not answer in time or answered "try later" (timeouts, resets, 5xx,
    throttling): the writer holds its steps and tries again; a reader reports it."""
