"""Old records read as the current schema; newer and broken ones are reported, not crashed on; the
orchestrator writes the equivalence status of what it measured into every record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlbench.execution.orchestrator import Orchestrator, RunOptions, plan
from dlbench.store import migrations
from dlbench.store.checks import CheckStore, FrameworkCheck
from dlbench.store.record import SCHEMA_VERSION, Record
from dlbench.store.rows import run_row
from dlbench.store.store import Store, StoreError, checksum_of

ROOT = Path(__file__).resolve().parents[2]
V1 = ROOT / "tests" / "fixtures" / "records" / "v1.json"
V1_RUN_ID = "20261129T194802Z-682d7357e05b"


def v1_data() -> dict:
    return json.loads(V1.read_text())


def store_with(tmp_path: Path, data: dict | None = None, run_id: str = V1_RUN_ID) -> tuple[Store, Path]:
    (tmp_path / "runs").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "runs" / f"{run_id}.json"
    if data is None:
        shutil.copy(V1, path)
    else:
        path.write_text(json.dumps(data))
    return Store(tmp_path), path


# --------------------------------------------------------------------------- reading old records


def test_fixture_is_a_version_1_record():
    data = v1_data()
    assert data["schema_version"] == 1 and data["run_id"] == V1_RUN_ID
    assert "equivalence" not in data


def test_v1_record_reads_as_the_current_version(tmp_path):
    store, path = store_with(tmp_path)
    before = path.read_bytes()
    problems = []
    records = list(store.records(problems))
    assert problems == []
    assert len(records) == 1
    rec = records[0]
    assert rec.schema_version == SCHEMA_VERSION
    assert rec.equivalence["status"] == "unchecked"
    assert "before" in rec.equivalence["reason"]
    assert run_row(rec)["equivalence"] == "unchecked"
    # everything that was in the old record is still there
    data = v1_data()
    assert rec.run_id == V1_RUN_ID and rec.benchmark == data["benchmark"] == "alexnet_r-train"
    assert rec.params == data["params"] and rec.network.hash == data["network"]["hash"]
    assert rec.summary.ms_per_iter == data["summary"]["ms_per_iter"]
    assert rec.framework == data["framework"] and len(rec.repeats) == len(data["repeats"])
    # upgraded on read only: the file is never rewritten
    assert path.read_bytes() == before


def test_upgraded_record_round_trips_at_the_current_version(tmp_path):
    store, path = store_with(tmp_path / "old")
    rec = store.read(path)
    new = Store(tmp_path / "new")
    written = new.write(rec)
    assert json.loads(written.read_text())["schema_version"] == SCHEMA_VERSION
    assert new.read(written) == rec


def test_v1_and_current_records_read_side_by_side(tmp_path):
    store, _ = store_with(tmp_path)
    data = v1_data()
    data = migrations.upgrade(data, SCHEMA_VERSION)
    data["run_id"] = "20261130T000000Z-000000000001"
    data["equivalence"] = {"status": "equivalent", "checked_at": "2026-11-30T00:00:00+00:00"}
    data["checksum"] = checksum_of(data)  # a current record carries one
    (tmp_path / "runs" / f"{data['run_id']}.json").write_text(json.dumps(data))
    got = {r.run_id: r.equivalence["status"] for r in store.records()}
    assert got == {V1_RUN_ID: "unchecked", "20261130T000000Z-000000000001": "equivalent"}


# --------------------------------------------------------------------------- migrations.upgrade


def test_there_is_one_step_per_version():
    assert sorted(migrations.STEPS) == list(range(2, SCHEMA_VERSION + 1))


def test_update_to_2_adds_only_the_equivalence():
    data = v1_data()
    out = migrations.update_to_2(json.loads(json.dumps(data)))
    assert out["equivalence"]["status"] == "unchecked"
    assert {k: v for k, v in out.items() if k != "equivalence"} == data


def test_upgrade_steps_one_version_at_a_time(monkeypatch):
    seen = []

    def step(n):
        def apply(data):
            seen.append((n, data["schema_version"], list(data.get("trail", []))))
            return {**data, "trail": data.get("trail", []) + [n]}
        return apply

    monkeypatch.setattr(migrations, "STEPS", {2: step(2), 3: step(3), 4: step(4)})
    out = migrations.upgrade({"schema_version": 1}, 4)
    # each step gets a record of the version just below it, with the earlier steps applied
    assert seen == [(2, 1, []), (3, 2, [2]), (4, 3, [2, 3])]
    assert out == {"schema_version": 4, "trail": [2, 3, 4]}

    seen.clear()
    assert migrations.upgrade({"schema_version": 3}, 4) == {"schema_version": 4, "trail": [4]}
    assert seen == [(4, 3, [])]

    seen.clear()
    assert migrations.upgrade({"schema_version": 4, "x": 1}, 4) == {"schema_version": 4, "x": 1}
    assert seen == []


def test_upgrade_to_an_intermediate_version_stops_there(monkeypatch):
    calls = []
    monkeypatch.setattr(migrations, "STEPS", {2: lambda d: calls.append(2) or d, 3: lambda d: calls.append(3) or d})
    assert migrations.upgrade({"schema_version": 1}, 2)["schema_version"] == 2
    assert calls == [2]


# --------------------------------------------------------------------------- broken and newer records


@pytest.mark.parametrize("version", [0, -1, "1", "2", None, 1.5, True, [1]])
def test_invalid_schema_version_is_a_problem_not_a_crash(tmp_path, version):
    data = v1_data()
    data["schema_version"] = version
    store, path = store_with(tmp_path, data)
    problems = []
    assert list(store.records(problems)) == []
    assert len(problems) == 1 and problems[0].path == path
    assert str(path) in problems[0].reason and "schema_version" in problems[0].reason
    with pytest.raises(StoreError, match="schema_version"):
        store.read(path)


def test_missing_schema_version_is_a_problem(tmp_path):
    data = v1_data()
    del data["schema_version"]
    store, path = store_with(tmp_path, data)
    problems = []
    assert list(store.records(problems)) == []
    assert [p.path for p in problems] == [path] and "schema_version" in problems[0].reason


def test_newer_record_is_refused_naming_the_file(tmp_path):
    data = migrations.upgrade(v1_data(), SCHEMA_VERSION)
    data["schema_version"] = SCHEMA_VERSION + 1
    store, path = store_with(tmp_path, data)
    with pytest.raises(StoreError) as info:
        store.read(path)
    message = str(info.value)
    assert str(path) in message and "newer" in message and str(SCHEMA_VERSION + 1) in message
    problems = []
    assert list(store.records(problems)) == []
    assert [p.path for p in problems] == [path] and "newer" in problems[0].reason


def test_one_bad_record_does_not_hide_the_good_ones(tmp_path):
    store, good = store_with(tmp_path)
    bad = v1_data()
    bad["schema_version"] = 0
    (tmp_path / "runs" / "20261129T194803Z-bad000000000.json").write_text(json.dumps(bad))
    problems = []
    assert [r.run_id for r in store.records(problems)] == [V1_RUN_ID]
    assert len(problems) == 1


# --------------------------------------------------------------------------- orchestrator


@pytest.fixture(autouse=True)
def fast(fast_fake_runner):
    pass


def orchestrator(tmp_path: Path) -> tuple[Store, Orchestrator]:
    store = Store(tmp_path / "store")
    options = RunOptions(device="cpu", env_backend="current", threads=1, repeats=1, timeout_s=60.0,
                         cache=tmp_path / "cache")
    return store, Orchestrator(store, options)


def check_of(network, status="equivalent", version="0.0", network_hash=None) -> FrameworkCheck:
    return FrameworkCheck(network=network.name, framework="fake", framework_version=version, status=status,
                          reason=None if status == "equivalent" else "logits differ", params=network.params,
                          params_described=network.params, tolerance=1e-4, errors={"logits": 1e-6},
                          network_hash=network_hash or network.definition_hash,
                          checked_at="2026-11-29T12:00:00+00:00")


def test_records_carry_the_equivalence_status(tmp_path, suite, fake):
    store, orch = orchestrator(tmp_path)
    fcn5 = next(b.network for b in suite.benchmarks if b.network.name == "fcn5")
    fcn8 = next(b.network for b in suite.benchmarks if b.network.name == "fcn8")
    checks = CheckStore(store.root)
    checks.save(check_of(fcn5))
    checks.save(check_of(fcn8, version="9.9"))  # another version of the framework: does not apply
    records = orch.execute(plan([fake], list(suite.benchmarks)))
    assert len(records) == 4
    on_disk = {r.run_id: r for r in store.records()}
    assert set(on_disk) == {r.run_id for r in records}
    seen = set()
    for rec in on_disk.values():
        assert rec.status == "ok" and rec.schema_version == SCHEMA_VERSION
        assert rec.framework["version"] == "0.0"
        seen.add(rec.network.name)
        if rec.network.name == "fcn5":
            assert rec.equivalence == {"status": "equivalent", "checked_at": "2026-11-29T12:00:00+00:00",
                                       "reason": None, "errors": {"logits": 1e-6}, "precision": "float64",
                                       "reference": None, "worst": {"quantity": "logits", "error": 1e-6},
                                       "check_s": None, "checked_by": "dlbench check"}
        else:
            assert rec.network.name == "fcn8"
            assert rec.equivalence == {"status": "unchecked"}
        assert run_row(rec)["equivalence"] == rec.equivalence["status"]
    assert seen == {"fcn5", "fcn8"}
    # the returned records say the same as the stored ones
    assert {r.run_id: r.equivalence for r in records} == {k: v.equivalence for k, v in on_disk.items()}


def test_records_carry_a_mismatch_and_ignore_a_check_of_another_network_version(tmp_path, suite, fake):
    store, orch = orchestrator(tmp_path)
    fcn5 = next(b.network for b in suite.benchmarks if b.network.name == "fcn5")
    fcn8 = next(b.network for b in suite.benchmarks if b.network.name == "fcn8")
    checks = CheckStore(store.root)
    checks.save(check_of(fcn5, status="mismatch"))
    checks.save(check_of(fcn8, network_hash="0" * 64))  # checked before fcn8's description changed
    train = [b for b in suite.benchmarks if b.mode == "train"]
    assert [b.network.name for b in train] == ["fcn5", "fcn8"]
    r5, r8 = orch.execute(plan([fake], train))
    assert r5.equivalence["status"] == "mismatch" and r5.equivalence["reason"] == "logits differ"
    assert r8.equivalence["status"] == "unchecked" and "another version" in r8.equivalence["reason"]
    stored = {r.run_id: r.equivalence["status"] for r in store.records()}
    assert stored == {r5.run_id: "mismatch", r8.run_id: "unchecked"}


def _v5(device="cpu", framework="torch", precision="float32", mode="train", runner_settings=None) -> dict:
    return {"schema_version": 5, "workload": {"mode": mode, "batch_size": 4, "precision": precision,
                                              "learning_rate": 0.01, "momentum": 0.9, "device": device},
            "framework": {"name": framework}, "settings": {"runner": runner_settings or {}}}


@pytest.mark.parametrize("device,expected", [("cpu", "fp32"), ("cuda", "float32 (TF32 not pinned)")])
def test_update_to_6_names_float32_by_what_it_was(device, expected):
    assert migrations.update_to_6(_v5(device))["workload"]["precision"] == expected


def test_update_to_6_keeps_mixed_precision_and_collective_dtypes():
    assert migrations.update_to_6(_v5(precision="amp_bf16"))["workload"]["precision"] == "amp_bf16"
    assert migrations.update_to_6(_v5(precision="float32", mode="collective"))["workload"]["precision"] == "float32"


@pytest.mark.parametrize("framework,runner,expected", [
    ("torch", {}, "eager"), ("jax", {}, "compiled"), ("mxnet", {}, "compiled"), ("tensorflow", {}, "eager"),
    ("tensorflow", {"jit_compile_requested": True}, "compiled"), ("someother", {}, "eager")])
def test_update_to_6_gives_the_compile_mode_the_runner_ran(framework, runner, expected):
    data = migrations.update_to_6(_v5(framework=framework, runner_settings=runner))
    assert data["workload"]["compile"] == expected
    assert migrations.update_to_6(data)["workload"]["compile"] == expected  # deterministic, idempotent


def test_a_version_5_record_reads_as_a_version_6_record(tmp_path):
    data = migrations.upgrade(v1_data(), SCHEMA_VERSION)
    rec = Record.model_validate(data)
    assert rec.workload.compile in ("eager", "compiled") and rec.workload.precision != "float32"
    assert rec.summary is None or rec.summary.compile_s is None
