"""The facade over a job's detailed traces: one method per question, each returning a
pandas DataFrame (times in microseconds, `*_us`). Reached as `create_trial(path).profiler.traces`
or `TraceAnalysis(path)`; documented in docs/traces.md.

Every method takes `rank` (None: every rank, with a `rank` column first) and `steps`
(None, or `(first, last)` inclusive, or a range) to narrow what it looks at."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator

import pandas as pd
import pyarrow as pa

from ..cli_common import parse_steps as _parse_step_text
from ..exceptions import StepscopeError
from ..store import Store
from . import sources
from .analyzers import allocations, common, cpu_ops, idle, kernels, launches, memory, steps, syncs
from .tables import TableWriter, TraceInfo, list_trace_keys, load_trace, loose_trace_keys

logger = logging.getLogger("stepscope.traces")

StepRange = tuple[int, int] | range | None
Progress = Callable[[str, int, int | None], None]


class TraceAnalysis:
    """Kineto / XSpace traces as tables per rank, and the analyses over them. `path`: a job
    (its traces under profiler-output/framework/), any folder of traces (nested; e.g.
    torch.profiler.tensorboard_trace_handler's output), or one trace file; local or s3://.
    Traces are parsed on first use (and their tables persisted under `stepscope-traces/`
    beside them, or in the user's cache when that folder cannot be written, when `persist`,
    in the background: `wait_persisted()` waits for them, and a process does not exit
    before they are written); later analyses read the Parquet tables."""

    def __init__(self, path: str | os.PathLike[str] | Store, *, persist: bool = True, progress: Progress | None = None, keys: Iterable[str] | None = None):
        if isinstance(path, Store):
            self.store, located = path, None
        else:
            self.store, located = sources.locate(path)
        self.persist = persist
        self.progress = progress
        keys = keys if keys is not None else located
        self._keys = sorted(keys) if keys is not None else None
        self._tables: Store | None = None  # where the tables go, decided on the first parse
        self._default_ranks: dict[str, int] | None = None
        self._loaded: dict[str, tuple[TraceInfo, pd.DataFrame]] = {}
        # Traces that could not be read, with why: each is skipped (one corrupt or hostile
        # trace never makes the job's other traces unreadable) and named here.
        self.problems: dict[str, str] = {}
        self._timeline: pd.DataFrame | None = None
        self._writer = TableWriter()

    def __repr__(self) -> str:
        return f"TraceAnalysis({self.store.url!r})"

    # --- the traces ---------------------------------------------------------------------

    def wait_persisted(self) -> None:
        """Block until the tables of the traces parsed so far are written."""
        self._writer.wait()

    def trace_keys(self) -> list[str]:
        """The traces: a job's under profiler-output/framework/, else every trace file of
        the folder (a user's own traces)."""
        if self._keys is None:
            self._keys = list_trace_keys(self.store) or loose_trace_keys(self.store)
        return list(self._keys)

    def traces(self) -> pd.DataFrame:
        """One row per trace: key, rank, events, start_ns, end_ns."""
        rows = [info.to_row() for info, _ in self._readable()]
        return pd.DataFrame(rows, columns=["key", "rank", "events", "start_ns", "end_ns"])

    @property
    def ranks(self) -> list[int]:
        return sorted({info.rank for info, _ in self._readable()})

    def events(self, rank: int | None = None, steps: StepRange = None, kinds: Iterable[str] | None = None) -> pd.DataFrame:
        """The event table (schema in docs/traces.md), optionally of some kinds only."""
        frames = [self._events(r, steps) for r in self._ranks(rank)]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if kinds is not None and not frame.empty:
            from .analyzers.common import of_kind

            frame = of_kind(frame, *kinds).reset_index(drop=True)
        return frame

    # --- analyses -----------------------------------------------------------------------

    def kernel_stats(self, by: str = "name", rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """Per kernel (and per `by` in name/stream/step/annotation/precision): count,
        total_us, mean_us, p50_us, p95_us, max_us, precision."""
        return self._per_rank(rank, steps, lambda e, r: kernels.kernel_stats(e, by=by))

    def top_kernels(self, k: int = 10, by: str = "time", rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """The k kernels with the most time (`by="time"`) or launches (`by="launches"`)."""
        return self._per_rank(rank, steps, lambda e, r: kernels.top_kernels(e, k=k, by=by))

    def launch_latency(self, rank: int | None = None, steps: StepRange = None, outlier_us: float = launches.OUTLIER_US) -> pd.DataFrame:
        """Per kernel: launches, total/mean/p50/p95/max launch delay (µs), outliers."""
        return self._per_rank(rank, steps, lambda e, r: launches.launch_latency(e, outlier_us=outlier_us))

    def launches(self, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """One row per launched GPU activity with its launch call and delay_ns."""
        return self._per_rank(rank, steps, lambda e, r: launches.launches(e))

    def memory_ops(self, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """Per direction (H2D/D2H/D2D/P2P/memset) and host memory: count, bytes, total_us, bandwidth_gbps."""
        return self._per_rank(rank, steps, lambda e, r: memory.memory_ops(e))

    def memory_timeline(self, rank: int | None = None, steps: StepRange = None, max_points: int = 4000) -> pd.DataFrame:
        """Allocator totals per device after each [memory] event: ts_ns, step, device,
        allocated, reserved; at most about `max_points` rows per device (peaks kept)."""
        return self._per_rank(rank, steps, lambda e, r: allocations.memory_timeline(e, max_points=max_points))

    def step_spans(self, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """The profiled steps' ProfilerStep#N intervals: step, ts_ns, dur_ns."""
        return self._per_rank(rank, steps, lambda e, r: steps_module.profiler_steps(e) if not e.empty else pd.DataFrame(columns=["step", "ts_ns", "dur_ns"]))

    def memory_steps(self, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """Per step and device: allocations, frees, bytes, start/end/peak allocated, peak
        reserved, and the op, annotation and module live at the peak."""
        return self._per_rank(rank, steps, lambda e, r: allocations.memory_steps(e))

    def memory_growth(self, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """Per step and device: allocations that outlive their step, those never freed in
        the trace, and the step's net change of the total allocated."""
        return self._per_rank(rank, steps, lambda e, r: allocations.memory_growth(e))

    def allocating_ops(self, k: int | None = 20, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """Per operator: allocations, bytes allocated and freed, self_bytes (torch's self
        memory usage), the largest allocation, bytes outliving their step."""
        return self._per_rank(rank, steps, lambda e, r: allocations.top_allocating_ops(e, k=k))

    def memory_peak(self, rank: int | None = None, steps: StepRange = None, device: str | None = None) -> pd.DataFrame:
        """What was live at the highest peak (of `device`, else the highest device), by op."""
        return self._per_rank(rank, steps, lambda e, r: allocations.peak_breakdown(e, device=device))

    def memory_ranks(self, steps: StepRange = None) -> pd.DataFrame:
        """Per rank and device: the highest peak allocated/reserved and its ratio to the
        median rank's peak."""
        return allocations.rank_peaks({r: allocations.memory_steps(self._events(r, steps)) for r in self.ranks})

    def device_memory(self) -> pd.DataFrame:
        """Per rank and GPU: the device's memory in bytes as the traces' `deviceProperties`
        give it (`totalGlobalMem`): rank, device (cuda:<id>), total_bytes."""
        rows = {}
        for info, _ in self._readable():
            for entry in info.metadata.get("deviceProperties") or ():
                if isinstance(entry, dict) and isinstance(entry.get("id"), int) and isinstance(entry.get("totalGlobalMem"), int):
                    rows[(info.rank, f"cuda:{entry['id']}")] = entry["totalGlobalMem"]
        return pd.DataFrame([{"rank": r, "device": d, "total_bytes": b} for (r, d), b in sorted(rows.items())], columns=["rank", "device", "total_bytes"])

    def syncs(self, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """Per synchronize call: count, total/mean/max µs, gpu_wait_us, waited_for."""
        return self._per_rank(rank, steps, lambda e, r: syncs.sync_stats(e))

    def sync_events(self, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        return self._per_rank(rank, steps, lambda e, r: syncs.sync_events(e))

    def temporal_breakdown(self, rank: int | None = None, steps: StepRange = None, per_step: bool = False) -> pd.DataFrame:
        """GPU span, busy, idle, compute and non-compute time (µs and % of the span)."""
        return self._per_rank(rank, steps, lambda e, r: idle.temporal_breakdown(e, per_step=per_step))

    def active_time(self, rank: int | None = None, steps: StepRange = None, per_step: bool = False) -> pd.DataFrame:
        """GPU time split into kernel_us, memory_us (memcpy/memset), sync_us (GPU-side sync
        records) and idle_us over the GPU span; the parts add up to span_us."""
        return self._per_rank(rank, steps, lambda e, r: idle.active_time(e, per_step=per_step))

    def idle_breakdown(self, rank: int | None = None, steps: StepRange = None, per_step: bool = False, kernel_wait_us: float = idle.KERNEL_WAIT_US) -> pd.DataFrame:
        """Per stream (and step): idle time split into host_wait_us, kernel_wait_us, other_us."""
        return self._per_rank(rank, steps, lambda e, r: idle.idle_breakdown(e, kernel_wait_us=kernel_wait_us, per_step=per_step))

    def cpu_ops(self, k: int | None = 20, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """Top CPU operators by inclusive time, with their self time."""
        return self._per_rank(rank, steps, lambda e, r: cpu_ops.cpu_op_stats(e, k=k))

    def step_breakdown(self, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """Per profiled step: step_us, kernel_us, gpu_busy_us, gpu_idle_us, memcpy_us,
        sync_us, and data/forward/backward/optimizer from the step timeline."""
        timeline = self.step_timeline()
        return self._per_rank(rank, steps, lambda e, r: steps_module.step_breakdown(e, timeline, rank=r))

    def rank_comparison(self, steps: StepRange = None) -> pd.DataFrame:
        """Per step and rank: step_us, kernel_us, gpu_idle_us, vs_median_us, slowest."""
        per_rank = {r: steps_module.step_breakdown(self._events(r, steps)) for r in self.ranks}
        return steps_module.rank_comparison(per_rank)

    def not_analysed(self, rank: int | None = None, steps: StepRange = None) -> pd.DataFrame:
        """Events of categories stepscope does not know (a new device's, e.g. MTIA's `mtia_*`),
        read into the tables but in no analysis: per category, events and total_us."""
        return self._per_rank(rank, steps, lambda e, r: common.not_analysed(e))

    def summary(self, rank: int | None = None, steps: StepRange = None) -> dict[str, pd.DataFrame]:
        """The tables `stepscope profile` prints, by name."""
        return {
            "traces": self.traces(),
            "not_analysed": self.not_analysed(rank, steps),
            "temporal_breakdown": self.temporal_breakdown(rank, steps),
            "active_time": self.active_time(rank, steps),
            "idle_breakdown": self.idle_breakdown(rank, steps),
            "top_kernels": self.top_kernels(10, "time", rank, steps),
            "kernels_by_precision": self.kernel_stats("precision", rank, steps),
            "launch_latency": self.launch_latency(rank, steps).head(10),
            "memory_ops": self.memory_ops(rank, steps),
            "memory_steps": self.memory_steps(rank, steps),
            "allocating_ops": self.allocating_ops(10, rank, steps),
            "syncs": self.syncs(rank, steps),
            "cpu_ops": self.cpu_ops(10, rank, steps),
            "steps": self.step_breakdown(rank, steps),
            "ranks": self.rank_comparison(steps),
        }

    def step_timeline(self) -> pd.DataFrame:
        """The hooks' step/phase timeline of the job (empty when there is none)."""
        if self._timeline is None:
            try:
                from ..profiler.step_reader import StepTimelineReader

                self._timeline = StepTimelineReader(self.store).step_timeline()
            except Exception:  # a folder with traces only
                self._timeline = pd.DataFrame()
        return self._timeline

    # --- plumbing -----------------------------------------------------------------------

    def _load(self, key: str) -> tuple[TraceInfo, pd.DataFrame]:
        loaded = self._loaded.get(key)
        if loaded is None:
            progress = (lambda done, total: self.progress(key, done, total)) if self.progress else None  # type: ignore[misc]
            if self._tables is None:
                self._tables = sources.table_store(self.store) if self.persist else self.store
            if self._default_ranks is None:
                self._default_ranks = sources.worker_ranks(self.trace_keys())
            loaded = self._loaded[key] = load_trace(
                self.store, key, persist=self.persist, progress=progress, writer=self._writer, tables=self._tables, default_rank=self._default_ranks.get(key, 0)
            )
            unknown = common.not_analysed(loaded[1])
            if not unknown.empty:  # a device or record type the schema does not know: say so
                listed = ", ".join(f"{row.events:,} events of category {row.category}" for row in unknown.itertuples())
                logger.warning("%s: %s not analysed (categories stepscope does not know; see docs/traces.md)", self.store.describe(key), listed)
        return loaded

    def _readable(self) -> Iterator[tuple[TraceInfo, pd.DataFrame]]:
        """Each trace that can be read; one that cannot is logged once and listed in
        `problems` (a StepscopeError names its file; anything else is a reader's bug on
        hostile input, named all the same rather than failing every analysis)."""
        for key in self.trace_keys():
            if key in self.problems:
                continue
            try:
                yield self._load(key)
            except (StepscopeError, OSError, ValueError, MemoryError, RecursionError, pa.ArrowException) as exc:
                where = self.store.describe(key)
                message = str(exc) if where in str(exc) else f"{where}: {exc}"
                self.problems[key] = message
                logger.warning("skipping trace %s", message)

    def _ranks(self, rank: int | None) -> list[int]:
        ranks = self.ranks
        if rank is None:
            return ranks
        if rank not in ranks:
            from ..exceptions import ConfigError

            raise ConfigError(f"rank {rank!r} has no trace in {self.store.url}; ranks with traces: {ranks}")
        return [rank]

    def _events(self, rank: int, steps: StepRange) -> pd.DataFrame:
        frames = [frame for info, frame in self._readable() if info.rank == rank]
        if not frames:
            return pd.DataFrame()
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True).sort_values("kind", kind="stable", ignore_index=True)
        if steps is not None:
            first, last = (steps.start, steps.stop - 1) if isinstance(steps, range) else steps
            step = frame["step"].to_numpy()
            frame = frame[(step >= first) & (step <= last)]
        return frame

    def _per_rank(self, rank: int | None, steps: StepRange, analysis: Callable[[pd.DataFrame, int], pd.DataFrame]) -> pd.DataFrame:
        ranks = self._ranks(rank)
        if rank is not None:
            return analysis(self._events(rank, steps), rank)
        frames = []
        for r in ranks:
            out = analysis(self._events(r, steps), r)
            out.insert(0, "rank", r)
            frames.append(out)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """`A:B` (both included), `A:`, `:B` or `A` -> (first, last) with open ends filled in;
    None for no range. The one reading of `--steps` (stepscope.cli_common.parse_steps)."""
    parsed = _parse_step_text(text)
    if parsed is None:
        return None
    first, last = parsed
    return (0 if first is None else first, _LAST_STEP if last is None else last)


_LAST_STEP = 2**31 - 1  # an open end: no step of a job is numbered higher


steps_module = steps
__all__ = ["TraceAnalysis", "parse_steps", "StepRange"]
