"""The store against hostile files and a failing disk (issue 18, classes 2, 4, 5 and 6): records
with numbers SQLite cannot hold, lone surrogates and terminal escapes, copies under other names, a
FIFO in runs/, a byte flipped behind the index's back, run ids that are paths, a store that is a
file, read-only or full, and a write that fails after the run began."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from store_records import make_record
from typer.testing import CliRunner

import dlbench
from dlbench.cli import app
from dlbench.cli.console import safe
from dlbench.store.index import read_rows
from dlbench.store.merge import merge
from dlbench.store.record import Record
from dlbench.store.store import Store, StoreError, StoreWriteError, checksum_of
from dlbench.store.verify import verify

ANSI_SGR = re.compile(r"\x1b\[[0-9;]*m")


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, " ".join(result.stderr.split())


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DLBENCH_STORE", raising=False)


@pytest.fixture
def no_hang():
    """A reader that blocks (on a FIFO) fails the test instead of hanging it."""
    def alarm(*_):
        raise TimeoutError("blocked")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def restamped(path: Path, change) -> None:
    """Edit a record file and give it a checksum that matches: a record that passes its checksum."""
    data = json.loads(path.read_bytes())
    change(data)
    data.pop("checksum")
    data["checksum"] = checksum_of(data)
    path.write_text(json.dumps(data, indent=1))


def two_records(tmp_path) -> tuple[Store, Path, Path]:
    st = Store(tmp_path / "store")
    return st, st.write(make_record(framework="torch")), st.write(make_record(framework="jax"))


# ------------------------------------------------------------------ class 2: numbers storage cannot hold

@pytest.mark.parametrize("change, field", [
    (lambda d: d["workload"].__setitem__("batch_size", 10**20), "workload.batch_size"),
    (lambda d: d.__setitem__("params", 10**30), "params"),
])
def test_a_record_with_an_integer_beyond_int64_is_skipped_not_a_crash_of_the_store(tmp_path, change, field):
    st, bad, good = two_records(tmp_path)
    restamped(bad, change)
    snap = read_rows(st)
    assert [r["run_id"] for r in snap.rows] == [good.stem]
    assert [u.path for u in snap.unreadable] == [bad] and field in snap.unreadable[0].reason
    with pytest.warns(UserWarning, match="unreadable"):
        assert list(dlbench.load(st.root).run_id) == [good.stem]
    code, out, err = invoke("results", "--store", str(st.root), "--format", "csv")
    assert code == 0 and good.stem in out and f"skipped {bad}: {field}" in err
    merged = Store(tmp_path / "merged")  # and a merge does not carry it into another store
    report = merge(merged, [st.root])
    assert [p for p, _ in report.unreadable] == [bad] and len(list(merged.records())) == 1
    assert invoke("results", "--store", str(merged.root), "--format", "json")[0] == 0


def test_rows_the_record_allows_but_sqlite_cannot_hold_are_stored_all_the_same(tmp_path):
    st, path, _ = two_records(tmp_path)
    # within int64 each, their product (model FLOPs per iteration) is not; a hostname that is a list
    restamped(path, lambda d: (d["workload"].__setitem__("batch_size", 2**62),
                               d["network"].__setitem__("flops_per_sample", 2**40),
                               d["machine"].__setitem__("hostname", ["a", {"b": 1}])))
    for _ in range(2):  # built, then served from the index
        snap = read_rows(st)
        assert not snap.unreadable and not snap.notes
        row = next(r for r in snap.rows if r["run_id"] == path.stem)
        assert row["batch_size"] == 2**62 and row["model_flops_per_iter"] == pytest.approx(3 * 2**102)
        assert row["machine"] == '["a", {"b": 1}]'
    for fmt in ("table", "csv", "json"):
        assert invoke("results", "--store", str(st.root), "--format", fmt)[0] == 0
    assert invoke("results", "--store", str(st.root), "--format", "parquet", "--out", str(tmp_path / "r.pq"))[0] == 0


# ------------------------------------------------------------------ class 5: what the index trusts

def test_a_lone_surrogate_survives_results_in_every_format_load_and_the_report(tmp_path):
    st, path, _ = two_records(tmp_path)
    restamped(path, lambda d: (d.__setitem__("reason", "x\ud800y"), d["framework"].__setitem__("version", "\udfff")))
    assert st.inspect(path).verified  # the file is intact: its checksum holds the surrogate as written
    for fmt in ("table", "csv", "json"):
        code, out, err = invoke("results", "--store", str(st.root), "--format", fmt)
        assert code == 0 and "skipped" not in err and ("2 runs" in out if fmt == "table" else path.stem in out)
    code, out, _ = invoke("results", "--store", str(st.root), "--format", "json")
    assert {r["reason"] for r in json.loads(out)} == {"x\ufffdy", None}
    assert invoke("results", "--store", str(st.root), "--format", "parquet", "--out", str(tmp_path / "r.pq"))[0] == 0
    assert "x\ufffdy" in set(dlbench.load(st.root).reason.dropna())
    code, _, err = invoke("report", "--store", str(st.root), "--out", str(tmp_path / "site"))
    assert code == 0, err
    assert "x\ufffdy" in (tmp_path / "site" / "runs" / f"{path.stem}.html").read_text()


def test_a_record_copied_under_another_name_is_counted_once_and_flagged(tmp_path):
    st, path, _ = two_records(tmp_path)
    copy = st.runs / "copy.json"
    shutil.copy(path, copy)
    snap = read_rows(st)
    assert sorted(r["run_id"] for r in snap.rows) == sorted(p.stem for p in st.paths() if p != copy)
    assert [u.path for u in snap.unreadable] == [copy] and "does not match the file name" in snap.unreadable[0].reason
    assert len(list(st.records())) == 2
    assert [p.path for p in verify(st).problems] == [copy]
    code, out, _ = invoke("report", "--store", str(st.root), "--out", str(tmp_path / "site"))
    assert code == 0 and "(2 runs" in out
    assert sorted(p.name for p in (tmp_path / "site" / "runs").iterdir()) == sorted(f"{p.stem}.html" for p in
                                                                                   st.paths() if p != copy)


def test_a_fifo_in_runs_is_reported_and_never_opened(tmp_path, no_hang):
    st, path, _ = two_records(tmp_path)
    fifo = st.runs / "pipe.json"
    os.mkfifo(fifo)
    snap = read_rows(st)
    assert len(snap.rows) == 2 and [u.path for u in snap.unreadable] == [fifo]
    assert "not a regular file (a FIFO); ignored, never opened" in snap.unreadable[0].reason
    assert [p.path for p in verify(st).problems] == [fifo]
    report = merge(Store(tmp_path / "other"), [st.root])
    assert len(report.added) == 2 and [p for p, _ in report.unreadable] == [fifo]
    code, _, err = invoke("results", "--store", str(st.root))
    assert code == 0 and f"skipped {fifo}: not a regular file" in err
    assert invoke("store", "verify", "--store", str(st.root))[0] == 1
    assert invoke("report", "--store", str(st.root), "--out", str(tmp_path / "site"))[0] == 0


def test_a_byte_flipped_with_size_and_mtime_restored_is_not_served_from_the_index(tmp_path):
    st, path, other = two_records(tmp_path)
    assert len(read_rows(st).rows) == 2  # indexed
    before = path.stat()
    raw = bytearray(path.read_bytes())
    at = raw.index(b'"batch_size": 16') + len(b'"batch_size": 1')
    raw[at] = ord("7")
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    snap = read_rows(st)
    assert [r["run_id"] for r in snap.rows] == [other.stem]
    assert [u.path for u in snap.unreadable] == [path] and "checksum mismatch" in snap.unreadable[0].reason
    with pytest.warns(UserWarning, match="checksum mismatch"):
        dlbench.load(st.root)
    path.write_bytes(bytes(raw).replace(b'"batch_size": 17', b'"batch_size": 16'))  # mended: served again
    assert len(read_rows(st).rows) == 2


@pytest.mark.parametrize("run_id", ["../../x", "/tmp/x", "a/b", "..", ".hidden", "x\ny", ""])
def test_a_run_id_that_is_not_one_is_refused_where_the_store_takes_it(tmp_path, run_id):
    st = Store(tmp_path / "deep" / "store")
    record = make_record().model_copy(update={"run_id": run_id})  # model_copy does not validate
    with pytest.raises(StoreError, match="is not a run id"):
        st.write(record)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    with pytest.raises(ValueError):
        Record.model_validate({**make_record().model_dump(), "run_id": run_id})


# ------------------------------------------------------------------ class 6: the terminal

HOSTILE = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mred\x9b2J\rover"


def test_strings_from_records_reach_the_terminal_with_control_characters_escaped(tmp_path):
    st, path, _ = two_records(tmp_path)
    restamped(path, lambda d: (d["framework"].__setitem__("name", HOSTILE),
                               d["framework"].__setitem__("version", HOSTILE),
                               d.__setitem__("benchmark", HOSTILE)))
    code, out, err = invoke("results", "--store", str(st.root))
    assert code == 0
    for text in (out, err, _plain_table_output(st)):
        plain = ANSI_SGR.sub("", text)
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", plain), repr(plain[:300])
    assert safe(HOSTILE) == "\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31mred\\x9b2J\\x0dover"
    # a file name is a string from the store too: its reason goes through the error console
    (st.runs / "\x1b[2Jevil.json").write_text("{}")
    code, out, err = invoke("results", "--store", str(st.root))
    assert code == 0 and "\\x1b[2Jevil.json" in err and "\x1b" not in err


def _plain_table_output(st: Store) -> str:
    """The plain columns `results` prints over RICH_TABLE_MAX_ROWS rows."""
    from dlbench.cli import results as results_module
    from dlbench.store.index import read_rows as rows_of

    return results_module._plain_table("t", rows_of(st).rows)


# ------------------------------------------------------------------ class 4: the store's directory

def test_check_writable_refuses_a_file_a_read_only_store_and_a_full_disk(tmp_path, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("not a store")
    with pytest.raises(StoreError, match="is not a directory"):
        Store(a_file).check_writable()
    st = Store(tmp_path / "store")
    st.check_writable()
    assert st.runs.is_dir() and list(st.runs.iterdir()) == [] and list(st.incoming.iterdir()) == []

    real_link = os.link

    def read_only(src, dst, *a, **kw):
        if str(dst).startswith(str(st.root)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))
        return real_link(src, dst, *a, **kw)

    monkeypatch.setattr(os, "link", read_only)
    with pytest.raises(StoreError, match="cannot write records .*Read-only file system"):
        st.check_writable()
    monkeypatch.setattr(os, "link", real_link)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(StoreError, match="only 0.0 MiB free"):
        st.check_writable()


def full_disk(monkeypatch, root: Path) -> None:
    """Every write into `root` fails with ENOSPC from now on (others, the spare store's, go on)."""
    real = Store.publish

    def publish(self, content, final):
        if Path(final).resolve().is_relative_to(root.resolve()):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(final))
        return real(self, content, final)

    monkeypatch.setattr(Store, "publish", publish)


