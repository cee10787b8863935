"""Training modes and their names, as smdebug numbered them (TRAIN=1 .. GLOBAL=4)."""

from __future__ import annotations

import enum

from .exceptions import ConfigError


class ModeKeys(enum.IntEnum):
    TRAIN = 1
    EVAL = 2
    PREDICT = 3
    GLOBAL = 4

    @classmethod
    def parse(cls, value: ModeKeys | int | str) -> ModeKeys:
        """Accept a ModeKeys, its number, or its name in any case ("train", "TRAIN")."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().upper()
            if key in cls.__members__:
                return cls[key]
            if key.isdigit():
                value = int(key)
            else:
                raise ConfigError(f"unknown mode {value!r}; expected one of {', '.join(cls.__members__)}")
        try:
            return cls(int(value))
        except (ValueError, TypeError):
            raise ConfigError(f"unknown mode {value!r}; expected one of {', '.join(cls.__members__)}") from None


ALL_MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL)

# smdebug users write `smd.modes.TRAIN`; the same spelling works here.
TRAIN = ModeKeys.TRAIN
EVAL = ModeKeys.EVAL
PREDICT = ModeKeys.PREDICT
GLOBAL = ModeKeys.GLOBAL
