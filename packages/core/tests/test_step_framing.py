"""The writer's framing stage apart from its threads (capture/step_framing.py)."""

import json

import numpy as np

from stepscope.capture.step_framing import StepFramer, index_json
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