def test_a_write_that_fails_keeps_the_record_where_a_merge_takes_it_back(tmp_path, monkeypatch):
    st = Store(tmp_path / "store")
    record = make_record()
    full_disk(monkeypatch, st.root)
    with pytest.raises(StoreWriteError) as info:
        st.write(record)
    kept = info.value.kept
    assert kept is not None and kept.is_relative_to(tmp_path / "cache" / "unsaved")
    assert f"the record is kept in {kept}" in str(info.value) and "No space left on device" in str(info.value)
    assert Store(kept.parent.parent).read(kept) == record
    monkeypatch.undo()
    merge(st, [kept.parent.parent])
    assert list(st.records()) == [record]


@pytest.mark.parametrize("store_kind", ["file", "read-only", "full"])
def test_run_checks_the_store_before_the_first_benchmark(project, tmp_path, monkeypatch, store_kind):
    from dlbench.execution import orchestrator

    store = tmp_path / "store"
    if store_kind == "file":
        store.write_text("")
    elif store_kind == "read-only":
        monkeypatch.setattr(Store, "_stage", lambda self, content, stem: (_ for _ in ()).throw(
            OSError(errno.EROFS, os.strerror(errno.EROFS), str(self.incoming))))
    else:
        usage = namedtuple("usage", "total used free")
        monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9, 0))
    ran = []
    monkeypatch.setattr(orchestrator.Orchestrator, "execute_one", lambda self, run: ran.append(run))
    code, _, err = invoke("run", "--no-check", "--suite", "fcn", "--framework", "fake", "--profile", "smoke", "--device", "cpu",
                          "--env", "current", "--store", str(store), "--benchmark", "fcn5-train", "--repeats", "1")
    assert code == 2 and ran == []
    assert err.startswith(f"error: store {store}: ") and "Traceback" not in err


