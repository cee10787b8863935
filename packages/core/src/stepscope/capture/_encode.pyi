"""Types of the writer threads' compiled encoders (_encode.c; capture/step_framing.py and step_timeline.py say what they are for)."""

from collections.abc import Callable
from typing import Any

def frame_held(
    steps: list[tuple[Any, ...]],
    names: dict[str, tuple[type, bytes, bytes, int, Any]],
    miss: Callable[[str, Any], tuple[type, bytes, bytes, int, Any] | None],
    file_head: bytes,
    event_key: str,
    event_json: bytes,
    mode_names: tuple[tuple[str, bytes] | None, ...],
    wall_time: float,
    placeholder_crc: bool,
    /,
) -> tuple[bytes, list[bytes], list[tuple[Any, ...]]] | None: ...
def timeline_events(
    events: list[tuple[Any, ...]],
    rank: int,
    quoted: dict[str, bytes],
    quote: Callable[[str], bytes],
    mode_names: tuple[bytes | None, ...],
    /,
) -> tuple[bytes, set[int], int | None, int | None] | None: ...
def scan(data: Any, crc: int | None, itemsize: int, /) -> tuple[int | None, bool | None] | None: ...
def crc32c(data: bytes | memoryview, /) -> int: ...
def frame_array(
    name: str,
    array: Any,
    prefix: bytes,
    metadata: bytes,
    formats: dict[str, int],
    placeholder_crc: bool,
    finite_from: int,
    scanned: tuple[int, bool | None] | None = None,
    /,
) -> tuple[list[bytes | memoryview], int, bool | None] | None: ...
def frame_values(
    items: list[tuple[str, Any]],
    start: int,
    parts: list[Any],
    entries: list[dict[str, Any]],
    arrays: dict[str, Any] | None,
    finite: dict[str, bool] | None,
    names: set[str],
    scanned_type: type,
    prefix: bytes,
    metadata: bytes,
    formats: dict[str, int],
    placeholder_crc: bool,
    finite_from: int,
    align: int,
    place_from: int,
    offset: int,
    budget_s: float,
    keys: tuple[str, str, str],
    /,
) -> tuple[int, int, bool]: ...
def copy_scan(dst: Any, src: Any, itemsize: int, /) -> tuple[int, bool | None] | None: ...
def streaming_stores(on: bool, /) -> bool: ...
