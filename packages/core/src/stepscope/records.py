"""TFRecord framing: `u64 length | u32 masked_crc32c(length) | payload | u32 masked_crc32c(payload)`.

CRC-32C comes from the `crc32c` C extension (hardware-accelerated, releases the GIL)."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import struct
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType

from .exceptions import CorruptRecord


def _crc32c_extension() -> ModuleType:
    """The `crc32c` distribution's C extension. Loaded by itself where it can be: the
    package's __init__ reads every installed distribution's metadata (for __version__) and
    imports argparse for its command line, which doubled the time of `import stepscope` in
    a large environment, for a function we call straight from the extension."""
    if "crc32c" not in sys.modules:
        try:
            spec = importlib.util.find_spec("crc32c")
            for folder in (spec.submodule_search_locations or []) if spec is not None else []:
                for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                    path = os.path.join(folder, "_crc32c" + suffix)
                    if os.path.isfile(path):
                        loader = importlib.machinery.ExtensionFileLoader("crc32c._crc32c", path)
                        module = importlib.util.module_from_spec(importlib.machinery.ModuleSpec("crc32c._crc32c", loader, origin=path))
                        loader.exec_module(module)
                        if callable(getattr(module, "crc32c", None)):
                            return module
        except Exception:  # another layout of the package: import it the usual way
            pass
    import crc32c

    return crc32c


_crc32c = _crc32c_extension()

HEADER_SIZE = 12
FOOTER_SIZE = 4
OVERHEAD = HEADER_SIZE + FOOTER_SIZE
_MASK_DELTA = 0xA282EAD8
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_HEADER = struct.Struct("<QI")  # length, masked CRC of the length
# smdebug wrote the masked CRC of the ASCII text "0x12345678" instead of each tensor payload's CRC.
SMDEBUG_PLACEHOLDER_CRC = 0x062DC0B3


def crc32c(data: bytes | memoryview, value: int = 0) -> int:
    """The CRC-32C of `data` (unmasked), continued from `value`: the CRC of what came before."""
    return _crc32c.crc32c(data, value)


def masked_crc(data: bytes | memoryview) -> int:
    return mask(_crc32c.crc32c(data))


def mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# A payload in one buffer up to this size is framed into one joined buffer (a copy costs
# less than handing three small buffers on to the writer's gathered write).
_JOIN_BELOW = 64 * 1024


@functools.lru_cache(maxsize=2048)
def _header(length: int) -> bytes:
    """A record's header for a payload of `length` bytes (small records' lengths repeat
    from step to step: the losses')."""
    length_bytes = _U64.pack(length)
    return length_bytes + _U32.pack(masked_crc(length_bytes))


def frame(parts: Sequence[bytes | memoryview], *, placeholder_crc: bool = False, crc: int | None = None) -> list[bytes | memoryview]:
    """Frame a payload given as several buffers, without joining them (no copy of big tensors).
    `placeholder_crc` writes smdebug's constant instead of the payload CRC: smdebug's own
    reader (check="minimal", its default) accepts nothing else in tensor files. `crc`: the
    payload's CRC-32C where the caller has it already (unmasked, as crc32c gives it). A small
    payload in one `bytes` comes back as the whole record in one buffer."""
    if len(parts) == 1 and type(parts[0]) is bytes and len(parts[0]) < _JOIN_BELOW:
        payload = parts[0]
        footer = SMDEBUG_PLACEHOLDER_CRC if placeholder_crc else mask(_crc32c.crc32c(payload))
        return [b"".join((_header(len(payload)), payload, _U32.pack(footer)))]
    length = sum(memoryview(p).nbytes for p in parts)
    length_bytes = _U64.pack(length)
    if placeholder_crc:
        footer = SMDEBUG_PLACEHOLDER_CRC
    elif crc is not None:
        footer = mask(crc)
    else:
        crc = 0
        for part in parts:
            crc = _crc32c.crc32c(part, crc)
        footer = mask(crc)
    return [length_bytes + _U32.pack(masked_crc(length_bytes)), *parts, _U32.pack(footer)]


def frame_sized(parts: Sequence[bytes | memoryview], *, placeholder_crc: bool = False, crc: int | None = None) -> tuple[list[bytes | memoryview], int]:
    """`frame(parts)` and the record's length in bytes (header + payload + footer)."""
    framed = frame(parts, placeholder_crc=placeholder_crc, crc=crc)
    return framed, int.from_bytes(framed[0][:8], "little") + OVERHEAD


def frame_bytes(payload: bytes) -> bytes:
    return b"".join(frame([payload]))


def parse_record(buf: bytes | memoryview, offset: int = 0, *, path: str = "<memory>", allow_placeholder_crc: bool = False) -> tuple[memoryview, int]:
    """Decode the record starting at `offset`; return (payload, offset of the next record)."""
    start, end = payload_bounds(buf, offset, path=path, allow_placeholder_crc=allow_placeholder_crc)
    return memoryview(buf)[start:end], end + FOOTER_SIZE


def payload_bounds(buf: bytes | memoryview, offset: int = 0, *, path: str = "<memory>", allow_placeholder_crc: bool = False) -> tuple[int, int]:
    """(start, end) of the payload of the record at `offset`, both CRCs checked: a reader
    decodes it in place, without a view or a copy."""
    size = len(buf)
    if size - offset < HEADER_SIZE:
        raise CorruptRecord(path, offset, f"truncated record header ({size - offset} of {HEADER_SIZE} bytes)")
    (length, length_crc) = _HEADER.unpack_from(buf, offset)
    if mask(_crc32c.crc32c(memoryview(buf)[offset : offset + 8])) != length_crc:
        raise CorruptRecord(path, offset, "length CRC mismatch (corrupt record header)")
    start = offset + HEADER_SIZE
    end = start + length
    if end + FOOTER_SIZE > size:
        raise CorruptRecord(path, offset, f"truncated record: needs {HEADER_SIZE + length + FOOTER_SIZE} bytes, {size - offset} left")
    (payload_crc,) = _U32.unpack_from(buf, end)
    if not (allow_placeholder_crc and payload_crc == SMDEBUG_PLACEHOLDER_CRC) and payload_crc != mask(_crc32c.crc32c(memoryview(buf)[start:end])):
        raise CorruptRecord(path, offset, "payload CRC mismatch (corrupt data)")
    return start, end


def iter_records(buf: bytes | memoryview, *, path: str = "<memory>", allow_placeholder_crc: bool = False) -> Iterator[tuple[int, memoryview]]:
    """Yield (offset, payload) for every record in a whole file."""
    offset = 0
    size = len(memoryview(buf))
    while offset < size:
        payload, next_offset = parse_record(buf, offset, path=path, allow_placeholder_crc=allow_placeholder_crc)
        yield offset, payload
        offset = next_offset
