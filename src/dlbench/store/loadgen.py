"""LoadGen's logs in the store, and LoadGen's results read from them (record schema 9).

A LoadGen run's worker leaves, per LoadGen test, a folder with LoadGen's `mlperf_log_summary.txt`
(for people) and `mlperf_log_detail.txt` (one `:::MLLOG {json}` line per key: the settings LoadGen
was given and took, its result). The record's figures are read here from the detail logs
themselves, not from anything the worker says about them; the logs are kept in the store beside
the record, STORE/loadgen/<run_id>/<test>/<file>, written like every store file (staged, linked,
never overwritten), and the record lists each with its size and SHA-256 (attachments.py: how
`store verify` and `store merge` prove and carry them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .record import LoadGenInfo, LoadGenLog, LoadGenResult, Record
from .store import Store, read_regular

LOADGEN_DIR = "loadgen"
LOG_FILES = ("mlperf_log_summary.txt", "mlperf_log_detail.txt")
MLLOG = ":::MLLOG "
# each scenario's figure, as MLPerf states it: the detail log key it is read from
METRIC_KEYS = {
    "single_stream": ("p90 latency (ns)", "result_90.00_percentile_latency_ns"),
    "multi_stream": ("p99 latency per query (ns)", "result_99.00_percentile_per_query_latency_ns"),
    "offline": ("samples/s", "result_samples_per_second"),
    "server": ("queries/s within the p99 bound (highest rate found)", None),
}
# generation's server (LoadGen's token latencies): its figure is the rate too, within both bounds
TOKEN_SERVER_METRIC = "queries/s within the p99 TTFT and TPOT bounds (highest rate found)"
# the scenario's throughput in samples/s: single stream's queries are one sample; multi-stream has none of its own
THROUGHPUT_KEYS = {"single_stream": "result_qps_with_loadgen_overhead", "offline": "result_samples_per_second",
                   "server": "result_completed_samples_per_sec"}
UNMET = (("result_min_duration_met", "the minimum duration was not met"),
         ("result_min_queries_met", "the minimum query count was not met"),
         ("result_perf_constraints_met", "the latency percentile exceeded the target latency (with token "
          "latencies: the TTFT or TPOT percentile exceeded its bound)"),
         ("early_stopping_met", "early stopping was not satisfied"))


class LoadGenLogError(ValueError):
    """A LoadGen log that is missing or does not say what a record needs (names the file)."""


def read_detail(text: str) -> dict:
    """key -> value of a detail log (a repeated key keeps its last value); LoadGen's errors and
    warnings under "errors" and "warnings" (lists of their values)."""
    out: dict = {"errors": [], "warnings": []}
    for line in text.splitlines():
        if not line.startswith(MLLOG):
            continue
        try:
            entry = json.loads(line[len(MLLOG):])
        except ValueError:
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
            continue
        meta = entry.get("metadata") if isinstance(entry.get("metadata"), dict) else {}
        if meta.get("is_error"):
            out["errors"].append(str(entry.get("value")))
        elif meta.get("is_warning"):
            out["warnings"].append(str(entry.get("value")))
        out[entry["key"]] = entry.get("value")
    return out


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def result_of(detail: dict, scenario: str, log_dir: str, source: str) -> LoadGenResult:
    """LoadGen's result of one test from its detail log's keys; LoadGenLogError (naming `source`)
    when the log has no verdict (LoadGen did not finish the test)."""
    validity = detail.get("result_validity")
    if validity not in ("VALID", "INVALID"):
        raise LoadGenLogError(f"{source}: result_validity: missing or not VALID/INVALID ({validity!r}): "
                              "LoadGen did not finish this test")
    reasons = []
    if isinstance(detail.get("result_invalid_reason"), str) and detail["result_invalid_reason"].strip():
        reasons.append(detail["result_invalid_reason"].strip())
    reasons += [words for key, words in UNMET if detail.get(key) is False]
    # token latencies: one early-stopping text for the time to first token and one per output token
    texts = [(label, detail.get(key)) for label, key in (("", "early_stopping_result"),
                                                         ("TTFT: ", "early_stopping_ttft_result"),
                                                         ("TPOT: ", "early_stopping_tpot_result"))]
    early = "; ".join(label + " ".join(t.split()) for label, t in texts if isinstance(t, str) and t.strip()) or None
    if detail.get("early_stopping_met") is False and early:
        reasons.append(f"early stopping: {early}")
    reasons += [f"LoadGen error: {e}" for e in detail.get("errors", [])]
    latency, ttft, tpot = {}, {}, {}
    for key, value in detail.items():
        if _number(value) is None or not key.startswith("result_"):
            continue
        if key.startswith("result_first_token_") and key.endswith("_latency_ns"):
            ttft[key[len("result_first_token_"):-len("_latency_ns")].removesuffix("_percentile")] = _number(value)
        elif key.startswith("result_time_per_output_token_") and key.endswith("_percentile_ns"):
            tpot[key[len("result_time_per_output_token_"):-len("_percentile_ns")]] = _number(value)
        elif key.startswith("result_time_to_output_token_"):  # LoadGen's name for TPOT's min, mean, max
            tpot[key[len("result_time_to_output_token_"):]] = _number(value)
        elif key.endswith("_latency_ns") and "per_query" not in key:
            latency[key[len("result_"):-len("_latency_ns")].removesuffix("_percentile")] = _number(value)
    throughput = THROUGHPUT_KEYS.get(scenario)
    figures = {k: v for k, v in detail.items() if k.startswith(("result_", "early_stopping_"))}
    return LoadGenResult(
        log_dir=log_dir, validity=validity, invalid_reasons=reasons if validity == "INVALID" else [],
        target_qps=_number(detail.get("effective_target_qps")) if scenario == "server" else None,
        meets_bound=detail.get("result_perf_constraints_met") if scenario == "server" else None,
        query_count=detail.get("result_query_count") if isinstance(detail.get("result_query_count"), int) else None,
        latency_ns=latency, samples_per_s=_number(detail.get(throughput)) if throughput else None,
        ttft_ns=ttft, tpot_ns=tpot, tokens_per_s=_number(detail.get("result_completed_tokens_per_second")),
        early_stopping=early, figures=figures)


def metric_of(scenario: str, result: LoadGenResult) -> tuple[str, float | None]:
    """(what the scenario's figure is, its value): the server's is the rate of the chosen test when
    it met the bound (with token latencies: both bounds), else none (no rate tried met it)."""
    name, key = METRIC_KEYS[scenario]
    if scenario == "server":
        return TOKEN_SERVER_METRIC if result.ttft_ns else name, result.target_qps if result.meets_bound else None
    return name, _number(result.figures.get(key))


def collect_logs(folder: Path, tests: list[str]) -> dict[str, bytes]:
    """The log files of each LoadGen test folder under `folder`: "<test>/<file>" -> bytes.
    LoadGenLogError when a test left no detail log (its verdict would be unknown)."""
    out = {}
    for test in tests:
        for name in LOG_FILES:
            path = folder / test / name
            if path.is_file():
                out[f"{test}/{name}"] = read_regular(path)
        if f"{test}/mlperf_log_detail.txt" not in out:
            raise LoadGenLogError(f"{folder / test}: LoadGen wrote no mlperf_log_detail.txt")
    return out


def write_logs(store: Store, run_id: str, files: dict[str, bytes]) -> list[LoadGenLog]:
    """Put a run's LoadGen logs into the store (each staged and linked: whole or absent, never
    overwritten) before its record; what the record lists of them."""
    entries = []
    for relative, content in sorted(files.items()):
        path = f"{LOADGEN_DIR}/{run_id}/{relative}"
        store.publish(content, store.root / path)
        entries.append(LoadGenLog(path=path, bytes=len(content), sha256=hashlib.sha256(content).hexdigest()))
    return entries
