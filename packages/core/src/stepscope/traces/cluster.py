"""Cross-rank questions over the per-rank summaries, answered by DuckDB (embedded): rank
comparison, straggler detection, and any SQL a user writes (`stepscope sql`). The
summaries are built first where missing (stepscope.traces.fanout: one task per trace);
after that nothing here touches an event, so memory is O(summary size) whatever the
number of ranks. Views and their columns: docs/traces.md ("Querying a job with SQL")."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa

from ..closing import ClosedOnExit
from ..exceptions import ConfigError
from ..store import Store
from . import fanout, sources, summaries
from .tables import TABLE_DIR, list_trace_keys, loose_trace_keys, table_key

logger = logging.getLogger("stepscope.traces")

PHASE_NAMES = ("data", "forward", "backward", "optimizer")
# What a slow step's extra time is attributed to: the summary's GPU-side parts, and the
# step timeline's phases where the job has one.
PARTS = {
    "compute kernels": "compute_ns",
    "communication kernels": "comm_ns",
    "memcpy/memset": "memory_ns",
    "host syncs": "sync_ns",
    "GPU waiting for the host": "host_wait_ns",
}


def _require_duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise ConfigError("cross-rank queries need DuckDB, which is not installed: pip install 'stepscope[traces]'") from None
    return duckdb


@dataclass(frozen=True)
class StragglerParams:
    """A rank's step is slow when its time exceeds the step's median over ranks by more
    than `z` robust standard deviations (1.4826 x the median absolute deviation) and by
    more than `min_excess` of the median; judged only with `min_ranks` ranks or more."""

    z: float = 3.5
    min_excess: float = 0.05
    min_ranks: int = 4

    def __post_init__(self) -> None:
        for name in ("z", "min_excess"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"StragglerParams.{name} must be a number >= 0, got {value!r}")
        if isinstance(self.min_ranks, bool) or not isinstance(self.min_ranks, int) or self.min_ranks < 3:
            raise ConfigError(f"StragglerParams.min_ranks must be an integer >= 3, got {self.min_ranks!r}")


class JobQuery(ClosedOnExit):
    """A job's summaries (built where missing) in an embedded DuckDB. `path`: a job, a
    folder of traces or one trace, local or s3://; `engine`/`workers`: how missing
    summaries are built (fanout.build); `keys`: the traces, when the caller has listed
    them already (default: the job's listing)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | Store,
        *,
        engine: str = "local",
        workers: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        threads: int | None = None,
        keys: list[str] | None = None,
    ):
        duckdb = _require_duckdb()
        if isinstance(path, Store):
            self.store = path
        else:
            self.store, located = sources.locate(path)
            keys = keys if keys is not None else located
        self._trace_keys = sorted(keys) if keys is not None else (list_trace_keys(self.store) or loose_trace_keys(self.store))
        self.manifest, self.tables_store, self.build = fanout.build(self.store, self._trace_keys, engine=engine, workers=workers, progress=progress)
        loaded = summaries.load_tables(self.tables_store, self.manifest, self._trace_keys)
        self.connection = duckdb.connect(":memory:", config={"threads": threads or fanout.cpu_count()})
        self._registered: set[str] = set()
        self._objects: dict[str, Any] = {}
        self._register("summary_steps", loaded["steps"])
        self._register("summary_kernels", loaded["kernels"])
        self.connection.execute(
            "CREATE VIEW windows AS SELECT rank, trace, count(*) FILTER (WHERE step >= 0) AS steps, min(step) FILTER (WHERE step >= 0) AS first_step, "
            "max(step) AS last_step, sum(step_ns)::BIGINT AS step_ns, sum(kernel_ns)::BIGINT AS kernel_ns, sum(gpu_busy_ns)::BIGINT AS gpu_busy_ns, "
            "sum(gpu_idle_ns)::BIGINT AS gpu_idle_ns, sum(memcpy_bytes)::BIGINT AS memcpy_bytes, sum(syncs)::BIGINT AS syncs FROM summary_steps GROUP BY rank, trace"
        )
        self._registered.add("windows")
        self._trial: Any = None

    @property
    def problems(self) -> dict[str, str]:
        return self.build.problems

    @property
    def ranks(self) -> list[int]:
        return [int(r) for r in self.connection.execute("SELECT DISTINCT rank FROM summary_steps ORDER BY rank").fetchnumpy()["rank"]]

    # --- SQL ----------------------------------------------------------------------------

    def sql(self, query: str) -> pd.DataFrame:
        """Run one SQL statement over the views (registering those it names) as a DataFrame."""
        self._views_for(query)
        relation = self.connection.sql(query)
        if relation is None:  # a statement without a result (CREATE VIEW ...)
            return pd.DataFrame()
        # sum() of BIGINT is HUGEINT in DuckDB, which pandas gets as float64: integers that
        # fit stay integers (nanoseconds and bytes past 2**53 would lose digits).
        huge = [name for name, kind in zip(relation.columns, relation.types) if str(kind) == "HUGEINT"]
        if huge:
            quoted = {name: '"' + name.replace('"', '""') + '"' for name in relation.columns}
            relation = relation.project(", ".join(f"{quoted[n]}::BIGINT AS {quoted[n]}" if n in huge else quoted[n] for n in relation.columns))
        return relation.df()

    def arrow(self, query: str) -> pa.Table:
        self._views_for(query)
        result = self.connection.execute(query).arrow()
        return result.read_all() if hasattr(result, "read_all") else result

    VIEWS = ("summary_steps", "summary_kernels", "windows", "phases", "steps", "system_metrics", "tensors", "events", "kernels")

    def _views_for(self, query: str) -> None:
        """Views whose data is costly to gather (the step timeline, system metrics, tensors,
        the raw event tables) are made when a query first names them."""
        for name in self.VIEWS:
            if name not in self._registered and re.search(rf"\b{name}\b", query, re.IGNORECASE):
                getattr(self, f"_view_{name}")()

    def _register(self, name: str, data: Any) -> None:
        self._objects[name] = data  # DuckDB scans it in place: keep it alive
        self.connection.register(name, data)
        self._registered.add(name)

    def _profiler(self) -> Any:
        from ..profiler.reader import ProfilerTrial

        return ProfilerTrial(self.store)

    def _view_steps(self) -> None:
        try:
            timeline = self._profiler().step_timeline()
        except Exception as exc:  # a folder of traces only: no timeline
            logger.debug("no step timeline: %s", exc)
            timeline = pd.DataFrame(columns=["node_id", "rank", "framework", "mode", "step", "phase", "name", "start_ns", "end_ns", "duration_ms", "args"])
        timeline = timeline.drop(columns=[c for c in ("args",) if c in timeline.columns]).astype({"mode": str, "phase": str, "name": str, "node_id": str, "framework": str})
        self._register("steps", timeline)

    def _view_phases(self) -> None:
        self._views_for("steps")
        self.connection.execute(
            "CREATE VIEW phases AS SELECT rank, mode, step, phase, sum(end_ns - start_ns) AS phase_ns FROM steps "
            f"WHERE phase IN ({', '.join(repr(p) for p in PHASE_NAMES)}) GROUP BY rank, mode, step, phase"
        )
        self._registered.add("phases")

    def _view_system_metrics(self) -> None:
        try:
            metrics = self._profiler().system_metrics()
        except Exception as exc:
            logger.debug("no system metrics: %s", exc)
            metrics = pd.DataFrame(columns=["timestamp", "node_id", "type", "name", "dimension", "value"])
        for column in ("node_id", "type", "name", "dimension"):
            if column in metrics.columns:
                metrics[column] = metrics[column].astype(str)
        self._register("system_metrics", metrics)

    def _view_tensors(self) -> None:
        self._register("tensors", tensor_reductions(self.store))

    def _view_events(self) -> None:
        """The raw event tables, scanned lazily by DuckDB: a local job's by a glob (DuckDB
        reads the files itself), a job elsewhere (S3) as a pyarrow dataset read through the
        Store (store_fs.py: ranged reads of what a query needs)."""
        tables = self.tables_store.local_path(TABLE_DIR)
        if tables is not None and self.tables_store.exists(TABLE_DIR):
            pattern = os.path.join(tables, "**", "*.parquet").replace("'", "''")
            self.connection.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet('{pattern}', union_by_name = true)")
            self._registered.add("events")
            return
        stored = set(self.tables_store.list(f"{TABLE_DIR}/")) if tables is None else set()
        keys = [table_key(key) for key in self._trace_keys if table_key(key) in stored]
        if keys:
            from .store_fs import parquet_dataset  # (pyarrow.dataset: imported when asked for)

            self._register("events_tables", parquet_dataset(self.tables_store, keys))
        else:
            from .schema import EVENT_SCHEMA

            self._register("events_tables", EVENT_SCHEMA.append(pa.field("rank", pa.int32())).empty_table())
        self.connection.execute("CREATE VIEW events AS SELECT * FROM events_tables")
        self._registered.add("events")

    def _view_kernels(self) -> None:
        self._views_for("events")
        self.connection.execute("CREATE VIEW kernels AS SELECT rank, step, name, stream, ts_ns, dur_ns, correlation FROM events WHERE kind = 0")
        self._registered.add("kernels")

    # --- the questions ------------------------------------------------------------------

    def rank_steps(self) -> pd.DataFrame:
        """Per profiled step and rank: step_us, kernel_us, compute/comm kernel µs, GPU
        idle µs, the gap to the step's median rank, and whether it was the slowest."""
        return self.sql(
            """
            WITH s AS (SELECT step, rank, sum(step_ns) AS step_ns, sum(kernel_ns) AS kernel_ns, sum(gpu_idle_ns) AS gpu_idle_ns
                       FROM summary_steps WHERE step >= 0 GROUP BY step, rank)
            SELECT step, rank, step_ns / 1e3 AS step_us, kernel_ns / 1e3 AS kernel_us, gpu_idle_ns / 1e3 AS gpu_idle_us,
                   (step_ns - median(step_ns) OVER (PARTITION BY step)) / 1e3 AS vs_median_us,
                   (step_ns = max(step_ns) OVER (PARTITION BY step) AND count(*) OVER (PARTITION BY step) > 1) AS slowest
            FROM s ORDER BY step, rank
            """
        )

    def rank_overview(self) -> pd.DataFrame:
        """Per rank over all its profiled steps: steps, mean step µs, mean kernel µs,
        GPU busy share, memcpy bytes, host syncs."""
        return self.sql(
            """
            SELECT rank, count(*) AS steps, avg(step_ns) / 1e3 AS mean_step_us, avg(kernel_ns) / 1e3 AS mean_kernel_us,
                   sum(gpu_busy_ns) / nullif(sum(step_ns), 0) AS gpu_busy_share, sum(memcpy_bytes)::BIGINT AS memcpy_bytes, sum(syncs)::BIGINT AS syncs
            FROM summary_steps WHERE step >= 0 GROUP BY rank ORDER BY rank
            """
        )

    def rank_comparison(self) -> pd.DataFrame:
        """Per rank over its profiled steps (the report's Distributed section and the app's
        Ranks view): steps, mean step, compute- and communication-kernel and GPU idle µs
        per step, and the mean step's gap to the median rank's in percent."""
        return self.sql(
            """
            WITH r AS (SELECT rank, count(DISTINCT step) AS steps, sum(step_ns) / count(DISTINCT step) / 1e3 AS mean_step_us,
                              sum(compute_kernel_ns) / count(DISTINCT step) / 1e3 AS compute_kernel_us,
                              sum(comm_kernel_ns) / count(DISTINCT step) / 1e3 AS comm_kernel_us,
                              sum(gpu_idle_ns) / count(DISTINCT step) / 1e3 AS gpu_idle_us
                       FROM summary_steps WHERE step >= 0 GROUP BY rank)
            SELECT *, 100 * (mean_step_us - median(mean_step_us) OVER ()) / nullif(median(mean_step_us) OVER (), 0) AS vs_median_pct
            FROM r ORDER BY rank
            """
        )

    def top_kernels(self, k: int = 10) -> pd.DataFrame:
        """The job's k kernels with the most time over every rank and step."""
        return self.sql(
            f"""
            SELECT name, class, sum(count)::BIGINT AS count, sum(total_ns) / 1e3 AS total_us, max(max_ns) / 1e3 AS max_us,
                   count(DISTINCT rank) AS ranks, sum(total_ns) / sum(sum(total_ns)) OVER () AS time_share
            FROM summary_kernels GROUP BY name, class ORDER BY total_us DESC LIMIT {int(k)}
            """
        )

    def stragglers(self, params: StragglerParams | None = None) -> pd.DataFrame:
        """One row per (step, rank) whose step time or compute-kernel time is an outlier
        among the step's ranks (StragglerParams), with what makes it slow: the part
        (compute kernels, communication, memcpy, host syncs, GPU waiting for the host, or
        a step-timeline phase) and the kernel class and kernel with the largest excess over
        the step's median rank."""
        p = params or StragglerParams()
        judged = self.sql(
            f"""
            WITH per AS (
                SELECT step, rank, sum(step_ns) AS step_ns, sum(compute_kernel_ns) AS compute_ns, sum(comm_kernel_ns) AS comm_ns,
                       sum(memcpy_ns + memset_ns) AS memory_ns, sum(sync_ns) AS sync_ns, sum(idle_host_wait_ns) AS host_wait_ns
                FROM summary_steps WHERE step >= 0 AND step_ns IS NOT NULL GROUP BY step, rank),
            med AS (
                SELECT step, count(*) AS ranks, median(step_ns) AS med_step, median(compute_ns) AS med_compute, median(comm_ns) AS med_comm,
                       median(memory_ns) AS med_memory, median(sync_ns) AS med_sync, median(host_wait_ns) AS med_host_wait
                FROM per GROUP BY step),
            mad AS (
                SELECT per.step, median(abs(step_ns - med_step)) AS mad_step, median(abs(compute_ns - med_compute)) AS mad_compute
                FROM per JOIN med USING (step) GROUP BY per.step)
            SELECT per.*, med.*, mad.mad_step, mad.mad_compute,
                   step_ns - med_step AS step_excess, compute_ns - med_compute AS compute_excess,
                   (step_ns - med_step) > greatest({p.z} * 1.4826 * mad_step, {p.min_excess} * med_step) AS slow_step,
                   (compute_ns - med_compute) > greatest({p.z} * 1.4826 * mad_compute, {p.min_excess} * med_compute) AND med_compute > 0 AS slow_kernels
            FROM per JOIN med USING (step) JOIN mad USING (step)
            WHERE ranks >= {int(p.min_ranks)}
            """
        )
        columns = ["step", "rank", "by", "step_us", "median_step_us", "excess_us", "excess_pct", "compute_kernel_us", "median_compute_kernel_us",
                   "slowest_part", "part_excess_us", "kernel_class", "class_excess_us", "kernel", "kernel_excess_us", "ranks"]
        slow = judged[judged["slow_step"].fillna(False).astype(bool) | judged["slow_kernels"].fillna(False).astype(bool)]
        if slow.empty:
            return pd.DataFrame(columns=columns)
        parts = self._part_excess(judged, slow)
        classes = self._kernel_excess(slow, "class")
        names = self._kernel_excess(slow, "name")
        rows = []
        for row in slow.itertuples(index=False):
            key = (int(row.step), int(row.rank))
            part, part_excess = parts.get(key, ("", 0.0))
            kclass, class_excess = classes.get(key, ("", 0.0))
            kname, name_excess = names.get(key, ("", 0.0))
            by = " and ".join(label for label, flag in (("step time", row.slow_step), ("kernel time", row.slow_kernels)) if bool(flag))
            rows.append({
                "step": key[0], "rank": key[1], "by": by, "step_us": row.step_ns / 1e3, "median_step_us": row.med_step / 1e3,
                "excess_us": row.step_excess / 1e3, "excess_pct": 100.0 * row.step_excess / row.med_step if row.med_step else float("nan"),
                "compute_kernel_us": row.compute_ns / 1e3, "median_compute_kernel_us": row.med_compute / 1e3,
                "slowest_part": part, "part_excess_us": part_excess / 1e3, "kernel_class": kclass, "class_excess_us": class_excess / 1e3,
                "kernel": kname, "kernel_excess_us": name_excess / 1e3, "ranks": int(row.ranks),
            })
        return pd.DataFrame(rows, columns=columns).sort_values(["step", "excess_us"], ascending=[True, False], ignore_index=True)

    def _part_excess(self, judged: pd.DataFrame, slow: pd.DataFrame) -> dict[tuple[int, int], tuple[str, float]]:
        """The part that makes each slow (step, rank) slow: of the parts above their step's
        median, the most unusual one (the largest excess in robust standard deviations of
        that part across the step's ranks), so that a part that varies a lot from rank to
        rank anyway (memcpy of varying batches) does not hide the one that is off."""
        frame = judged[["step", "rank", *PARTS.values()]].melt(id_vars=["step", "rank"], var_name="part", value_name="ns")
        frame["part"] = frame["part"].map({column: label for label, column in PARTS.items()})
        phases = self.connection.execute(
            f"SELECT step, rank, phase || ' phase' AS part, sum(phase_ns) AS ns FROM phases WHERE mode = 'TRAIN' AND step IN ({_steps(slow)}) GROUP BY ALL"
        ).df() if self._has_phases() else pd.DataFrame(columns=["step", "rank", "part", "ns"])
        return _most_unusual(pd.concat([frame, phases], ignore_index=True), slow)

    def _has_phases(self) -> bool:
        self._views_for("phases")
        return bool(self.connection.execute("SELECT count(*) FROM phases").fetchall()[0][0])

    def _kernel_excess(self, slow: pd.DataFrame, by: str) -> dict[tuple[int, int], tuple[str, float]]:
        """The kernel class (or kernel name) that makes each slow (step, rank) slow, chosen as
        in _part_excess (ranks without that kernel count as 0); computed in DuckDB, which
        returns one row per slow (step, rank): ranks x kernels never reach pandas."""
        column = '"class"' if by == "class" else "name"
        steps = _steps(slow)
        pairs = pd.DataFrame({"step": slow["step"].astype("int64").to_numpy(), "rank": slow["rank"].astype("int64").to_numpy()})
        self.connection.register("slow_pairs", pairs)
        try:
            frame = self.connection.execute(
                f"""
                WITH r AS (SELECT DISTINCT step, rank FROM summary_steps WHERE step IN ({steps})),
                     g AS (SELECT step, rank, {column} AS part, sum(total_ns) AS ns FROM summary_kernels WHERE step IN ({steps}) GROUP BY step, rank, {column}),
                     grid AS (SELECT r.step, r.rank, l.part, coalesce(g.ns, 0) AS ns
                              FROM r JOIN (SELECT DISTINCT step, part FROM g) l USING (step) LEFT JOIN g USING (step, rank, part)),
                     m AS (SELECT step, part, median(ns) AS med FROM grid GROUP BY step, part),
                     d AS (SELECT grid.step, grid.part, median(abs(ns - med)) AS mad FROM grid JOIN m USING (step, part) GROUP BY grid.step, grid.part)
                SELECT grid.step, grid.rank, grid.part, ns - med AS excess
                FROM grid JOIN m USING (step, part) JOIN d USING (step, part) JOIN slow_pairs USING (step, rank)
                WHERE ns > med
                QUALIFY row_number() OVER (PARTITION BY grid.step, grid.rank ORDER BY (ns - med) / greatest(1.4826 * mad, {_MIN_SPREAD_NS}) DESC, grid.part) = 1
                """
            ).df()
        finally:
            self.connection.unregister("slow_pairs")
        return {(int(row.step), int(row.rank)): (str(row.part), float(row.excess)) for row in frame.itertuples(index=False)}

    def straggler_ranks(self, params: StragglerParams | None = None) -> pd.DataFrame:
        """Per straggling rank: how many of its steps were slow, the median excess, and the
        part / kernel class most often to blame."""
        slow = self.stragglers(params)
        columns = ["rank", "slow_steps", "steps", "first_step", "last_step", "median_excess_us", "median_excess_pct", "slowest_part", "kernel_class", "kernel"]
        if slow.empty:
            return pd.DataFrame(columns=columns)
        judged = self.sql("SELECT rank, count(DISTINCT step) AS steps FROM summary_steps WHERE step >= 0 GROUP BY rank")
        totals = dict(zip(judged["rank"].astype(int), judged["steps"].astype(int)))
        rows = []
        for rank, group in slow.groupby("rank"):
            rows.append({
                "rank": int(rank), "slow_steps": len(group), "steps": totals.get(int(rank), len(group)),
                "first_step": int(group["step"].min()), "last_step": int(group["step"].max()),
                "median_excess_us": float(group["excess_us"].median()), "median_excess_pct": float(group["excess_pct"].median()),
                "slowest_part": _mode(group["slowest_part"]), "kernel_class": _mode(group["kernel_class"]), "kernel": _mode(group["kernel"]),
            })
        return pd.DataFrame(rows, columns=columns).sort_values(["slow_steps", "median_excess_us"], ascending=False, ignore_index=True)

    def close(self) -> None:
        self.connection.close()