def test_run_whose_store_fills_up_keeps_the_measurement_and_says_where(project, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.0005")
    store = tmp_path / "store"
    full_disk(monkeypatch, store)
    code, _, err = invoke("run", "--no-check", "--suite", "fcn", "--framework", "fake", "--profile", "smoke", "--device", "cpu",
                          "--env", "current", "--store", str(store), "--benchmark", "fcn5-train", "--repeats", "1",
                          "--threads", "1", "--no-telemetry")
    assert code == 1, err
    kept = re.search(r"the record is kept in (\S+\.json)", err)
    assert kept and "No space left on device" in err and "dlbench store merge" in err
    record = Store(Path(kept[1]).parent.parent).read(Path(kept[1]))
    assert record.benchmark == "fcn5-train" and record.status == "ok"


def test_the_report_does_not_reuse_the_page_of_a_record_flipped_behind_its_manifest(tmp_path):
    st, path, other = two_records(tmp_path)
    site = tmp_path / "site"
    assert invoke("report", "--store", str(st.root), "--out", str(site))[0] == 0
    before = path.stat()
    raw = path.read_bytes().replace(b'"batch_size": 16', b'"batch_size": 17')
    path.write_bytes(raw)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    code, out, err = invoke("report", "--store", str(st.root), "--out", str(site))
    assert code == 0 and "(1 runs" in out
    assert "checksum mismatch" in (site / "index.html").read_text()
    assert not (site / "runs" / f"{path.stem}.html").exists() and (site / "runs" / f"{other.stem}.html").exists()


# --- kernel records, checks and machine profiles on a full disk (issue 18, class 4) -------------

def _kept(err: str, what: str) -> Path:
    found = re.search(rf"the {what} is kept in (\S+\.json)", err)
    assert found and "No space left on device" in err and "dlbench store merge" in err, err
    assert "Traceback" not in err
    return Path(found[1])


def test_check_whose_store_is_full_keeps_the_check_and_says_where(project, tmp_path, monkeypatch):
    from dlbench.store import checks

    store = tmp_path / "store"
    real = checks._replace_file

    def replace_file(path, content):
        if Path(path).resolve().is_relative_to(store.resolve()):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, content)

    monkeypatch.setattr(checks, "_replace_file", replace_file)
    code, _, err = invoke("check", "--framework", "fake", "--network", "transformer_tiny", "--device", "cpu", "--env", "current",
                          "--store", str(store))
    assert code == 1
    kept = _kept(err, "check")
    assert json.loads(kept.read_text())["network"] == "transformer_tiny"
    monkeypatch.undo()
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    merge(Store(store), [kept.parent.parent])
    assert (store / "checks" / kept.name).read_bytes() == kept.read_bytes()


