"""A record of every schema version there ever was (tests/fixtures/records/vN.json) reads at the
current version with nothing lost; `dlbench store upgrade` rewrites old records at the current
version atomically, keeping the originals, and is safe to repeat."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from test_store_integrity import invoke

from dlbench.machine import machine_id
from dlbench.store import migrations
from dlbench.store.record import SCHEMA_VERSION
from dlbench.store.rows import run_row
from dlbench.store.store import Store, StoreError, checksum_of
from dlbench.store.verify import verify

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "records"
VERSIONS = list(range(1, SCHEMA_VERSION + 1))


def fixture(version: int) -> dict:
    return json.loads((FIXTURES / f"v{version}.json").read_text())


def store_with(tmp_path: Path, *versions: int) -> tuple[Store, dict[int, Path]]:
    store = Store(tmp_path / "store")
    store.runs.mkdir(parents=True)
    paths = {}
    for v in versions:
        paths[v] = store.runs / f"{fixture(v)['run_id']}.json"
        shutil.copy(FIXTURES / f"v{v}.json", paths[v])
    copy_attachments(store.root)
    return store, paths


def copy_attachments(root: Path) -> None:
    """The files the fixtures keep beside them (v11's MLLOG files, v13's LoadGen logs), where a store keeps them."""
    shutil.copytree(FIXTURES / "mllog", root / "mllog", dirs_exist_ok=True)
    shutil.copytree(FIXTURES / "loadgen", root / "loadgen", dirs_exist_ok=True)


def test_there_is_a_fixture_of_every_schema_version():
    for v in VERSIONS:
        data = fixture(v)
        assert data["schema_version"] == v
        assert ("checksum" in data) == (v >= 4)
    assert not (FIXTURES / f"v{SCHEMA_VERSION + 1}.json").exists()


def test_fixtures_are_distinct_runs():
    assert len({fixture(v)["run_id"] for v in VERSIONS}) == len(VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_reads_as_the_current_one_with_nothing_lost(tmp_path, version):
    store, paths = store_with(tmp_path, version)
    path = paths[version]
    before = path.read_bytes()
    data = fixture(version)
    stored = store.inspect(path)
    rec = stored.record
    assert stored.written_version == version and rec.schema_version == SCHEMA_VERSION
    assert stored.verified == (version >= 4)  # older records have no checksum: unverified, not an error
    # what the old record said is still said
    assert rec.run_id == data["run_id"] and rec.benchmark == data["benchmark"]
    assert rec.network.hash == data["network"]["hash"] and rec.network.definition == data["network"]["definition"]
    assert rec.params == data["params"] and rec.status == data["status"]
    assert rec.framework == data["framework"] and rec.environment == data["environment"]
    assert [r.iter_s for r in rec.repeats] == [r["iter_s"] for r in data["repeats"]]
    if data.get("summary") is not None:  # a convergence record (11) has none: its score is `convergence`
        assert rec.summary.median_s == data["summary"]["median_s"]
    assert rec.dlbench == data["dlbench"]
    # what each step added
    assert rec.equivalence == data.get("equivalence", rec.equivalence)
    if version < 2:
        assert rec.equivalence["status"] == "unchecked" and "before" in rec.equivalence["reason"]
    if version < 3:
        assert rec.telemetry == {"enabled": False, "reason": "recorded before dlbench sampled telemetry"}
        assert all(r.telemetry is None and r.derived is None for r in rec.repeats)
    else:
        assert rec.telemetry == data["telemetry"]
        assert [r.telemetry for r in rec.repeats] == [r["telemetry"] for r in data["repeats"]]
    if version < 4:  # the statistics of schema 4 cannot be made up for old records: absent, not guessed
        assert rec.summary.ci is None and rec.summary.stability is None and rec.repeat_policy is None
    elif rec.summary is not None:
        assert rec.summary.ci.median_s[0] <= rec.summary.median_s <= rec.summary.ci.median_s[1]
        # fixed before 8; from 8 on each fixture says which it ran with (v8-v10 adaptive, v12 fixed)
        kind = "fixed" if version < 8 else data["repeat_policy"]["kind"]
        assert rec.repeat_policy.kind == kind and rec.summary.stability is not None
    if 4 <= version < 8:  # fixed repeats: no target, so no interval it was judged on
        assert rec.repeat_policy.target_interval is None and rec.repeat_policy.achieved_reported_ci_pct is None
    if version < 12:  # an older prediction's split by source cannot be told after the fact: none
        assert rec.prediction is None or rec.prediction.sources == {}
    elif data.get("prediction") is not None:  # v13's LoadGen run has none: LoadGen keeps the clock
        assert rec.prediction.sources == data["prediction"]["sources"] and set(rec.prediction.sources) <= {
            "shape", "class", "ceilings", "datasheet"}
        assert sum(rec.prediction.sources.values()) == pytest.approx(1.0)
    old_machine = {k: v for k, v in data["machine"].items() if k != "machine_id"}
    assert {k: v for k, v in rec.machine.items() if k != "machine_id"} == old_machine
    assert rec.machine["machine_id"] == machine_id(old_machine)
    assert run_row(rec)["run_id"] == data["run_id"]
    assert path.read_bytes() == before  # reading never rewrites


def test_update_to_4_adds_only_the_machine_id():
    data = fixture(3)
    out = migrations.update_to_4(json.loads(json.dumps(data)))
    assert out["machine"]["machine_id"] == machine_id(data["machine"])
    out["machine"].pop("machine_id")
    assert out == data


def test_update_to_4_keeps_a_machine_id_that_is_there():
    data = fixture(3)
    data["machine"]["machine_id"] = "given"
    assert migrations.update_to_4(data)["machine"]["machine_id"] == "given"


def test_the_v4_fixture_is_what_schema_4_writes():
    data = fixture(4)
    assert data["checksum"] == checksum_of(data)
    assert data["machine"]["machine_id"] == machine_id(data["machine"])
    env = data["environment"]
    assert env["python"] and env["python_version"] and env["packages"]
    assert all("==" in p for p in env["packages"])


def test_update_to_8_says_an_older_adaptive_run_was_judged_on_the_bootstrap():
    data = fixture(7)
    data["repeat_policy"].update(kind="adaptive", target_ci_pct=2.0, stopped="target_met")
    out = migrations.update_to_8(json.loads(json.dumps(data)))
    assert out["repeat_policy"]["target_interval"] == "bootstrap"
    assert "achieved_reported_ci_pct" not in out["repeat_policy"]  # not recorded then: never made up
    out["repeat_policy"].pop("target_interval")
    assert out == data
    fixed = fixture(7)
    assert migrations.update_to_8(json.loads(json.dumps(fixed))) == fixed


def test_the_v8_fixture_stopped_on_the_reported_interval():
    from dlbench.store.intervals import reported_interval
    from dlbench.store.record import Record

    data = fixture(8)
    assert data["checksum"] == checksum_of(data)
    rec = Record.model_validate({k: v for k, v in data.items() if k != "checksum"})
    policy = rec.repeat_policy
    assert policy.kind == "adaptive" and policy.target_interval == "reported" and policy.stopped == "target_met"
    shown = reported_interval(rec.summary, rec.workload.batch_size).half_width_pct
    assert policy.achieved_reported_ci_pct == pytest.approx(shown) and shown <= policy.target_ci_pct
    assert policy.achieved_ci_pct == rec.summary.ci.half_width_pct


def test_the_v11_fixture_is_a_convergence_record_with_its_score():
    from dlbench.analysis.convergence import score
    from dlbench.store.record import Record

    data = fixture(11)
    assert data["checksum"] == checksum_of(data)
    rec = Record.model_validate({k: v for k, v in data.items() if k != "checksum"})
    c = rec.convergence
    assert rec.workload.mode == "convergence" and rec.summary is None and len(c.runs) == 3
    assert c.score_s == score([r.time_to_target_s for r in c.runs]).seconds
    assert all(r.mllog == f"mllog/{rec.run_id}/seed-{r.seed}.log" and len(r.mllog_sha256) == 64 for r in c.runs)
    assert run_row(rec)["reached"] == "3/3"


def test_the_v13_fixture_is_generation_s_loadgen_server_with_token_latencies(tmp_path):
    data = fixture(13)
    assert data["checksum"] == checksum_of(data)
    store, paths = store_with(tmp_path, 13)
    rec = store.read(paths[13])
    info = rec.loadgen
    assert rec.workload.mode == "generate" and rec.workload.scenario == "server" and rec.summary is None
    assert info.generation["ttft_ms"] == 100.0 and info.generation["tpot_ms"] == 25.0
    assert len(info.search) == 3 and all(t.ttft_ns and t.tpot_ns and t.tokens_per_s for t in info.search)
    row = run_row(rec)
    assert row["ttft_p99_ms"] == info.result.ttft_ns["99.00"] / 1e6 and row["server_qps"] == info.metric_value
    assert verify(store).problems == []  # its LoadGen logs, kept beside it, match their SHA-256


def test_the_v14_fixture_keeps_each_repeats_yardstick_and_older_records_read_with_none(tmp_path):
    from dlbench.performance.yardstick import YARDSTICK

    store, paths = store_with(tmp_path, 14)
    rec = store.read(paths[14])
    keys = {spec.key for spec in YARDSTICK}
    assert len(rec.repeats) == 2 and all(set(r.yardstick) == keys and min(r.yardstick.values()) > 0
                                         for r in rec.repeats)
    older = store.read(store_with(tmp_path / "older", 12)[1][12])
    assert all(r.yardstick is None for r in older.repeats)


def test_the_v15_fixture_says_how_its_container_was_had_and_run(tmp_path):
    store, paths = store_with(tmp_path, 15)
    env = store.read(paths[15]).environment
    facts = env["container"]
    assert env["backend"] == "docker" and env["image_id"].startswith("sha256:")
    assert (facts["engine"]["engine"], facts["engine"]["builder"]) == ("docker", "classic")
    assert facts["base_image"] == "dlbench/base:bookworm-local" and facts["image_size_bytes"] > 0
    assert facts["run_options"][:3] == ["--init", "--pull", "never"]
    older = store.read(store_with(tmp_path / "older", 14)[1][14])
    assert "container" not in older.environment


def test_the_v16_fixture_keeps_its_link_and_older_records_read_with_none(tmp_path):
    store, paths = store_with(tmp_path, 16)
    rec = store.read(paths[16])
    assert rec.benchmark == "fcn5-train-w2@1gbit" and rec.link.asked == "1gbit" and rec.link.rate_bps == 10**9
    assert rec.link.measured.bandwidth_bps > 0 and rec.link.measured.rtt_s > 0
    wire = rec.link.wire
    assert len(wire.sent_per_iter) == 2 and wire.ring_allreduce_bytes == rec.distributed.grad_bytes
    older = store.read(store_with(tmp_path / "older", 5)[1][5])
    assert older.link is None


def test_the_v18_fixture_says_it_was_oversubscribed_and_older_records_read_with_none(tmp_path):
    store, paths = store_with(tmp_path, 18)
    rec = store.read(paths[18])
    assert rec.benchmark == "fcn5-train-w4@1gbit" and rec.distributed.workers == 4
    crowded = rec.distributed.oversubscribed
    assert (crowded.threads, crowded.cores) == (4, 2) and crowded.machine.count("+") == 3
    assert run_row(rec)["oversubscribed"] == "4 threads/2 cores"
    older = store.read(store_with(tmp_path / "older", 16)[1][16])
    assert older.distributed.oversubscribed is None and run_row(older)["oversubscribed"] is None


def test_older_loadgen_records_read_without_token_latencies(tmp_path):
    store, paths = store_with(tmp_path, 12)
    data = fixture(13)
    data["schema_version"] = 12  # a LoadGen server record of 12 had none of 13's token fields
    del data["loadgen"]["generation"]
    for test in [data["loadgen"]["result"], *data["loadgen"]["search"]]:
        for key in ("ttft_ns", "tpot_ns", "tokens_per_s"):
            del test[key]
    upgraded = migrations.upgrade(json.loads(json.dumps(data)), SCHEMA_VERSION)
    from dlbench.store.record import Record

    rec = Record.model_validate({k: v for k, v in upgraded.items() if k != "checksum"})
    assert rec.loadgen.generation == {} and rec.loadgen.result.ttft_ns == {} and rec.loadgen.result.tokens_per_s is None


def test_a_newer_version_is_refused_by_name(tmp_path):
    data = fixture(SCHEMA_VERSION)
    data["schema_version"] = SCHEMA_VERSION + 1
    data["checksum"] = checksum_of(data)
    store, _ = store_with(tmp_path)
    path = store.runs / "20270101T000000Z-000000000000.json"
    path.write_text(json.dumps(data))
    with pytest.raises(StoreError) as info:
        store.read(path)
    assert str(path) in str(info.value) and "newer" in str(info.value) and str(SCHEMA_VERSION + 1) in str(info.value)


# --------------------------------------------------------------------------- store upgrade


def test_upgrade_rewrites_old_records_and_keeps_the_originals(tmp_path):
    store, paths = store_with(tmp_path, *VERSIONS)
    originals = {v: p.read_bytes() for v, p in paths.items()}
    before = {v: store.read(p) for v, p in paths.items()}
    report = store.upgrade()
    assert report.problems == []
    assert sorted(report.upgraded) == sorted((paths[v], v) for v in VERSIONS if v < SCHEMA_VERSION)
    assert report.current == 1
    for v, path in paths.items():
        stored = store.inspect(path)
        assert stored.written_version == SCHEMA_VERSION and stored.verified
        assert stored.record == before[v]  # the same record, now stored at the current version
        if v < SCHEMA_VERSION:
            kept = store.upgraded / f"{path.stem}.v{v}.json"
            assert kept.read_bytes() == originals[v]
            assert stored.upgraded_from["schema_version"] == v
            assert stored.upgraded_from["file_sha256"] == hashlib.sha256(originals[v]).hexdigest()
        else:
            assert path.read_bytes() == originals[v] and stored.upgraded_from is None
    assert list(store.incoming.iterdir()) == []
    assert verify(store).problems == [] and len(verify(store).verified) == len(VERSIONS)

    again = store.upgrade()  # nothing left to do
    assert again.upgraded == [] and again.current == len(VERSIONS) and again.problems == []


def test_the_upgrade_note_is_covered_by_the_checksum(tmp_path):
    store, paths = store_with(tmp_path, 1)
    store.upgrade()
    path = paths[1]
    text = path.read_text()
    # in upgraded_from (not followed by a digit: the record's own version may be 10 or more)
    assert len(re.findall(r'"schema_version": 1(?!\d)', text)) == 1
    path.write_text(re.sub(r'"schema_version": 1(?!\d)', '"schema_version": 2', text))
    with pytest.raises(StoreError, match="checksum mismatch"):
        store.read(path)


def test_upgrade_leaves_damaged_and_newer_records_alone(tmp_path):
    store, paths = store_with(tmp_path, 1, 3)
    raw = paths[3].read_bytes()
    paths[3].write_bytes(raw[:500])
    newer = fixture(SCHEMA_VERSION)
    newer["schema_version"] = SCHEMA_VERSION + 1
    newer_path = store.runs / "20270101T000000Z-000000000000.json"
    newer_path.write_text(json.dumps(newer))
    newer_bytes = newer_path.read_bytes()
    report = store.upgrade()
    assert report.upgraded == [(paths[1], 1)]
    assert {p.path for p in report.problems} == {paths[3], newer_path}
    assert paths[3].read_bytes() == raw[:500] and newer_path.read_bytes() == newer_bytes


def test_an_interrupted_upgrade_can_be_run_again(tmp_path):
    store, paths = store_with(tmp_path, 2)
    # killed after keeping the original and before replacing the record
    store.upgraded.mkdir()
    kept = store.upgraded / f"{paths[2].stem}.v2.json"
    shutil.copy(paths[2], kept)
    report = store.upgrade()
    assert report.upgraded == [(paths[2], 2)] and report.problems == []
    assert store.inspect(paths[2]).verified


def test_upgrade_never_loses_an_original_kept_before(tmp_path):
    store, paths = store_with(tmp_path, 2)
    store.upgraded.mkdir()
    kept = store.upgraded / f"{paths[2].stem}.v2.json"
    kept.write_text("another file under the name the original would take")
    before = paths[2].read_bytes()
    report = store.upgrade()
    assert report.upgraded == [] and [p.path for p in report.problems] == [paths[2]]
    assert paths[2].read_bytes() == before and kept.read_text().startswith("another file")


def test_store_upgrade_command(tmp_path):
    store, paths = store_with(tmp_path, *VERSIONS)
    code, out, err = invoke("store", "upgrade", "--store", str(store.root))
    assert code == 0, err
    flat = " ".join(out.split())
    assert f"{len(VERSIONS) - 1} records upgraded to schema {SCHEMA_VERSION}" in flat
    assert ".upgraded" in flat and "1 already current" in flat
    code, out, _ = invoke("store", "verify", "--store", str(store.root))
    assert code == 0 and f"{len(VERSIONS)} verified by checksum, 0 unverified" in " ".join(out.split())


def test_store_upgrade_command_reports_what_it_could_not_read(tmp_path):
    store, paths = store_with(tmp_path, 1, 2)
    paths[2].write_text("{")
    code, out, err = invoke("store", "upgrade", "--store", str(store.root))
    assert code == 1
    assert paths[2].name in " ".join(out.split()) and "left as they are" in err
    assert store.inspect(paths[1]).written_version == SCHEMA_VERSION


def test_verify_names_files_beside_the_records_that_no_record_lists(tmp_path):
    # v11's MLLOG files and v13's LoadGen logs are listed by their records: not reported; a LoadGen
    # folder left by a run that died before its record was written is, without failing verify
    store, _ = store_with(tmp_path, 11, 13)
    orphan = store.root / "loadgen" / "20260101T000000Z-0123456789ab" / "offline" / "mlperf_log_summary.txt"
    orphan.parent.mkdir(parents=True)
    orphan.write_text("left by a run that died\n")
    report = verify(store)
    assert report.problems == [] and report.unlisted == [orphan]
    code, out, _ = invoke("store", "verify", "--store", str(store.root))
    assert code == 0
    assert "1 files beside the records that no record lists" in " ".join(out.split())
    assert "loadgen/20260101T000000Z-0123456789ab" in out