# Spreads below a microsecond are no spread: a part that is equal on every rank (the same
# work) and one nanosecond off is not what makes a step slow.
_MIN_SPREAD_NS = 1000.0


def _steps(slow: pd.DataFrame) -> str:
    return ", ".join(str(int(s)) for s in sorted(set(slow["step"])))


def _most_unusual(frame: pd.DataFrame, slow: pd.DataFrame) -> dict[tuple[int, int], tuple[str, float]]:
    """For each slow (step, rank): the part (column `part`, time `ns`, one row per step,
    rank and part) above its step's median by the most robust standard deviations, with
    its excess in ns."""
    if frame.empty:
        return {}
    frame = frame.astype({"ns": "float64"})
    grouped = frame.groupby(["step", "part"])["ns"]
    frame["excess"] = frame["ns"] - grouped.transform("median")
    frame["spread"] = (frame["excess"].abs().groupby([frame["step"], frame["part"]]).transform("median") * 1.4826).clip(lower=_MIN_SPREAD_NS)
    frame["score"] = frame["excess"] / frame["spread"]
    wanted = pd.MultiIndex.from_arrays([slow["step"].astype(int), slow["rank"].astype(int)])
    frame = frame[(frame["excess"] > 0) & pd.MultiIndex.from_arrays([frame["step"].astype(int), frame["rank"].astype(int)]).isin(wanted)]
    best = frame.sort_values("score", ascending=False, kind="stable").drop_duplicates(["step", "rank"])
    return {(int(row.step), int(row.rank)): (str(row.part), float(row.excess)) for row in best.itertuples(index=False)}


