"""The training side as one package (`stepscope.capture`): the old import paths still work
for one release, with a DeprecationWarning; a training process imports nothing of the
analysis side; the outputs a hook writes beyond tensors come through the registry."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from stepscope.capture import hook_outputs
from stepscope.capture.hook import HookBase
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys

MOVED = [
    "hook", "hook_options", "hook_config", "hook_outputs", "step_counters", "phases", "control", "safety", "cost",
    "scopes", "deadline", "job_claim", "annotation", "evidence", "collection_manager", "writer",
]
MOVED_FROM_PROFILER = ["monitor", "sampler_process", "nvml", "detailed"]
ANALYSIS = ("rules", "report", "export", "ui", "traces", "trial", "step_index", "job_files", "profiler")


def _fresh_import(name: str):
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.mark.parametrize("old, new", [(f"stepscope.{m}", f"stepscope.capture.{m}") for m in MOVED]
                         + [(f"stepscope.profiler.{m}", f"stepscope.capture.{m}") for m in MOVED_FROM_PROFILER])
def test_old_paths_warn_and_forward_every_name(old, new):
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        alias = _fresh_import(old)
    target = importlib.import_module(new)
    public = [n for n in vars(target) if not n.startswith("__")]
    assert public, new
    for name in public:  # private names too: code written against the old module keeps working
        assert getattr(alias, name) is getattr(target, name), (old, name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        alias.no_such_name  # noqa: B018


def test_read_costs_moved_to_the_read_side():
    from stepscope.job_files import read_costs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        alias = _fresh_import("stepscope.cost")
    assert alias.read_costs is read_costs


def test_a_training_process_imports_nothing_of_the_analysis_side(tmp_path):
    # A whole job on the hook base (steps, saved tensors, step timeline, monitor, close),
    # in a fresh interpreter: which stepscope modules did it load?
    code = f"""
import json, sys
import numpy as np
from stepscope.capture.hook import HookBase
from stepscope.config import SaveConfig
hook = HookBase({str(tmp_path / "job")!r}, save_config=SaveConfig(save_interval=1), include_collections=["metrics"])
for step in range(3):
    with hook.step("train"):
        with hook.phase("forward"):
            hook.save_scalar("accuracy", np.float32(step))
hook.close()
print(json.dumps(sorted(m for m in sys.modules if m.startswith("stepscope"))))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "stepscope.capture.hook" in loaded and "stepscope.capture.writer" in loaded
    assert [m for m in loaded if m.split(".")[1:2] and m.split(".")[1] in ANALYSIS] == []
    assert (tmp_path / "job" / "training_job_end.ts").exists()


class _Recorder:
    def __init__(self, request):
        self.request, self.steps, self.closed = request, [], []

    def attach(self, writer):
        writer.step_listeners.append(lambda step, mode, mode_step, arrays: self.steps.append((step, sorted(arrays))))

    def close(self, store, writer):
        self.closed.append(store is not None)


def test_a_registered_output_sees_every_saved_step_and_the_close(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(hook_outputs, "_registry", dict(hook_outputs._registry))
    hook_outputs.register_output("tensorboard", lambda request: made.append(_Recorder(request)) or made[-1])
    writer = Writer(str(tmp_path / "job"))
    outputs = hook_outputs.HookOutputs("worker_0", tensorboard_dir="somewhere")
    outputs.attach(writer)
    for step in range(3):
        writer.write_step(step, ModeKeys.TRAIN, step, {"loss": np.float32(step)})
    writer.close()
    outputs.close(writer.store, writer)
    (recorder,) = made
    assert recorder.request.setting == "somewhere" and recorder.request.worker == "worker_0"
    assert recorder.steps == [(0, ["loss"]), (1, ["loss"]), (2, ["loss"])] and recorder.closed == [True]


def test_register_output_refuses_what_it_could_not_call():
    with pytest.raises(ValueError, match="module:attribute"):
        hook_outputs.register_output("x", "no_colon_here")
    with pytest.raises(ValueError, match="callable"):
        hook_outputs.register_output("x", 42)  # type: ignore[arg-type]
    with pytest.raises(LookupError, match="no hook output named 'nothing'"):
        hook_outputs.output_factory("nothing")
    assert {"tensorboard", "report"} <= set(hook_outputs.registered_outputs())


def test_hook_base_is_the_one_exported():
    import stepscope

    assert stepscope.HookBase is HookBase


def test_the_plugin_contract_is_what_a_plugin_adds():
    from stepscope.capture.plugin import FrameworkPlugin, missing_parts

    assert isinstance(HookBase("unused", validate_only=True), FrameworkPlugin)
    # HookBase alone sees no framework: every part is missing.
    assert missing_parts(HookBase) == [
        "_detect_rank", "_capture", "_is_framework_value", "_on_close", "framework", "builtin_regexes",
        "one of _on_step_begin / _on_step_end / _on_phase_event",
    ]
