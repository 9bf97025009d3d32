"""A strict reader of MLPerf-format logs (`:::MLLOG {json}` lines), for the convergence suite's
tests: every line parses, has every field of the format, time never goes back, the keys MLPerf
Training's common rules require (ruleset 6.0.0's compliance checker: training_6.0.0/common.yaml)
are there as often as they must be, and the start/stop pairs come in order. Written for dlbench's
tests from the rules, not from the checker's code."""

from __future__ import annotations

import json
from pathlib import Path

PREFIX = ":::MLLOG "
EVENT_TYPES = {"INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"}
EXACTLY_ONE = ("submission_benchmark", "submission_division", "submission_org", "submission_platform",
               "init_stop", "run_start", "run_stop", "seed", "global_batch_size", "train_samples", "eval_samples",
               "opt_name", "opt_base_learning_rate", "opt_weight_decay", "opt_learning_rate_warmup_epochs")
AT_LEAST_ONE = ("cache_clear", "init_start", "epoch_start", "epoch_stop", "eval_start", "eval_stop", "eval_accuracy")
STARTS = {"init_start": "init_stop", "run_start": "run_stop", "epoch_start": "epoch_stop", "eval_start": "eval_stop"}


class MLLogError(AssertionError):
    pass


def read(path: Path) -> list[dict]:
    """Every event of the file, checked line by line and as a whole; MLLogError naming the line."""
    events = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith(PREFIX):
            raise MLLogError(f"{path}:{n}: not an MLLOG line: {line[:60]!r}")

        def no_constant(name):
            raise MLLogError(f"{path}:{n}: {name} is not JSON")

        try:
            event = json.loads(line[len(PREFIX):], parse_constant=no_constant)
        except json.JSONDecodeError as e:
            raise MLLogError(f"{path}:{n}: {e}") from None
        missing = {"namespace", "time_ms", "event_type", "key", "value", "metadata"} - set(event)
        if missing:
            raise MLLogError(f"{path}:{n}: missing {sorted(missing)}")
        if not isinstance(event["time_ms"], int) or isinstance(event["time_ms"], bool):
            raise MLLogError(f"{path}:{n}: time_ms {event['time_ms']!r} is not an integer")
        if event["event_type"] not in EVENT_TYPES:
            raise MLLogError(f"{path}:{n}: event_type {event['event_type']!r}")
        meta = event["metadata"]
        if not isinstance(meta, dict) or not isinstance(meta.get("file"), str) or not isinstance(meta.get("lineno"), int):
            raise MLLogError(f"{path}:{n}: metadata needs file (str) and lineno (int): {meta!r}")
        if events and event["time_ms"] < events[-1]["time_ms"]:
            raise MLLogError(f"{path}:{n}: time goes back ({event['time_ms']} after {events[-1]['time_ms']})")
        want = "INTERVAL_START" if event["key"] in STARTS else "INTERVAL_END" if event["key"] in STARTS.values() else None
        if want and event["event_type"] != want:
            raise MLLogError(f"{path}:{n}: {event['key']} is an {event['event_type']}, not an {want}")
        event["line"] = n
        events.append(event)
    check(events, str(path))
    return events


def check(events: list[dict], where: str) -> None:
    counts: dict[str, int] = {}
    for e in events:
        counts[e["key"]] = counts.get(e["key"], 0) + 1
    for key in EXACTLY_ONE:
        if counts.get(key, 0) != 1:
            raise MLLogError(f"{where}: {key} appears {counts.get(key, 0)} times, not exactly once")
    for key in AT_LEAST_ONE:
        if not counts.get(key):
            raise MLLogError(f"{where}: no {key}")
    open_: dict[str, dict] = {}
    phase = "before"  # before init -> init -> initialised -> run -> stopped
    for e in events:
        key, meta, at = e["key"], e["metadata"], f"{where}:{e['line']}"
        if key == "init_start":
            if phase not in ("before", "init"):
                raise MLLogError(f"{at}: init_start after initialisation ended")
            phase = "init"
        elif key == "init_stop":
            if phase != "init":
                raise MLLogError(f"{at}: init_stop without init_start")
            phase = "initialised"
        elif key == "run_start":
            if phase != "initialised":
                raise MLLogError(f"{at}: run_start before init_stop")
            phase = "run"
        elif key == "run_stop":
            if phase != "run":
                raise MLLogError(f"{at}: run_stop without run_start")
            if meta.get("status") not in ("success", "aborted"):
                raise MLLogError(f"{at}: run_stop's status {meta.get('status')!r}")
            if open_:
                raise MLLogError(f"{at}: run_stop inside {sorted(open_)}")
            phase = "stopped"
        elif key in ("epoch_start", "eval_start"):
            if phase != "run":
                raise MLLogError(f"{at}: {key} outside the run")
            if not isinstance(meta.get("epoch_num"), int):
                raise MLLogError(f"{at}: {key} without an integer epoch_num")
            if open_:
                raise MLLogError(f"{at}: {key} inside {sorted(open_)}")
            open_[key] = e
        elif key in ("epoch_stop", "eval_stop"):
            start = key.replace("_stop", "_start")
            begun = open_.pop(start, None)
            if begun is None:
                raise MLLogError(f"{at}: {key} without {start}")
            if begun["metadata"]["epoch_num"] != meta.get("epoch_num"):
                raise MLLogError(f"{at}: {key} of epoch {meta.get('epoch_num')} closes epoch "
                                 f"{begun['metadata']['epoch_num']}")
        elif key == "eval_accuracy":
            if "eval_start" not in open_ or open_["eval_start"]["metadata"]["epoch_num"] != meta.get("epoch_num"):
                raise MLLogError(f"{at}: eval_accuracy outside the eval_start/eval_stop of its epoch_num")
            if not isinstance(e["value"], (int, float)) or not 0 <= e["value"] <= 1:
                raise MLLogError(f"{at}: eval_accuracy {e['value']!r} is not a fraction")
        elif key in ("train_samples", "eval_samples") and phase != "run":
            raise MLLogError(f"{at}: {key} logged outside the run (the data is read inside the clock)")
    if phase != "stopped":
        raise MLLogError(f"{where}: the log ends without run_stop")


def accuracies(events: list[dict]) -> list[tuple[int, float]]:
    return [(e["metadata"]["epoch_num"], e["value"]) for e in events if e["key"] == "eval_accuracy"]
