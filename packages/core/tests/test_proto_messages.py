"""The descriptor tables in .proto field syntax (stepscope.proto_messages): wire bytes
checked against the protobuf encoding written out by hand, nesting, oneofs, and errors that
name the bad declaration."""

from __future__ import annotations

import pytest

from stepscope.proto_messages import message_classes


def test_fields_nested_messages_and_oneof_encode_as_protobuf_specifies():
    classes = message_classes(
        "stepscope.test",
        {"Outer": "int64 id = 1; repeated Outer.Inner items = 2; string note = 3", "Outer.Inner": "double x = 1; bool flag = 2; bytes raw = 3"},
        oneofs={"Outer.Inner": ("value", ("x", "flag"))},
    )
    outer = classes["Outer"](id=300, note="hi")
    outer.items.add(x=1.0)
    # id: tag 0x08, varint 300 = ac 02; items: tag 0x12, length 9, inner x: tag 0x09 + 8 bytes
    # little-endian double 1.0; note: tag 0x1a, length 2, "hi".
    assert outer.SerializeToString() == b"\x08\xac\x02" + b"\x12\x09\x09" + b"\x00" * 6 + b"\xf0\x3f" + b"\x1a\x02hi"
    inner = classes["Outer.Inner"](x=2.0)
    inner.flag = True  # one field of the oneof replaces the other
    assert inner.WhichOneof("value") == "flag" and inner.x == 0.0


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ({"A": "int64 id 1"}, "A: 'int64 id 1' is not '\\[repeated\\] TYPE NAME = NUMBER'"),
        ({"A": "optional int64 id = 1"}, "A: 'optional int64 id = 1'"),
        ({"A.B": "int64 id = 1"}, "A.B: its outer message A is not in the table"),
    ],
)
def test_a_bad_table_names_the_message_and_declaration(messages, error):
    with pytest.raises(ValueError, match=error):
        message_classes("stepscope.bad", messages)
