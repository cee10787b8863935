"""The engine on real Kineto traces recorded by others (tests/fixtures/traces, see its
README): exact times, sync records, step attribution, unknown devices, NCCL kernels. Every
expected value is computed here from the JSON itself (json with exact decimals), not by
the engine."""

from __future__ import annotations

import decimal
import gzip
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from stepscope.traces.analysis import TraceAnalysis
from stepscope.traces.reader import read_trace
from stepscope.traces.schema import BEFORE_FIRST_STEP, KIND_CODE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
ALL = sorted(p.name for p in FIXTURES.glob("*.json.gz"))


def _json(name: str) -> dict:
    with gzip.open(FIXTURES / name, "rt") as handle:
        return json.load(handle, parse_float=decimal.Decimal)


def _job(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "job" / "profiler-output" / "framework" / "pytorch" / "detailed"
    for index, name in enumerate(names):
        (folder / f"rank{index}").mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / name, folder / f"rank{index}" / name)
    return tmp_path / "job"


def _ns(value: object) -> int:
    return int((decimal.Decimal(str(value)) * 1000).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))


def _agreement_module():  # type: ignore[no-untyped-def]
    """The comparison (stepscope.testing.hta_agreement, shared with bench/bench_hta_agreement.py
    and scripts/check_traces_gpu.py); imported here because it imports pandas-heavy analyzers."""
    from stepscope.testing import hta_agreement

    return hta_agreement


def test_fixtures_are_there() -> None:
    assert len(ALL) >= 15


@pytest.mark.parametrize("name", ALL)
def test_times_are_exact_integer_nanoseconds(name: str) -> None:
    trace = _json(name)
    base = int(trace.get("baseTimeNanoseconds", 0) or 0)
    expected = sorted(
        (e["name"], _ns(e["ts"]) + base, _ns(e.get("dur", 0)))
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel", "gpu_memcpy", "cuda_runtime", "cpu_op")
    )
    table = read_trace(FIXTURES / name).table
    kinds = np.asarray(table.column("kind"))
    categories = np.asarray(table.column("category").to_pandas().astype(str))
    pick = np.isin(categories, ["kernel", "Kernel", "gpu_memcpy", "cuda_runtime", "cpu_op"])
    names = np.asarray(table.column("name").to_pandas().astype(str))[pick]
    got = sorted(zip(names.tolist(), np.asarray(table.column("ts_ns"))[pick].tolist(), np.asarray(table.column("dur_ns"))[pick].tolist()))
    assert got == expected
    assert kinds.size == table.num_rows


def test_ns_resolution_trace_keeps_the_fraction() -> None:
    name = "hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
    table = read_trace(FIXTURES / name).table.to_pandas()
    kernels = table[table["kind"] == KIND_CODE["kernel"]]
    # A float64 of epoch µs x 1000 cannot hold these; the sub-µs digits must survive.
    assert (kernels["ts_ns"] % 1000 != 0).mean() > 0.5


