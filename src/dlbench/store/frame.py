"""The store as a pandas table: `dlbench.load` and the parquet output of `dlbench results`.

One row per run: the columns of `dlbench results` (store/rows.py) then the run's key fields
(store/index.py KEY_COLUMNS), typed: times as UTC timestamps, counts as nullable integers,
measurements as floats (NaN where absent), text as pandas strings. With iterations=True, one row
per measured iteration of every repeat instead, with the run's identifying columns beside it
(repeat_status there is categorical: a few values over millions of rows).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import get_args

import numpy as np
import pandas as pd

from ..axes import OTHER_AXES
from .index import KEY_COLUMNS, Iterations, read_rows
from .rows import COLUMNS
from .record import RepeatStatus
from .store import Store

_TIMES = {"started_at", "ended_at"}
_INTEGERS = {"batch_size", "threads", "repeats", "iterations", "params", "params_described", "flops_per_sample",
             "model_flops_per_iter", "repeats_requested"}
_FLOATS = {"ms_per_iter", "samples_per_s", "tokens_per_s", "model_tflops", "mfu", "iqr_ms", "cv", "first_iter_ms", "compile_ms", "alloc_peak_mb", "avg_power_w", "joules_per_sample",
           "mean_sm_clock_mhz", "throttled_pct", "peak_mem_mb", "learning_rate", "momentum",
           "latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "server_qps"}
_TEXT = {"run_id", "suite", "benchmark", "network", "mode", "framework", "framework_version", "device", "precision",
         "compile", "status", "machine", "equivalence", "reason", "mfu_reason", "profile", "machine_id", "cpu_model", "gpu_model", "os",
         "dlbench_version", "dlbench_commit", "network_hash", "env_backend", "scenario", "loadgen_result",
         "loadgen_reason", *(a.field for a in OTHER_AXES)}

# Beside every iteration: what a plot or a model of iteration times groups by.
ITERATION_KEYS = ("started_at", "suite", "benchmark", "network", "mode", "framework", "framework_version", "device",
                  "batch_size", "precision", "compile", *(a.field for a in OTHER_AXES), "threads", "profile", "machine", "machine_id", "status")


class UnreadableRecordWarning(UserWarning):
    """Some records in the store could not be read; they are listed in DataFrame.attrs["unreadable"]."""


def _declared(name: str) -> str | None:
    if name in _INTEGERS:
        return "Int64"
    if name in _FLOATS:
        return "float64"
    if name in _TEXT:
        return "string"
    return None


def _inferred(values: list) -> str | None:
    """The dtype of a column this module does not know yet (e.g. one just added to rows.COLUMNS)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, bool) for v in present):
        return "boolean"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "Int64"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return "float64"
    if all(isinstance(v, str) for v in present):
        return "string"
    return None


def _column(name: str, values: list) -> pd.Series:
    if name in _TIMES:
        return pd.Series(pd.to_datetime(values, utc=True, format="ISO8601"), dtype="datetime64[ns, UTC]")
    dtype = _declared(name) or _inferred(values)
    if dtype is not None:
        try:
            return pd.Series(values, dtype=dtype)
        except (TypeError, ValueError):  # a value of another type: keep the column, untyped
            pass
    return pd.Series(values, dtype=object)


def runs_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows (as the index gives them) as a typed DataFrame, one row per run."""
    names = list(dict.fromkeys([*COLUMNS, *KEY_COLUMNS, *(k for row in rows for k in row)]))
    return pd.DataFrame({n: _column(n, [row.get(n) for row in rows]) for n in names})


def iterations_frame(runs: pd.DataFrame, iterations: dict[str, Iterations]) -> pd.DataFrame:
    """One row per measured iteration: run_id, repeat, repeat_status, iteration, seconds, then ITERATION_KEYS.

    repeat_status is categorical (one of a handful of values over millions of rows)."""
    statuses = list(get_args(RepeatStatus))  # STATUSES and `contended` (a replaced repeat)
    positions, repeat_index, status_codes, iteration, seconds = [], [], [], [], []
    for pos, run_id in enumerate(runs["run_id"]):
        it = iterations[run_id]
        counts = np.array([n for _, _, n in it.repeats], dtype=np.int64)
        starts = np.cumsum(counts) - counts
        positions.append(np.full(int(counts.sum()), pos, dtype=np.int64))
        repeat_index.append(np.repeat(np.array([i for i, _, _ in it.repeats], dtype=np.int64), counts))
        status_codes.append(np.repeat(np.array([statuses.index(s) if s in statuses else -1 for _, s, _ in it.repeats],
                                               dtype=np.int8), counts))
        iteration.append(np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts))
        seconds.append(it.seconds)

    def joined(parts, dtype):
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.array([], dtype=dtype)

    at = joined(positions, np.int64)
    keys = runs[["run_id", *ITERATION_KEYS]].iloc[at].reset_index(drop=True)
    frame = pd.DataFrame({
        "run_id": keys.pop("run_id"),
        "repeat": joined(repeat_index, np.int64),
        "repeat_status": pd.Categorical.from_codes(joined(status_codes, np.int8), categories=statuses),
        "iteration": joined(iteration, np.int64),
        "seconds": joined(seconds, np.float64),
    })
    return pd.concat([frame, keys], axis=1)


def load(store: str | os.PathLike | Store, iterations: bool = False) -> pd.DataFrame:
    """The runs of a results store as a DataFrame (see this module's docstring).

    Unreadable records are skipped with one UnreadableRecordWarning and listed, path and reason, in
    the frame's attrs["unreadable"]. A large store is read through its row index (STORE/.index/).
    """
    st = store if isinstance(store, Store) else Store(Path(store))
    if not st.root.is_dir():
        raise FileNotFoundError(f"{st.root}: no such results store")
    snap = read_rows(st, iterations)
    runs = runs_frame(snap.rows)
    frame = iterations_frame(runs, snap.iterations) if iterations else runs
    frame.attrs["store"] = str(st.root)
    frame.attrs["unreadable"] = [{"path": str(u.path), "reason": u.reason} for u in snap.unreadable]
    frame.attrs["index_notes"] = list(snap.notes)
    if snap.unreadable:
        listed = "; ".join(u.reason for u in snap.unreadable[:3])
        more = f"; and {len(snap.unreadable) - 3} more" if len(snap.unreadable) > 3 else ""
        warnings.warn(f"{len(snap.unreadable)} unreadable records skipped (see .attrs['unreadable']): {listed}{more}",
                      UnreadableRecordWarning, stacklevel=2)
    for note in snap.notes:
        warnings.warn(note, RuntimeWarning, stacklevel=2)
    return frame
