"""store/document.py: every kind of file the store keeps is read one way, and fails one way: an
error of the kind's own class naming the file and what is wrong (run records, kernel records,
machine profiles, equivalence checks)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from dlbench.store import document
from dlbench.store.checks import CHECK_FILE, check_file_problem
from dlbench.store.document import StoreError, checksum_of, checksummed_file
from dlbench.store.kernels import KERNEL_RECORD_FILE
from dlbench.store.profiles import PROFILE_FILE, MachineProfile, ProfileError, ProfileStore, profile_file
from dlbench.store.store import RECORD_FILE, SCHEMA_VERSION, Store

from store_records import make_record

KINDS = [(RECORD_FILE, StoreError, "schema_version", SCHEMA_VERSION),
         (KERNEL_RECORD_FILE, ValueError, "format", 1),
         (PROFILE_FILE, ProfileError, "format", 3)]


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("kind,error,field,newest", KINDS, ids=lambda k: getattr(k, "noun", None))
def test_each_kind_names_the_file_and_the_fault(tmp_path, kind, error, field, newest):
    good = {field: newest, "x": 1.5e-05}
    signed = {**good, "checksum": checksum_of(good)}
    assert kind.read(write(tmp_path / "good.json", signed)).verified
    faults = {
        "truncated": (json.dumps(signed)[:-3], f"unreadable {kind.noun}"),
        "a list": ("[1, 2]", rf"not a {kind.noun} \(not a JSON object\)"),
        "edited": (json.dumps({**signed, "x": 2.5}), "checksum mismatch: the file changed after it was written"),
        "unsigned": (json.dumps(good), "checksum: missing"),
        "odd checksum": (json.dumps({**good, "checksum": 12}), "checksum: not a sha256:<hex> value"),
        "no version": (json.dumps({"x": 1}), f"{field}: missing or invalid"),
        "newer": (json.dumps({**good, field: newest + 1}), f"{field} {newest + 1}; this dlbench reads .* newer"),
    }
    for name, (text, message) in faults.items():
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        with pytest.raises(error, match=message) as info:
            kind.read(path)
        assert str(info.value).startswith(f"{path}: "), name


def test_a_fifo_is_refused_by_every_kind_without_being_opened(tmp_path):
    import os
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for kind, error, _, _ in KINDS:
        with pytest.raises(error, match="not a regular file"):
            kind.read(fifo)
    assert "not a regular file" in check_file_problem(fifo)


def test_a_record_from_before_checksums_reads_as_unverified_and_a_later_one_must_have_one(tmp_path):
    old = RECORD_FILE.read(write(tmp_path / "old.json", {"schema_version": 3}))
    assert old.version == 3 and not old.verified
    with pytest.raises(StoreError, match=r"checksum: missing \(every record of schema_version 4 or later has one\)"):
        RECORD_FILE.read(write(tmp_path / "new.json", {"schema_version": 4}))


def test_a_check_file_carries_no_checksum_and_its_checksum_field_is_plain_data(tmp_path):
    doc = CHECK_FILE.read(write(tmp_path / "c.json", {"status": "equivalent", "checksum": "anything"}))
    assert doc.data["checksum"] == "anything" and not doc.verified and doc.version is None


def test_validation_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "p.json"
    with pytest.raises(ProfileError, match=rf"^{path}: device: Field required$"):
        PROFILE_FILE.validate(MachineProfile, {"machine_id": "m", "created_at": "2026-12-01T00:00:00Z",
                                               "dlbench": {}, "machine": {}, "threads": 1}, path)


def test_an_intact_document_is_verified_the_fast_way(tmp_path, monkeypatch):
    """The defining (json module) way is only taken where orjson cannot prove the checksum."""
    record = make_record()
    path = Store(tmp_path / "store").write(record)
    monkeypatch.setattr(document, "checksum_of", lambda data: pytest.fail("took the slow way"))
    stored = Store(tmp_path / "store").inspect(path)
    assert stored.verified and stored.record == record


def test_the_files_are_written_as_before(tmp_path):
    """The on-disk form is unchanged: the data, then its checksum, indented by one, a newline (the
    profile's keys sorted)."""
    data = {"b": 1, "a": [1e-05, "é"]}
    assert checksummed_file(data) == json.dumps({**data, "checksum": checksum_of(data)}, indent=1).encode() + b"\n"
    profile = MachineProfile(machine_id="a" * 64, created_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
                             dlbench={}, machine={}, device="cpu", threads=1)
    stored = ProfileStore(Store(tmp_path)).write(profile)
    written = ProfileStore(Store(tmp_path)).path(profile.machine_id, stored.revision).read_bytes()
    body = json.loads(stored.model_dump_json())
    assert written == profile_file(stored) == json.dumps({**body, "checksum": checksum_of(body)}, indent=1,
                                                         sort_keys=True).encode() + b"\n"

