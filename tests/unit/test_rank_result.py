"""A rank's files in a distributed job's folder (execution/rank_result.py): validated against a
schema, or one ResultError naming the field, never a traceback out of the watcher (issue 18)."""

from __future__ import annotations

import json

import pytest

from dlbench.execution.rank_result import parse_rank_result, parse_rank_started
from dlbench.execution.worker_result import ResultError

TRAIN = {"action": "data_parallel"}
COMM = {"action": "collectives", "collectives": ["all_reduce"], "sizes": [1024, 4096]}


def good_training(rank=0, world=2, **changes):
    result = {"protocol": 1, "status": "ok", "rank": rank, "world_size": world, "local_rank": rank, "host": "h",
              "framework": {"name": "fake", "version": "1"}, "threads": {"requested": 1, "effective": 1},
              "process_group": {"backend": "fake-tcp"}, "params": 10, "output_shape": [2, 4], "settings": {},
              "grad_bytes": 40, "first_iter_s": 0.1, "warmup_iter_s": [0.01], "iter_s": [0.01, 0.02],
              "local_iter_s": None, "window_monotonic_ns": [5, 9], "finished_at": 1.7e9}
    result.update(changes)
    return result


def good_comm(**changes):
    rows = [{"size_bytes": 1024, "bytes": 1024, "send_count": 256, "recv_count": 256, "iter_s": [1e-5],
             "correct": True, "error": None},
            {"size_bytes": 4096, "skipped": "not offered"}]
    result = {"status": "ok", "rank": 1, "world_size": 2, "framework": {"name": "fake"},
              "collectives": {"all_reduce": rows}}
    result.update(changes)
    return result


def test_what_the_harness_writes_is_read_as_written():
    parsed = parse_rank_result(json.dumps(good_training()), 0, 2, TRAIN)
    assert parsed == good_training()
    rows = parse_rank_result(json.dumps(good_comm()), 1, 2, COMM)["collectives"]["all_reduce"]
    assert "skipped" not in rows[0] and rows[1] == {"size_bytes": 4096, "skipped": "not offered"}
    failed = {"status": "failed", "rank": 0, "world_size": 2, "reason": "boom", "framework": {"name": "fake"}}
    assert parse_rank_result(json.dumps(failed), 0, 2, TRAIN)["reason"] == "boom"
    assert parse_rank_started(json.dumps({"pid": 12, "host": "h", "started_at": 1.0}), 0)["pid"] == 12


@pytest.mark.parametrize("data, request_, field, words", [
    (b"\xff\xfe", TRAIN, "result", "not UTF-8"),
    ("{\"status\": ", TRAIN, "result", "not valid JSON"),
    ("[1, 2]", TRAIN, "result", "not a JSON object"),
    (json.dumps(good_training(iter_s=[0.01, -1.0])), TRAIN, "iter_s[1]", "greater than 0"),
    (json.dumps(good_training(iter_s=[])), TRAIN, "iter_s", "has none"),
    (json.dumps(good_training(first_iter_s="0.1")), TRAIN, "first_iter_s", "valid number"),
    (json.dumps(good_training(params=True)), TRAIN, "params", "valid integer"),
    (json.dumps(good_training(params=2**70)), TRAIN, "params", "less than or equal"),
    (json.dumps(good_training(rank=1)), TRAIN, "rank", "file of rank 0"),
    (json.dumps(good_training(world_size=3)), TRAIN, "world_size", "file of world_size 2"),
    (json.dumps(good_training(window_monotonic_ns=[9, 5])), TRAIN, "window_monotonic_ns", "end after"),
    (json.dumps(good_training(settings={"x": 2**64})), TRAIN, "settings.x", "int64"),
    (json.dumps(good_training(status="done")), TRAIN, "status", "'ok', 'failed' or 'skipped'"),
    (json.dumps(good_training(surprise=1)), TRAIN, "surprise", "Extra inputs"),
    (json.dumps(good_training(framework=None)), TRAIN, "framework", "names its framework"),
    (json.dumps(good_comm(rank=1, collectives=None)), COMM, "collectives", "has none"),
    (json.dumps(good_comm(collectives={"broadcast": []})), COMM, "collectives", "no rows for 'all_reduce'"),
    (json.dumps(good_comm(collectives={"all_reduce": [{"size_bytes": 1024, "bytes": 1024, "iter_s": [1e-5],
                                                       "correct": True}]})), COMM, "collectives.all_reduce", "sizes"),
    (json.dumps(good_comm(collectives={"all_reduce": [{"size_bytes": 1024, "iter_s": [1e-5], "correct": True},
                                                      {"size_bytes": 4096, "skipped": "no"}]})),
     COMM, "collectives.all_reduce[0]", "needs bytes"),
], ids=["not-utf8", "truncated", "list", "negative-time", "no-iterations", "string-time", "bool-params",
        "huge-params", "wrong-rank", "wrong-world", "backward-window", "unstorable-setting", "unknown-status",
        "unknown-field", "no-framework", "no-collectives", "missing-collective", "missing-size", "row-unmeasured"])
def test_a_malformed_rank_result_is_one_error_naming_the_field(data, request_, field, words):
    rank = 1 if request_ is COMM else 0
    with pytest.raises(ResultError) as caught:
        parse_rank_result(data, rank, 2, request_)
    assert caught.value.field == field, str(caught.value)
    assert words in str(caught.value) and f"rank {rank} result" in str(caught.value)


@pytest.mark.parametrize("started, field", [
    ({"pid": "12", "host": "h"}, "pid"), ({"pid": 0, "host": "h"}, "pid"), ({"host": "h"}, "pid"),
    ({"pid": 12, "host": 3}, "host"), ({"pid": 12, "host": "h", "started_at": "now"}, "started_at"),
])
def test_a_malformed_announcement_is_one_error_naming_the_field(started, field):
    with pytest.raises(ResultError) as caught:
        parse_rank_started(json.dumps(started), 3)
    assert caught.value.field == field and "rank 3 announcement" in str(caught.value)
