"""Checksums: every record written carries one, every read verifies it; a damaged record (truncated,
a flipped digit, a missing checksum) is reported by name and skipped by readers, `dlbench results`
and `dlbench store verify`, and never crashes them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_store import make_record
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.store.record import SCHEMA_VERSION
from dlbench.store.store import CHECKSUM_PREFIX, Store, StoreError, canonical_json, checksum_of
from dlbench.store.verify import verify

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(ANSI.sub("", result.stderr).split())


def store_of(tmp_path: Path, n: int = 3) -> tuple[Store, list[Path]]:
    store = Store(tmp_path / "store")
    return store, [store.write(make_record(f"20260101T00000{i}Z-00000000000{i}", benchmark=f"b{i}")) for i in range(n)]


def flip_a_digit(path: Path, after: str = '"iter_s": [') -> tuple[int, str, str]:
    """Change one digit of a number after `after`, keeping the JSON valid: (offset, old, new)."""
    text = path.read_text()
    start = text.index(after) + len(after)
    offset = next(i for i in range(start, len(text)) if text[i].isdigit() and text[i] != "0")
    old = text[offset]
    new = "7" if old != "7" else "3"
    path.write_text(text[:offset] + new + text[offset + 1:])
    return offset, old, new


# --------------------------------------------------------------------------- what is written


def test_write_stamps_the_canonical_checksum(tmp_path):
    store, (path, *_) = store_of(tmp_path, 1)
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION >= 4
    assert data["checksum"].startswith(CHECKSUM_PREFIX) and len(data["checksum"]) == len(CHECKSUM_PREFIX) + 64
    body = {k: v for k, v in data.items() if k != "checksum"}
    import hashlib
    assert data["checksum"] == CHECKSUM_PREFIX + hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()
    stored = store.inspect(path)
    assert stored.verified and stored.written_version == SCHEMA_VERSION and stored.upgraded_from is None
    # the checksum belongs to the file: the record read back is the record written
    assert stored.record == make_record("20260101T000000Z-000000000000", benchmark="b0")


def test_checksum_survives_read_and_redump_in_another_layout(tmp_path):
    store, (path, *_) = store_of(tmp_path, 1)
    before = store.read(path)
    data = json.loads(path.read_text())
    # reordered keys, other indentation, escaped unicode: the same record, the same checksum
    path.write_text(json.dumps(dict(reversed(list(data.items()))), indent=4, ensure_ascii=True))
    assert store.inspect(path).verified
    assert store.read(path) == before


def test_canonical_form_is_stable_for_floats_and_unicode():
    data = {"b": [0.1, 1e-07, 12345678.9, 3.0], "a": "µs — ok", "c": {"z": None, "y": True}}
    again = json.loads(canonical_json(data))
    assert canonical_json(again) == canonical_json(data)
    assert checksum_of({**data, "checksum": "sha256:whatever"}) == checksum_of(data)


# --------------------------------------------------------------------------- damage


def test_a_flipped_digit_is_caught_by_the_checksum(tmp_path):
    store, paths = store_of(tmp_path)
    damaged = paths[1]
    flip_a_digit(damaged)
    json.loads(damaged.read_text())  # still valid JSON, still a valid record: only the checksum can tell
    with pytest.raises(StoreError) as info:
        store.read(damaged)
    assert str(damaged) in str(info.value) and "checksum mismatch" in str(info.value)
    problems = []
    assert [r.benchmark for r in store.records(problems)] == ["b0", "b2"]
    assert [p.path for p in problems] == [damaged] and "checksum mismatch" in problems[0].reason


@pytest.mark.parametrize("field, old, new", [("schema_version", str(SCHEMA_VERSION), "3"), ("batch_size", "16", "18"),
                                              ("params", "1000", "1009")])
def test_a_flipped_digit_anywhere_is_caught(tmp_path, field, old, new):
    store, (path, *_) = store_of(tmp_path, 1)
    text = path.read_text()
    needle = f'"{field}": {old}'
    assert text.count(needle) == 1
    path.write_text(text.replace(needle, f'"{field}": {new}'))
    # even a version flipped to one from before checksums: a checksum present is always verified
    with pytest.raises(StoreError, match="checksum mismatch"):
        store.read(path)


def test_a_truncated_record_is_reported_and_skipped(tmp_path):
    store, paths = store_of(tmp_path)
    raw = paths[0].read_bytes()
    paths[0].write_bytes(raw[: len(raw) // 2])
    problems = []
    assert [r.benchmark for r in store.records(problems)] == ["b1", "b2"]
    assert [p.path for p in problems] == [paths[0]]
    assert str(paths[0]) in problems[0].reason and "unreadable" in problems[0].reason


def test_a_current_record_without_its_checksum_is_a_problem(tmp_path):
    store, (path, *_) = store_of(tmp_path, 1)
    data = json.loads(path.read_text())
    del data["checksum"]
    path.write_text(json.dumps(data))
    with pytest.raises(StoreError, match="checksum: missing"):
        store.read(path)


@pytest.mark.parametrize("value", [12, "md5:abc", ["sha256:00"]])
def test_a_checksum_of_another_form_is_a_problem(tmp_path, value):
    store, (path, *_) = store_of(tmp_path, 1)
    data = json.loads(path.read_text())
    data["checksum"] = value
    path.write_text(json.dumps(data))
    with pytest.raises(StoreError, match="checksum: not a sha256"):
        store.read(path)


def test_an_old_record_without_a_checksum_reads_as_unverified(tmp_path):
    store, (path, *_) = store_of(tmp_path, 1)
    data = json.loads(path.read_text())
    del data["checksum"]
    data["schema_version"] = 3
    path.write_text(json.dumps(data))
    stored = store.inspect(path)
    assert not stored.verified and stored.written_version == 3
    assert stored.record.schema_version == SCHEMA_VERSION


# --------------------------------------------------------------------------- store verify


def test_store_verify_lists_every_problem_by_name(tmp_path):
    store, paths = store_of(tmp_path, 5)
    flip_a_digit(paths[0])
    raw = paths[1].read_bytes()
    paths[1].write_bytes(raw[:100])
    renamed = store.runs / "20260101T000009Z-00000000000f.json"
    paths[2].rename(renamed)
    old = json.loads(paths[3].read_text())
    del old["checksum"]
    old["schema_version"] = 2
    paths[3].write_text(json.dumps(old))
    store.checks.mkdir()
    (store.checks / "fcn5--fake--0.0.json").write_text(json.dumps({"status": "equivalent"}))
    (store.checks / "fcn8--fake--0.0.json").write_text('{"status": "equiv')
    report = verify(store)
    assert [p for p in report.verified] == [paths[4]]
    assert report.unverified == [(paths[3], 2)]
    assert {p.path for p in report.problems} == {paths[0], paths[1], renamed, store.checks / "fcn8--fake--0.0.json"}
    assert report.checks == 1
    by_path = {p.path: p.reason for p in report.problems}
    assert "checksum mismatch" in by_path[paths[0]] and "does not match the file name" in by_path[renamed]

    code, out, err = invoke("store", "verify", "--store", str(store.root))
    assert code == 1
    flat = " ".join(out.split())
    for path in (paths[0], paths[1], renamed):
        assert path.name in flat
    assert "5 records: 1 verified by checksum, 1 unverified" in flat and "schema 2: 1" in flat
    assert "4 problems" in flat and "damaged" in err


def test_store_verify_of_a_sound_store_exits_0(tmp_path):
    store, _ = store_of(tmp_path, 2)
    code, out, _ = invoke("store", "verify", "--store", str(store.root))
    assert code == 0
    assert "2 records: 2 verified by checksum, 0 unverified" in " ".join(out.split())


def test_store_verify_of_no_store_is_an_input_error(tmp_path):
    code, _, err = invoke("store", "verify", "--store", str(tmp_path / "nowhere"))
    assert code == 2 and "no store at" in err


def test_store_verify_mentions_leftover_temporary_files(tmp_path):
    store, _ = store_of(tmp_path, 1)
    (store.incoming / "20260101T000000Z-aaaaaaaaaaaa.0011aabb.999999999.otherhost.tmp").write_text("{")
    code, out, _ = invoke("store", "verify", "--store", str(store.root))
    assert code == 0
    assert "1 temporary files" in " ".join(out.split())


# --------------------------------------------------------------------------- dlbench results


def test_results_reports_damaged_records_by_name_and_shows_the_rest(tmp_path):
    store, paths = store_of(tmp_path, 4)
    flip_a_digit(paths[1])
    raw = paths[2].read_bytes()
    paths[2].write_bytes(raw[: len(raw) - 40])
    code, out, err = invoke("results", "--store", str(store.root), "--format", "json")
    assert code == 0
    assert sorted(row["benchmark"] for row in json.loads(out)) == ["b0", "b3"]
    assert paths[1].name in err and "checksum mismatch" in err
    assert paths[2].name in err


@pytest.mark.parametrize("content", [b"", b"\xff\xfe\x00", b"[" * 100_000 + b"]" * 100_000, b"[1, 2]",
                                     b'{"schema_version": 4, "x": "\\ud800", "checksum": "sha256:00"}'])
def test_no_file_content_crashes_a_reader(tmp_path, content):
    store, paths = store_of(tmp_path, 2)
    bad = store.runs / "20260101T000005Z-000000000005.json"
    bad.write_bytes(content)
    problems = []
    assert len(list(store.records(problems))) == 2
    assert [p.path for p in problems] == [bad] and str(bad) in problems[0].reason


# --------------------------------------------------------------------------- the fast way to verify

TRICKY_FLOATS = [1e-05, -1.5e-05, 1e-09, 3.14159e-07, 1e16, 1.7976931348623157e308, 5e-324, 0.0001, 1e15,
                 123456789012345678.0, -0.0, 0.0, 2.5, 0.1 + 0.2, 12.000015]
TRICKY_STRINGS = ["0.00001", "x:0.00001,", "1e-9]", '", 1e-9, "', '\\", 1e-05, "', "\\\\", 'a"b', "é ∑ 😀",
                  "line\nnext\t", "\x7f\x01", 'c:\\path\\0.00001", 1e-9', ""]


def fast_and_defining(data) -> tuple[bytes | None, bytes]:
    from dlbench.store.store import _canonical_fast
    return _canonical_fast(data), canonical_json(data)


def test_the_fast_canonical_form_is_the_defining_one_for_tricky_values():
    data = {"floats": TRICKY_FLOATS, "strings": TRICKY_STRINGS,
            "mixed": [[s, f] for s, f in zip(TRICKY_STRINGS, TRICKY_FLOATS)],
            **{f"key {s}": f for s, f in zip(TRICKY_STRINGS, TRICKY_FLOATS)},
            "nested": {"eps": 1e-05, "deeper": [{"p": 1.2e-10, "note": "p=1.2e-10"}]}, "int": 10**18, "none": None,
            "bools": [True, False]}
    fast, defining = fast_and_defining(data)
    assert fast == defining


def test_the_fast_canonical_form_is_exact_or_absent_on_random_data():
    import random
    rng = random.Random(4)

    def value(depth=0):
        kind = rng.random()
        if depth < 3 and kind < 0.15:
            return {rng.choice(TRICKY_STRINGS) + str(i): value(depth + 1) for i in range(rng.randint(0, 4))}
        if depth < 3 and kind < 0.3:
            return [value(depth + 1) for _ in range(rng.randint(0, 5))]
        if kind < 0.6:
            return rng.choice([rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30), rng.choice(TRICKY_FLOATS)])
        if kind < 0.7:
            return rng.randint(-10**6, 10**6)
        return rng.choice(TRICKY_STRINGS) + rng.choice(["", " 1e-07", ' "0.00003",', "\\"])

    for _ in range(300):
        data = {"v": value()}
        fast, defining = fast_and_defining(data)
        assert fast == defining
    # what orjson cannot write is left to the defining way
    assert fast_and_defining({"big": 10**30})[0] is None
    assert fast_and_defining({"lone": "\ud800"})[0] is None


def test_an_intact_record_is_verified_without_the_slow_way(tmp_path, monkeypatch):
    """Numbers in exponent notation in the record and in its strings (the network definition's eps,
    a p-value, a reason quoting one) still verify the fast way; the defining way is not needed."""
    record = make_record("20260101T000000Z-000000000000").model_copy(update={
        "reason": 'eps "1e-05", p 1.2e-10', "network": make_record().network.model_copy(
            update={"definition": {"name": "fcn5", "layers": [{"type": "batchnorm", "eps": 1e-05}],
                                   "note": "eps: 0.00001, \\ \"quoted\" 1e-9"}})})
    store = Store(tmp_path / "store")
    path = store.write(record)
    import dlbench.store.document as document  # where every checksummed file is read (one reader)
    monkeypatch.setattr(document, "checksum_of", lambda data: pytest.fail("took the slow way"))
    stored = store.inspect(path)
    assert stored.verified and stored.record == record


@pytest.mark.parametrize("edit", [
    lambda t: t.replace('"eps": 0.00001', '"eps": 0.00002'),  # a float orjson writes otherwise than json
    lambda t: t.replace("1.2e-10", "1.3e-10"),  # inside a string, in exponent notation
    lambda t: t.replace('"eps": 0.00001', '"eps": 1e-05'),  # the same value, other notation: not damage
], ids=["float", "string", "same value"])
def test_edits_near_the_rewritten_numbers(tmp_path, edit):
    record = make_record("20260101T000000Z-000000000000").model_copy(update={
        "reason": "p 1.2e-10", "network": make_record().network.model_copy(
            update={"definition": {"name": "fcn5", "layers": [{"eps": 1e-05}]}})})
    store = Store(tmp_path / "store")
    path = store.write(record)
    text = path.read_text()
    edited = edit(text)
    assert edited != text
    path.write_text(edited)
    same_value = json.loads(edited) == json.loads(text)
    if same_value:  # the canonical form is of the values, not of how the file spells them
        assert store.inspect(path).record == record
    else:
        with pytest.raises(StoreError, match="checksum mismatch"):
            store.inspect(path)