def test_kernels_suite_whose_store_is_full_keeps_the_kernel_record_and_says_where(project, tmp_path, monkeypatch):
    from dlbench.store.kernels import KernelStore

    store = tmp_path / "store"
    full_disk(monkeypatch, store)
    code, _, err = invoke("run", "--suite", "kernels", "--framework", "fake", "--profile", "smoke", "--device", "cpu",
                          "--env", "current", "--threads", "1", "--store", str(store), "--benchmark", "transpose")
    assert code == 1
    kept = _kept(err, "kernel record")
    monkeypatch.undo()
    merge(Store(store), [kept.parent.parent])
    (record,) = KernelStore(Store(store)).records()
    assert record.benchmark == "transpose" and store / "kernels" / kept.name == KernelStore(Store(store)).root / kept.name


def test_calibrate_whose_store_is_full_keeps_the_profile_and_says_where(project, tmp_path, monkeypatch):
    """The profile's write itself (ProfileStore.write on a full disk), then calibrate's ending with
    it: the measuring is replaced by a profile built at once (calibrate's own run is 15 s)."""
    from datetime import datetime, timezone

    from dlbench.cli import performance
    from dlbench.store.profiles import MachineProfile, MatmulCeiling, ProfileStore

    store = tmp_path / "store"
    profile = MachineProfile(machine_id="a" * 64, created_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
                             dlbench={"version": "test"}, machine={"hostname": "box", "machine_id": "a" * 64},
                             device="cpu", threads=1,
                             matmul_peak={"float32": MatmulCeiling(flops_per_s=1e9, framework="fake", kernel="k")})
    full_disk(monkeypatch, store / "machines")
    with pytest.raises(StoreWriteError) as info:
        ProfileStore(Store(store)).write(profile)
    kept = _kept(str(info.value), "machine profile")
    assert kept == info.value.kept and not list((store / "machines").rglob("*.json"))
    monkeypatch.setattr(performance, "workflows_calibrate",
                        lambda request, events: ProfileStore(Store(request.store)).write(profile))
    code, _, err = invoke("calibrate", "--framework", "fake", "--device", "cpu", "--env", "current",
                          "--store", str(store))
    assert code == 1 and err.startswith("error: cannot write ")
    again = _kept(err, "machine profile")
    assert again.parent.parent.parent == kept.parent.parent.parent  # one spare store per process: one merge
    monkeypatch.undo()
    merge(Store(store), [kept.parent.parent.parent])
    assert ProfileStore(Store(store)).latest("a" * 64).threads == 1
