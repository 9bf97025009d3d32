"""MLPerf-format logs (MLLOG), written by the convergence loop (convergence.py). Standard library only.

One event per line: `:::MLLOG {json}` with `namespace`, `time_ms` (milliseconds since the epoch),
`event_type` (INTERVAL_START, INTERVAL_END or POINT_IN_TIME), `key`, `value` and `metadata` (at
least `file` and `lineno` of the line that logged it). The keys are those of MLPerf Training's
rules (training_policies, the logging repository's compliance checker for ruleset 6.0.0): the
submission fields, `cache_clear`, `init_start`/`init_stop`, `run_start`/`run_stop` (with
`status`), `epoch_start`/`epoch_stop`, `eval_start`/`eval_stop`, `eval_accuracy` (with
`epoch_num`), `seed`, `global_batch_size`, `train_samples`, `eval_samples` and the optimiser's
hyper-parameters. Each line is flushed as it is written: a run that dies leaves its log so far.
"""

from __future__ import annotations

import json
import os
import sys
import time

PREFIX = ":::MLLOG "
START, END, POINT = "INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"


class MLLogger:
    def __init__(self, path: str, clock=time.time):
        self.path = path
        self._clock = clock
        self._file = open(path, "a", encoding="utf-8")

    def _write(self, event_type: str, key: str, value, metadata: dict | None) -> None:
        caller = sys._getframe(2)  # the line that called start/end/event
        meta = {"file": os.path.basename(caller.f_code.co_filename), "lineno": caller.f_lineno, **(metadata or {})}
        line = {"namespace": "", "time_ms": int(round(self._clock() * 1000)), "event_type": event_type,
                "key": key, "value": value, "metadata": meta}
        self._file.write(PREFIX + json.dumps(line, allow_nan=False) + "\n")
        self._file.flush()

    def start(self, key: str, value=None, metadata: dict | None = None) -> None:
        self._write(START, key, value, metadata)

    def end(self, key: str, value=None, metadata: dict | None = None) -> None:
        self._write(END, key, value, metadata)

    def event(self, key: str, value=None, metadata: dict | None = None) -> None:
        self._write(POINT, key, value, metadata)

    def close(self) -> None:
        self._file.close()
