"""Protobuf message classes built at import from a small table in `.proto` field syntax:
no generated code, no dependency on the framework that owns the `.proto` (TensorFlow).
events.py declares TensorFlow's `Event` this way, traces/xspace.py its `XSpace`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "double": _F.TYPE_DOUBLE, "float": _F.TYPE_FLOAT, "int64": _F.TYPE_INT64, "uint64": _F.TYPE_UINT64, "int32": _F.TYPE_INT32,
    "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES,
}  # fmt: skip


def _fields(message: str, spec: str) -> Iterator[tuple[str, int, str, bool]]:
    """(name, number, type, repeated) of each "[repeated] TYPE NAME = NUMBER" in `spec`,
    the declarations separated by ";"."""
    for declaration in filter(None, (part.strip() for part in spec.split(";"))):
        words = declaration.split()
        repeated = words[0] == "repeated"
        if len(words) != 4 + repeated or words[-2] != "=" or not words[-1].isdigit():
            raise ValueError(f"{message}: {declaration!r} is not '[repeated] TYPE NAME = NUMBER'")
        yield words[-3], int(words[-1]), words[-4], repeated


def message_classes(package: str, messages: Mapping[str, str], oneofs: Mapping[str, tuple[str, tuple[str, ...]]] | None = None) -> dict[str, Any]:
    """The message classes of `messages` ({full name: fields}; "Outer.Inner" is nested in
    "Outer"), by full name. A field's TYPE is a scalar (double, float, int64, uint64, int32,
    bool, string, bytes) or the full name of another message of the table. `oneofs` puts
    fields of a message in one oneof: {message: (oneof name, field names)}."""
    oneofs = oneofs or {}
    file = descriptor_pb2.FileDescriptorProto(name=package.replace(".", "/") + ".proto", package=package, syntax="proto3")
    declared: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full_name in sorted(messages, key=lambda name: name.count(".")):  # outer messages first
        outer, _, inner = full_name.rpartition(".")
        if outer and outer not in declared:
            raise ValueError(f"{full_name}: its outer message {outer} is not in the table")
        message = declared[outer].nested_type.add(name=inner) if outer else file.message_type.add(name=inner)
        declared[full_name] = message
        oneof_name, oneof_fields = oneofs.get(full_name, ("", ()))
        for name, number, kind, repeated in _fields(full_name, messages[full_name]):
            label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            field = message.field.add(name=name, number=number, type=_SCALARS.get(kind, _F.TYPE_MESSAGE), label=label)
            if kind not in _SCALARS:
                field.type_name = f".{package}.{kind}"
            if name in oneof_fields:
                if not message.oneof_decl:
                    message.oneof_decl.add(name=oneof_name)
                field.oneof_index = 0
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}")) for name in messages}


__all__ = ["message_classes"]