def _mode(values: pd.Series) -> str:
    values = values[values.astype(str) != ""]
    return str(values.mode().iloc[0]) if len(values) else ""


def tensor_reductions(store: Store) -> pd.DataFrame:
    """The job's saved reductions (and scalars) per step and worker: tensor, reduction,
    abs, mode, mode_step, step (global), worker, value. Empty for a folder of traces."""
    from ..reductions import parse_reduction_tensor_name

    columns = ["tensor", "reduction", "abs", "mode", "mode_step", "step", "worker", "value"]
    try:
        from ..trial import Trial

        trial = Trial(store)
        names = trial.tensor_names()
    except Exception as exc:  # not a tensor job
        logger.debug("no tensors: %s", exc)
        return pd.DataFrame(columns=columns)
    requests, meta = [], []
    for name in names:
        parsed = parse_reduction_tensor_name(name)
        tensor = trial.tensor(name)
        for step in tensor.steps():
            for worker in tensor.workers(step):
                requests.append((name, step, None, worker))
                meta.append((name, parsed, step, worker))
    values = trial.read_many(requests) if requests else []
    rows = []
    for (name, parsed, step, worker), value in zip(meta, values):
        if value is None or getattr(value, "size", 0) != 1:
            continue  # a full tensor: its reductions are what SQL gets
        mode, mode_step = trial.mode_of(step)
        tensor_name, reduction, is_abs = parsed if parsed else (name, "value", False)
        rows.append((tensor_name, reduction, is_abs, str(getattr(mode, "name", mode)), int(mode_step), int(step), worker, float(value.reshape(-1)[0])))
    return pd.DataFrame(rows, columns=columns)
