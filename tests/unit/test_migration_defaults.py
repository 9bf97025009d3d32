"""The schema versions that only added optional fields (migrations.MODEL_DEFAULTS_SUFFICE) have no
migration of their own: a record of the version before reads through the model's defaults."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from dlbench.store import migrations
from dlbench.store.record import SCHEMA_VERSION, Record

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def fixture(version: int) -> dict:
    data = json.loads((FIXTURES / f"v{version}.json").read_text())
    data.pop("checksum", None)
    data.pop("upgraded_from", None)
    return data


def newest_before(version: int) -> int:
    """The newest fixture older than `version` (15 is the containers branch's: it brings its own)."""
    return max(v for v in range(1, version) if (FIXTURES / f"v{v}.json").exists())


@pytest.mark.parametrize("version", migrations.MODEL_DEFAULTS_SUFFICE)
def test_a_version_only_step_changes_nothing_but_the_version(version):
    before = migrations.upgrade(fixture(newest_before(version)), version - 1)
    after = migrations.upgrade(copy.deepcopy(before), version)
    assert after == {**before, "schema_version": version}


@pytest.mark.parametrize("version", migrations.MODEL_DEFAULTS_SUFFICE)
def test_a_record_of_the_version_before_reads_at_the_current_schema(version):
    assert Record.model_validate(migrations.upgrade(fixture(newest_before(version)), SCHEMA_VERSION)).schema_version \
        == SCHEMA_VERSION


def test_every_version_has_a_step_and_the_real_ones_are_functions_of_their_own():
    assert sorted(migrations.STEPS) == list(range(2, SCHEMA_VERSION + 1))
    own = {v for v, step in migrations.STEPS.items() if step.__name__ == f"update_to_{v}"}
    assert own | set(migrations.MODEL_DEFAULTS_SUFFICE) == set(migrations.STEPS)
    assert not own & set(migrations.MODEL_DEFAULTS_SUFFICE)
