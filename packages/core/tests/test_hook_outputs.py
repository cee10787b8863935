"""HookOutputs, driven as a hook base drives it, around a real Writer: the live TensorBoard
run (read back by TensorBoard's loader), the cost file, and the report at close."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from stepscope.capture.hook_outputs import HookOutputs, imported_versions
from stepscope.capture.writer import Writer
from stepscope.job_files import read_costs
from stepscope.modes import ModeKeys


def _drive(out_dir, tensorboard_dir=None, report=False, steps=4):
    writer = Writer(str(out_dir))
    outputs = HookOutputs("worker_0", tensorboard_dir=tensorboard_dir, report=report)
    outputs.attach(writer)
    saved = {}
    for step in range(steps):
        outputs.meter.step_begins(step, time.perf_counter())
        tensors = {"loss": np.float32(1.0 / (step + 1)), "fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3) * step}
        outputs.meter.timed(writer.write_step)(step, ModeKeys.TRAIN, step, tensors)
        saved[step] = tensors
    writer.close()
    outputs.close(writer.store, writer)
    return writer, saved


def test_live_tensorboard_run(tmp_path):
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    _drive(tmp_path / "job", tensorboard_dir=str(tmp_path / "tb"))
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path / "tb"))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path / "tb"))
    scalars = provider.read_scalars(context.RequestContext(), experiment_id="", plugin_name="scalars", downsample=100)
    points = scalars["train"]["loss"]
    assert [p.step for p in points] == [0, 1, 2, 3]
    assert [p.value for p in points] == pytest.approx([1.0, 0.5, 1 / 3, 0.25])
    histograms = provider.read_tensors(context.RequestContext(), experiment_id="", plugin_name="histograms", downsample=100)
    assert [d.step for d in histograms["train"]["fc.weight"]] == [0, 1, 2, 3]  # step 0 is all zeros: one bucket
    assert histograms["train"]["fc.weight"][-1].numpy[:, 2].sum() == 6


def test_cost_file_measures_the_hook_and_the_writer(tmp_path):
    writer, _ = _drive(tmp_path / "job")
    cost = read_costs(writer.store)["worker_0"]
    assert cost.steps == 4 and len(cost.samples) == 4
    assert 0 < cost.hook_s <= cost.step_s
    assert cost.writer_s == writer.busy_s > 0
    on_disk = sum(p.stat().st_size for p in (tmp_path / "job").rglob("*") if p.is_file() and ("events" in p.parts or "index" in p.parts))
    assert writer.bytes_written >= on_disk > 0  # every event and index file, plus the collections-free rest
    assert imported_versions()["numpy"] == np.__version__ and cost.versions["numpy"] == np.__version__


def test_report_at_close(tmp_path):
    writer, _ = _drive(tmp_path / "job", report=True)
    html = (tmp_path / "job" / "stepscope-report.html").read_text()
    assert 'data-section="cost"' in html and 'data-table="cost"' in html


def test_a_failing_listener_is_dropped_not_fatal(tmp_path):
    writer = Writer(str(tmp_path / "job"))
    calls = []

    def broken(step, mode, mode_step, arrays):
        calls.append(step)
        raise RuntimeError("nope")

    writer.step_listeners.append(broken)
    for step in range(3):
        writer.write_step(step, ModeKeys.TRAIN, step, {"x": np.ones(2)})
    writer.close()
    assert calls == [0] and not writer.failed
    assert json.loads((tmp_path / "job" / "index" / "000000000" / "000000000002_worker_0.json").read_text())["tensor_payload"]


def test_bytes_written_holds_every_file_the_writer_published(tmp_path):
    # Losses at every step: held batches, their held tables and the step tables
    # (stepscope-index/, here larger than the event files). The step tables were left out
    # of the cost file's bytes: 260 KB counted of 398 KB published in a 1,000-step run.
    from stepscope.capture.hook import HookBase
    from stepscope.config import ProfilerConfig

    job = tmp_path / "job"
    hook = HookBase(str(job), profiler_config=ProfilerConfig.disabled())
    for step in range(600):
        hook.begin_step("train")
        hook.save_loss(1.0 / (step + 1))
    hook.close()
    cost = read_costs(hook.store)["worker_0"]
    published = {folder: sum(p.stat().st_size for p in (job / folder).rglob("*") if p.is_file()) for folder in ("events", "index", "stepscope-index")}
    assert all(published.values()), published
    # (A step table is written again as it grows: bytes written, not bytes kept.)
    assert sum(published.values()) <= cost.bytes_written <= 2 * sum(published.values())


@pytest.mark.parametrize("routine", [False, True], ids=["weights-due", "scalars-due"])
def test_begin_step_accounts_steps_in_blocks_as_the_meter_does(tmp_path, routine):
    # begin_step feeds the meter itself (it runs every step): every BLOCK_STEPS steps where
    # nothing is due, and around each step where tensors are (the step, the one that ends
    # it, and the next, whose idle begin the untimed steps are counted at); a step where
    # only routine collections are due (losses, metrics, the default collection: saved at
    # every step under the capture defaults) is sampled like one where nothing is. The
    # totals count every step.
    from stepscope.capture.cost import BLOCK_STEPS, MAX_SAMPLES, CostMeter
    from stepscope.capture.hook import HookBase
    from stepscope.config import ProfilerConfig, SaveConfig

    due_every = 50
    collection = "metrics" if routine else "weights"
    hook = HookBase(str(tmp_path / "job"), profiler_config=ProfilerConfig.disabled(), save_config=SaveConfig(save_interval=due_every), include_collections=[collection])
    hook.outputs.meter.min_block_s = 0  # blocks of BLOCK_STEPS however short (they grow on fast steps: below)
    steps = BLOCK_STEPS * (2 * MAX_SAMPLES) + 101
    for step in range(steps):
        hook.begin_step("train")
        if step % due_every == 0:
            hook.save_tensor("m", np.full(2, float(step)), collection)
    meter = hook.outputs.meter
    reference = CostMeter("worker_0")
    expected_starts = []
    last = None
    for step in range(steps):
        due, after_due = step % due_every == 0, step > 0 and (step - 1) % due_every in (0, 1)
        if last is None or (not routine and (due or after_due)) or step >= last + BLOCK_STEPS:
            expected_starts.append(step)
            last = step
    for step in expected_starts:
        reference.step_begins(step, float(step))
    hook.close()
    reference.step_ends(float(steps), steps)
    assert meter.cost.steps == reference.cost.steps == steps
    assert [s[0] for s in meter.cost.samples] == [s[0] for s in reference.cost.samples]
    assert meter._stride == reference._stride > 1
    assert 0 < sum(h for _, _, h in meter.cost.samples) <= meter.hook_s
    # (Both are times: in this loop a step is little but the hook, so their order is the
    # machine's to decide, not the meter's; a CI run under load measured hook_s > step_s.)
    assert meter.cost.step_s > 0 and meter.hook_s > 0
    # Untimed steps are counted at the last measured idle begin time: every step has some.
    assert meter.idle_begin_s > 0


def test_a_slow_save_beginning_a_block_does_not_stand_for_the_untimed_steps(tmp_path):
    # Saves every BLOCK_STEPS steps begin where blocks begin. A save's begin (20 ms here: a
    # model's weights copied) was taken for an idle begin there, and every untimed step
    # after it was counted at 20 ms: the cost file said the hooks took several times the
    # run. (Found with a torch MLP saving weights and gradients every 10 steps: 7.7 s of
    # hook time in a 2.7 s run.)
    from stepscope.capture.cost import BLOCK_STEPS
    from stepscope.capture.hook import HookBase
    from stepscope.config import ProfilerConfig, SaveConfig

    class SlowSaves(HookBase):
        def _on_step_begin(self, due: bool) -> None:
            super()._on_step_begin(due)
            if due:
                time.sleep(0.02)

    hook = SlowSaves(str(tmp_path / "job"), profiler_config=ProfilerConfig.disabled(), save_config=SaveConfig(save_interval=BLOCK_STEPS), include_collections=["weights"])
    meter = hook.outputs.meter
    meter.min_block_s = 0  # (blocks of BLOCK_STEPS, however short the steps)
    saves = 6
    for step in range(BLOCK_STEPS * saves):
        hook.begin_step("train")
        if step % BLOCK_STEPS == 0:
            hook.save_tensor("w", np.full(2, float(step)), "weights")
    assert meter.idle_begin_s < 0.002
    hook.close()
    assert 0.02 * saves <= meter.hook_s < 0.02 * saves + 0.5


def test_untimed_steps_are_counted_at_the_median_of_the_last_idle_begins():
    # One outlier among the idle begins measured (the first step's warm-up, a page fault)
    # must not stand for a block of steps; and after a step that was not idle the next one
    # is timed, so that saves more frequent than blocks still leave idle steps measured.
    from stepscope.capture.cost import BLOCK_STEPS, IDLE_SAMPLES, CostMeter

    meter = CostMeter("worker_0", min_block_s=0)
    assert meter.steps_begin(0, 0.0, 0.5, True) == BLOCK_STEPS  # the outlier, first
    assert meter.idle_begin_s == 0.5
    step = 0
    for _ in range(2):
        step += BLOCK_STEPS
        meter.steps_begin(step, float(step), 1e-6, True)
    assert meter.idle_begin_s == 1e-6  # the median of three
    assert meter.steps_begin(step + 1, step + 1.0, 0.3, False) == 1  # a save: the next step is timed
    assert meter.idle_begin_s == 1e-6  # (a save's begin is no idle one)
    for i in range(IDLE_SAMPLES):
        meter.steps_begin(step + 2 + i, step + 2.0 + i, 1e-6 * (i + 1), True)
    assert meter.idle_begin_s == 3e-6  # the median of the last IDLE_SAMPLES, the outlier gone
    # An untimed block is counted at that median.
    before = meter.hook_s
    meter.steps_begin(step + 2 + IDLE_SAMPLES + 10, 0.0, 1e-6, True)
    assert meter.hook_s - before == pytest.approx(10 * 3e-6 + 1e-6)  # ten untimed steps, and the timed one


def test_blocks_grow_while_steps_are_short_and_shrink_back():
    # The timed step costs a call into Python: on microsecond steps a block of BLOCK_STEPS
    # would make that a visible share of the loop, so blocks double until one lasts
    # min_block_s, and halve again (not below BLOCK_STEPS) once one lasts over 4x that.
    from stepscope.capture.cost import BLOCK_STEPS, MAX_BLOCK_STEPS, CostMeter

    meter = CostMeter("worker_0", min_block_s=0.005)
    step, at, lengths = 0, 0.0, []

    def run_blocks(n: int, step_s: float) -> None:
        nonlocal step, at
        for _ in range(n):
            length = meter.steps_begin(step, at, 1e-6, True)
            lengths.append(length)
            step += length
            at += length * step_s

    run_blocks(12, 10e-6)  # 10 us steps: a block needs 500 steps to last 5 ms
    assert lengths[:6] == [BLOCK_STEPS, 2 * BLOCK_STEPS, 4 * BLOCK_STEPS, 8 * BLOCK_STEPS, 16 * BLOCK_STEPS, 16 * BLOCK_STEPS]
    assert set(lengths[5:]) == {512}  # 5.12 ms: long enough, and not over 20 ms
    run_blocks(6, 1e-3)  # 1 ms steps: 512 steps last 0.5 s
    assert lengths[-6:] == [512, 256, 128, 64, 32, 32]
    run_blocks(20, 1e-9)
    assert max(lengths) == MAX_BLOCK_STEPS
    # Every step is counted whatever the blocks were.
    meter.step_ends(at, step)
    assert meter.cost.steps == step
