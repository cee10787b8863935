"""The writer's framing stage apart from its threads (capture/step_framing.py)."""

import gc
import json

import numpy as np

from stepscope.capture.step_framing import StepFramer, StepTables, index_json
from stepscope.modes import ModeKeys


def test_index_json_writes_what_json_dumps_writes():
    # Every index file is made by index_json: byte for byte json.dumps's text, whatever
    # the names (escapes, non-ASCII, a '%'), modes, steps and offsets, with shapes or without.
    framer = StepFramer("worker_0", lambda *a: None)
    names = ["loss", "CrossEntropyLoss_output_0", 'a "quoted" \\ name', "100% done %d %s", "é/ü/名前", "tab\there\nnewline", "x" * 300]
    seen = 0
    for step, (mode, mode_step) in enumerate([(ModeKeys.TRAIN, 0), (ModeKeys.EVAL, 7), (ModeKeys.PREDICT, 10**12), (ModeKeys.GLOBAL, 3)]):
        for count in range(len(names) + 1):
            tensors = {name: np.float32(i) for i, name in enumerate(names[:count])}
            for shapes in ({}, {name: (2, 3) for name in names[:count]}):
                offset = 17 * step * count
                parts, index = framer.frame(step * 1000 + count, mode, mode_step, tensors, shapes, parts=[b"x" * offset] if offset else None,
                                            event_key="events/000000000005/000000000005_worker_0.tfevents" if offset else None, offset=offset)
                assert index_json(index) == json.dumps(index).encode()
                assert json.loads(index_json(index)) == index
                seen += 1
    assert seen == 4 * (len(names) + 1) * 2
    # The event file's name is filled into a template made once per mode and names: any
    # name, one template, every step's own.
    for key in ("events/000000000009/000000000009_worker_0.tfevents", 'events/x/100% "w" %s\\é.tfevents'):
        parts, index = framer.frame(9, ModeKeys.TRAIN, 9, {"loss": np.float32(1)}, {}, parts=[b"x"], event_key=key, offset=1)
        assert index_json(index) == json.dumps(index).encode() and json.loads(index_json(index))["meta"]["event_file_name"] == key


def test_what_a_block_of_steps_holds_is_left_out_of_the_garbage_collector_s_passes():
    # A step table holds up to 1,000 steps' entries: as dicts and lists they would age into
    # the collector's oldest generation and bring on its full passes over the training
    # process (with the GIL held); tuples of strings and ints are untracked.
    framer, tables = StepFramer("worker_0", lambda *a: None), StepTables("worker_0")
    for step in range(50):
        _, index = framer.frame(step, ModeKeys.TRAIN, step, {"loss": np.float32(step), "w": np.ones(3)}, {"w": (3,)} if step % 2 else {})
        tables.add(step, index)
    for _ in range(3):  # a pass untracks a tuple whose items are untracked: one level each
        gc.collect()
    assert len(tables._entries) == 50 and not any(gc.is_tracked(entry) for entry in tables._entries)
    key, body = tables.take()
    table = json.loads(body)
    assert key.endswith("000000000000_000000000049.json") and table["layouts"] == [["loss", "w"]]
    assert table["steps"][1] == {"step": 1, "mode": "TRAIN", "mode_step": 1, "starts": table["steps"][1]["starts"], "lengths": table["steps"][1]["lengths"],
                                 "shapes": {"w": [3]}, "layout": 0}
    assert [row["step"] for row in table["steps"]] == list(range(50)) and "shapes" not in table["steps"][0]
