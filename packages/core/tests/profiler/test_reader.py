"""ProfilerTrial over system metrics: both SageMaker layouts, filters, bad lines, refresh."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from stepscope.exceptions import ConfigError
from stepscope.profiler import ProfilerTrial, create_profiler_trial
from stepscope.store import LocalStore

T0 = 1_700_000_000.0


def _rows(start, count, node="algo-1", step=1.0):
    rows = []
    for i in range(count):
        ts = start + i * step
        rows.append((ts, node, "cpu", "cpu0", "CPUUtilization", float(i % 100)))
        rows.append((ts, node, "gpu", "gpu0", "GPUUtilization", 50.0))
    return rows


@pytest.mark.parametrize("legacy_flat", [False, True])
def test_both_layouts_read_alike(tmp_path, metric_files, legacy_flat):
    metric_files(tmp_path, _rows(T0, 150) + _rows(T0, 150, node="algo-2"), legacy_flat=legacy_flat)
    trial = create_profiler_trial(str(tmp_path))
    df = trial.system_metrics()
    assert list(df.columns) == ["timestamp", "node_id", "type", "name", "dimension", "value"]
    assert len(df) == 600
    assert df["timestamp"].is_monotonic_increasing
    assert trial.nodes() == ["algo-1", "algo-2"]
    assert trial.time_range() == (T0, T0 + 149)


def test_time_and_name_filters(tmp_path, metric_files):
    metric_files(tmp_path, _rows(T0, 300))
    trial = ProfilerTrial(tmp_path)
    window = trial.system_metrics(start=T0 + 100, end=T0 + 109)
    assert sorted(window["timestamp"].unique()) == [T0 + 100 + i for i in range(10)]
    gpu = trial.system_metrics(names=["GPUUtilization"])
    assert set(gpu["dimension"]) == {"GPUUtilization"} and len(gpu) == 300
    by_name = trial.system_metrics(names=["cpu0"])
    assert set(by_name["dimension"]) == {"CPUUtilization"}
    as_datetime = trial.system_metrics(start=dt.datetime.fromtimestamp(T0 + 290, tz=dt.timezone.utc))
    assert len(as_datetime) == 20
    naive_utc = trial.system_metrics(start=dt.datetime.utcfromtimestamp(T0 + 290))
    assert len(naive_utc) == 20
    with pytest.raises(ConfigError, match="start"):
        trial.system_metrics(start="yesterday")


def test_truncated_and_bad_lines_are_skipped_with_a_warning_naming_the_file(tmp_path, metric_files, caplog):
    (path,) = metric_files(tmp_path, _rows(T0 - T0 % 60, 10))
    text = path.read_text().splitlines()
    text[3] = '{"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtilization", "Value": "high", "NodeId": "algo-1", "Timestamp": 1}'
    path.write_text("\n".join(text) + '\n{"Type": "gpu", "Name": "gpu0", "Dimen')
    with caplog.at_level(logging.WARNING, logger="stepscope.profiler"):
        df = ProfilerTrial(tmp_path).system_metrics()
    assert len(df) == 19
    (warning,) = [r.getMessage() for r in caplog.records]
    assert str(path) in warning and "2 unreadable line(s)" in warning and "line 4" in warning


def test_a_file_that_is_not_text_leaves_the_rest_readable(tmp_path, metric_files, caplog):
    paths = metric_files(tmp_path, _rows(T0, 130))
    paths[0].write_bytes(b"\x00\xff\xfe garbage")
    with caplog.at_level(logging.WARNING, logger="stepscope.profiler"):
        df = ProfilerTrial(tmp_path).system_metrics()
    assert len(df) > 0 and df["timestamp"].min() >= T0 + 60 - T0 % 60 - 1
    assert any(str(paths[0]) in r.getMessage() for r in caplog.records)


def test_refresh_follows_a_running_job(tmp_path, metric_files):
    minute = T0 - T0 % 60
    metric_files(tmp_path, _rows(minute, 60))
    trial = ProfilerTrial(LocalStore(tmp_path))
    assert len(trial.system_metrics()) == 120
    metric_files(tmp_path, _rows(minute + 60, 60))
    assert len(trial.system_metrics()) == 120  # not seen until refresh
    assert trial.refresh() == 1
    assert len(trial.system_metrics()) == 240
    assert trial.refresh() == 0


def test_an_empty_job(tmp_path):
    trial = ProfilerTrial(tmp_path)
    assert trial.system_metrics().empty
    assert trial.step_timeline().empty
    assert trial.time_range() is None and trial.job_start() is None
