"""`HookOptions`: everything a user chooses when creating a hook or callback, in every plugin,
as one frozen, validated value. Written once here; hooks, callbacks and smdebug's hook JSON
(`HookOptions.from_json`) all produce one."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

from ..config import Collection, ProfilerConfig, ReductionConfig, SaveConfig, parse_bool
from ..exceptions import ConfigError
from .hook_config import load_hook_config, option_values

INCLUDE_WORKERS = ("one", "all")


def _one_or_many(field_name: str, value: Any, single: type, what: str) -> tuple[Any, ...]:
    """`value` as a tuple, where one `single` is one item (a string is never its characters)."""
    if isinstance(value, single):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        raise ConfigError(f"{field_name} must be {what}, got {value!r}") from None


def name_tuple(field_name: str, value: Any) -> tuple[str, ...]:
    """A list of names where a single string is one name (never its characters)."""
    if value is None:
        return ()
    items = _one_or_many(field_name, value, str, "a name or a list of names")
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{field_name} must hold non-empty strings, got {item!r} in {value!r}")
    return tuple(dict.fromkeys(items))


def _local_dir(field_name: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip() or "://" in value:
        raise ConfigError(f"{field_name} must be a local folder, got {value!r}")
    return value


@dataclass(frozen=True)
class HookOptions:
    """The options of every stepscope hook and callback (smdebug's names and order).

    - out_dir: a local folder or an s3:// URL; one job per folder.
    - save_config / reduction_config: the defaults of every collection without its own.
    - include_collections: names of collections to save (a string is one name).
    - include_regex: tensors whose name matches go to the "default" collection.
    - save_all: save every tensor the hook sees.
    - include_workers: "one" (rank 0 saves tensors) or "all".
    - profiler_config: system monitor and step timeline.
    - collections: collections defined or reconfigured by the user (included).
    - tensorboard_dir: also write what is saved as TensorBoard scalars and histograms to
      this local folder while training (see docs/export.md).
    - report: write the job's HTML report next to it at close (see docs/report.md).
    """

    out_dir: str
    save_config: SaveConfig | None = None
    reduction_config: ReductionConfig | None = None
    include_collections: tuple[str, ...] = ()
    include_regex: tuple[str, ...] = ()
    save_all: bool = False
    include_workers: str = "one"
    profiler_config: ProfilerConfig | None = None
    collections: tuple[Collection, ...] = ()
    tensorboard_dir: str | None = None
    report: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        out_dir = self.out_dir
        if isinstance(out_dir, os.PathLike):
            out_dir = os.fspath(out_dir)
        if not isinstance(out_dir, str) or not out_dir.strip():
            raise ConfigError(f"out_dir must be a non-empty local path or s3:// URL, got {self.out_dir!r}")
        set_(self, "out_dir", out_dir)
        for name, kind in (("save_config", SaveConfig), ("reduction_config", ReductionConfig), ("profiler_config", ProfilerConfig)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"{name} must be a {kind.__name__}, got {value!r}")
        set_(self, "include_collections", name_tuple("include_collections", self.include_collections))
        set_(self, "include_regex", name_tuple("include_regex", self.include_regex))
        set_(self, "save_all", parse_bool("save_all", self.save_all))
        workers = self.include_workers
        if not isinstance(workers, str) or workers.strip().lower() not in INCLUDE_WORKERS:
            raise ConfigError(f"include_workers must be 'one' or 'all', got {workers!r}")
        set_(self, "include_workers", workers.strip().lower())
        collections = _one_or_many("collections", self.collections, Collection, "a list of Collection")
        for c in collections:
            if not isinstance(c, Collection):
                raise ConfigError(f"collections must hold Collection objects, got {c!r}")
        set_(self, "collections", collections)
        set_(self, "tensorboard_dir", _local_dir("tensorboard_dir", self.tensorboard_dir))
        set_(self, "report", parse_bool("report", self.report))

    @classmethod
    def of(cls, out_dir: str | os.PathLike[str] | HookOptions | None = None, *args: Any, **kwargs: Any) -> HookOptions:
        """Options from a hook's arguments: a HookOptions as is (keywords replace fields),
        else the same positional and keyword arguments as `HookOptions(...)`."""
        if isinstance(out_dir, HookOptions):
            if args:
                raise ConfigError("pass either a HookOptions or the options one by one, not both")
            return out_dir.replace(**kwargs) if kwargs else out_dir
        names = [f.name for f in fields(cls)]
        if len(args) > len(names) - 1:
            raise ConfigError(f"too many positional options ({len(args) + 1}); the options are {', '.join(names)}")
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown}; the options are {', '.join(names)}")
        given = dict(zip(names[1:], args))
        twice = sorted(set(given) & set(kwargs))
        if twice:
            raise ConfigError(f"option(s) {twice} given both by position and by name")
        return cls(out_dir, **given, **kwargs)  # type: ignore[arg-type]

    def replace(self, **changes: Any) -> HookOptions:
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown}")
        return replace(self, **changes)

    @classmethod
    def from_json(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> HookOptions:
        """Options from smdebug's hook JSON (`debughookconfig.json`; without `path`, the file
        named by $STEPSCOPE_HOOK_CONFIG); keyword arguments replace what it says."""
        return cls(**option_values(load_hook_config(path), **overrides))

    def included_names(self) -> list[str]:
        """Collections the user asked for by name or defined (before built-in additions)."""
        return [*self.include_collections, *(c.name for c in self.collections)]
