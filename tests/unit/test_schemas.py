"""The JSON Schemas under schemas/ (`dlbench schema export`): made from the models, so they cannot
drift from them; every YAML file under suites/ names its schema on its first line for an editor, and
validates against it; the loaders take that line (a YAML comment)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pydantic
import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.cli.schema import KINDS, SUITE_SCHEMAS, file_name, model_of, schema_of, schema_text
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.loader import read_yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
SUITES = ROOT / "suites"
YAML_FILES = sorted(SUITES.rglob("*.yaml"))
HINT = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def schema_kind(path: Path) -> str:
    """Which schema describes a file under suites/, from where it lies and (a suite) its `kind`."""
    if path.parent.name == "networks":
        return "network"
    if path.parent.name == "machines":
        return "efficiency" if path.stem == "efficiency" else "machine"
    if path.stem == "profiles":
        return "profiles"
    if path.parent.name in ("clusters", "traces"):
        return path.parent.name[:-1]
    return SUITE_SCHEMAS[SuiteCatalog(SUITES).suite_kind(path)]


def validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / file_name(kind)).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("kind", KINDS)
def test_the_committed_schema_is_the_models(kind):
    committed = (SCHEMAS / file_name(kind)).read_text()
    assert committed == schema_text(kind), (f"schemas/{file_name(kind)} differs from dlbench's models: "
                                            "run `dlbench schema export schemas` and commit the result")


def test_schemas_holds_one_file_per_kind_and_nothing_else():
    assert sorted(p.name for p in SCHEMAS.iterdir()) == sorted(map(file_name, KINDS))


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(SUITES)))
def test_each_yaml_file_names_its_schema_first_and_validates_against_it(path):
    first = path.read_text().splitlines()[0]
    hint = HINT.match(first)
    assert hint, f"{path}: first line {first!r} is not a yaml-language-server $schema hint"
    named = (path.parent / hint[1]).resolve()
    assert named == SCHEMAS / file_name(schema_kind(path)) and named.is_file()
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(schema_kind(path)).iter_errors(
        read_yaml(path))]  # read as the loaders read it: the hint is a comment to them
    assert errors == []


@pytest.mark.parametrize("kind,path,edit,where", [
    ("network", "networks/alexnet.yaml", lambda d: d["layers"][0].update(filter=3), "layers/0"),
    ("network", "networks/alexnet.yaml", lambda d: d["layers"][0].update(type="conv3d"), "layers/0"),
    ("network", "networks/resnet56.yaml", lambda d: d["layers"][0].update(kernel=[3, 3, 3]), "layers/0"),
    ("suite", "cnn.yaml", lambda d: d.pop("benchmarks"), ""),
    ("profiles", "profiles.yaml", lambda d: d.update(quick=d["smoke"]), ""),
    ("machine", "machines/h100.yaml", lambda d: d.update(vendor=3), "vendor"),
])
def test_a_file_the_models_refuse_the_schema_refuses_too(kind, path, edit, where):
    data = copy.deepcopy(read_yaml(SUITES / path))
    assert not list(validator(kind).iter_errors(data))
    edit(data)
    with pytest.raises(pydantic.ValidationError):
        model_of(kind).model_validate(data)
    errors = list(validator(kind).iter_errors(data))
    assert errors and any("/".join(map(str, e.absolute_path)) == where for e in errors)


def test_a_record_file_validates_with_its_checksum(tmp_path):
    from dlbench.store.store import Store

    from store_records import make_record

    path = Store(tmp_path).write(make_record())
    data = json.loads(path.read_text())
    assert list(validator("record").iter_errors(data)) == []
    assert list(validator("record").iter_errors({**data, "checksum": "md5:0"}))


def test_the_network_schema_follows_the_layer_table():
    """A plug-in layer type registered at run time is in the schema made then (and out again after)."""
    from typing import Literal

    from dlbench.definitions import layers
    from dlbench.definitions.layers import Inferred, LayerType
    from dlbench.definitions.schema import Strict

    class Twice(Strict):
        type: Literal["twice"]

    toy = LayerType(Twice, lambda layer, site: Inferred(site.shape), lambda *a: None, rounding_depth=0, decisions=0)
    with layers.registered(toy):
        assert "twice" in json.dumps(schema_of("network"))
    assert "twice" not in json.dumps(schema_of("network"))


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, " ".join(ANSI.sub("", result.stderr).split())


def test_schema_export_writes_the_committed_files(tmp_path):
    code, out, _ = invoke("schema", "export", str(tmp_path / "out"))
    assert code == 0 and f"{len(KINDS)} schemas in" in " ".join(out.split())
    for kind in KINDS:
        assert (tmp_path / "out" / file_name(kind)).read_text() == (SCHEMAS / file_name(kind)).read_text()


def test_schema_show_prints_one_and_refuses_an_unknown_kind(tmp_path):
    code, out, _ = invoke("schema", "show", "network")
    assert code == 0 and out == (SCHEMAS / "network.schema.json").read_text()
    code, _, err = invoke("schema", "show", "networks")
    assert code == 2 and "unknown schema 'networks'; expected one of suite, " in err
    (tmp_path / "file").write_text("")
    code, _, err = invoke("schema", "export", str(tmp_path / "file"))
    assert code == 2 and "not a directory" in err