def test_gpu_sync_records_and_host_sync_calls_are_counted_once(tmp_path: Path) -> None:
    name = "hta__critical_path__cuda_event_sync__event_sync_trace.json.gz"
    events = _json(name)["traceEvents"]
    host_calls: dict[str, int] = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" and e["name"] in ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaStreamWaitEvent"):
            host_calls[e["name"]] = host_calls.get(e["name"], 0) + 1
    records = [e for e in events if e.get("cat") == "cuda_sync"]
    assert any(e["args"]["stream"] == -1 for e in records)  # the case that was miscounted
    analysis = TraceAnalysis(_job(tmp_path, name), persist=False)
    syncs = analysis.syncs(rank=0)
    assert dict(zip(syncs["name"], syncs["count"])) == host_calls
    frame = analysis.events(rank=0, kinds=["gpu_sync"])
    assert len(frame) == len(records)
    # GPU time in sync records that no kernel or copy covers, computed from the JSON.
    busy = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    sync_only = 0
    for e in records:
        start, end = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
        covered = np.zeros(end - start, dtype=bool)
        for b_start, b_end in busy:
            covered[max(b_start, start) - start : max(min(b_end, end), start) - start] = True
        sync_only += int((~covered).sum())
    active = analysis.active_time(rank=0)
    assert active["sync_us"].iloc[0] > 0
    gpu_span = [_ns(e["ts"]) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")]
    gpu_end = [_ns(e["ts"]) + _ns(e["dur"]) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")]
    assert active["span_us"].iloc[0] == pytest.approx((max(gpu_end) - min(gpu_span)) / 1000)
    # Overlapping sync records are counted once; the union is at most their sum.
    assert active["sync_us"].iloc[0] <= sync_only / 1000 + 1e-9


def test_work_launched_before_the_window_has_its_own_row(tmp_path: Path) -> None:
    name = "hta__negative_queue_length_values_check__rank0.json.gz"
    events = _json(name)["traceEvents"]
    launches = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    orphans = [e for e in gpu if e["args"].get("correlation", -1) not in launches]
    assert orphans
    analysis = TraceAnalysis(_job(tmp_path, name), persist=False)
    frame = analysis.events(rank=0, kinds=["kernel", "memcpy", "memset"])
    assert int((frame["step"] == BEFORE_FIRST_STEP).sum()) == len(orphans)
    steps = analysis.step_breakdown(rank=0)
    first = steps.iloc[0]
    assert first["step"] == BEFORE_FIRST_STEP
    orphan_kernels = sum(_ns(e["dur"]) for e in orphans if e["cat"] == "kernel")
    assert first["kernel_us"] == pytest.approx(orphan_kernels / 1000)
    # The first real step holds only the work its own calls launched.
    first_step = int(steps["step"].iloc[1])
    assert (frame[frame["step"] == first_step]["correlation"].isin(list(launches))).all()


def test_unknown_device_categories_are_kept_counted_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    name = "hta__mtia_inference_trace__mtia_inference_rank_0.json.gz"
    counts: dict[str, int] = {}
    for e in _json(name)["traceEvents"]:
        if e.get("ph") == "X" and str(e.get("cat", "")).startswith("mtia"):
            counts[e["cat"]] = counts.get(e["cat"], 0) + 1
    assert counts
    analysis = TraceAnalysis(_job(tmp_path, name), persist=False)
    with caplog.at_level(logging.WARNING, logger="stepscope.traces"):
        table = analysis.not_analysed(rank=0)
    assert dict(zip(table["category"], table["events"])) == counts
    assert all(f"{n:,} events of category {c}" in caplog.text for c, n in counts.items())
    other = analysis.events(rank=0, kinds=["other"])
    assert set(counts) <= set(other["category"].astype(str))


def test_nccl_kernels_are_communication_not_a_precision(tmp_path: Path) -> None:
    name = "hta__nccl_parser_config__nccl_data.json.gz"
    nccl = sum(1 for e in _json(name)["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower())
    assert nccl
    by = TraceAnalysis(_job(tmp_path, name), persist=False).kernel_stats(by="precision", rank=0)
    assert by[by["precision"] == "communication"]["count"].sum() == nccl


# --- side by side with HTA 0.5 ------------------------------------------------------------

# The one trace that differs: MTIA's device records (`mtia_*`), which stepscope reads but does
# not analyse (it names them, test above) and HTA counts as kernels because they carry a stream.
NOT_ANALYSED_BY_DESIGN = {"hta__mtia_inference_trace__mtia_inference_rank_0.json.gz"}


@pytest.mark.heavy
@pytest.mark.parametrize("name", ALL)
def test_every_analysis_agrees_with_hta_or_differs_by_a_documented_hta_bug(name: str) -> None:
    pytest.importorskip("hta.trace_analysis")
    _hta_agreement = _agreement_module()
    result = _hta_agreement.compare(FIXTURES / name)
    assert not result.error, result.error
    if name in NOT_ANALYSED_BY_DESIGN:
        assert {p.analysis for p in result.differing()} <= {"temporal", "idle per stream", "launch delay_us", "launch cpu_us"}
        return
    assert result.differing() == []
    assert result.status in ("agrees", "explained")


def test_hta_view_applies_each_documented_bug() -> None:
    """The emulation of HTA's bugs is itself checked on a trace where each one shows."""
    _hta_agreement = _agreement_module()
    name = "hta__negative_queue_length_values_check__rank0.json.gz"
    raw = read_trace(FIXTURES / name)
    events = raw.table.to_pandas()
    view = _hta_agreement.hta_view(events, fractional=False, base_ns=raw.base_ns)
    gpu = view[view["kind"].isin([KIND_CODE["kernel"], KIND_CODE["memcpy"], KIND_CODE["memset"]])]
    assert (gpu["step"] != BEFORE_FIRST_STEP).all()  # work launched before the trace: dropped
    steps = sorted(events.loc[events["name"].astype(str).str.startswith("ProfilerStep#"), "step"].unique())
    assert steps[-1] not in set(gpu["step"])  # the last step: dropped
    ns = read_trace(FIXTURES / "hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    rounded = _hta_agreement.hta_view(ns.table.to_pandas(), fractional=True, base_ns=ns.base_ns)
    assert ((rounded["ts_ns"] - ns.base_ns) % 1000 == 0).all()
