"""`dlbench schema export DIR | show KIND`: JSON Schemas of the files dlbench reads, made from the
pydantic models that validate them (`model_json_schema`), so that an editor can check a suite,
network, machine or profiles file as it is typed and other tools can read a run record.

The repository keeps a copy under schemas/ (what each YAML file under suites/ names on its first
line, `# yaml-language-server: $schema=...`); a unit test fails when that copy differs from the
models, so `dlbench schema export schemas` is part of changing one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from .console import fail, out

schema_app = typer.Typer(help="JSON Schemas of suite, network, machine, profiles and record files.",
                         no_args_is_help=True)

DIALECT = "https://json-schema.org/draft/2020-12/schema"


# kind -> what it describes (model_of: the model that validates it)
KINDS: dict[str, str] = {
    "suite": "a suite of single-process benchmarks (suites/*.yaml without `kind`)",
    "distributed-suite": "a suite of `kind: distributed`",
    "comm-suite": "a suite of `kind: comm`",
    "convergence-suite": "a suite of `kind: convergence`",
    "kernels-suite": "a suite of `kind: kernels`",
    "network": "a network description (suites/networks/*.yaml)",
    "machine": "a datasheet machine (suites/machines/*.yaml)",
    "efficiency": "the datasheet efficiencies (suites/machines/efficiency.yaml)",
    "profiles": "the measurement profiles (suites/profiles.yaml)",
    "record": "a run record file (STORE/runs/<run_id>.json)",
    "cluster": "a cluster file of `dlbench plan` (suites/clusters/*.yaml)",
    "trace": "a job trace of `dlbench plan` (suites/traces/*.yaml)",
}


def model_of(kind: str) -> type[BaseModel]:
    """The model that validates files of `kind`; imported when asked for (`dlbench --help` need not
    load them all)."""
    from ..definitions import layers
    from ..definitions.convergence import ConvergenceSuiteFile
    from ..definitions.distributed import CommSuiteFile, DistributedSuiteFile
    from ..definitions.machines import EfficiencyFile, MachineSheet
    from ..definitions.suite import ProfilesFile, SuiteFile
    from ..performance.kernel_suite import KernelSuiteFile
    from ..planning.cluster import ClusterFile
    from ..planning.trace import TraceFile
    from ..store.record import Record

    models = {"suite": SuiteFile, "distributed-suite": DistributedSuiteFile, "comm-suite": CommSuiteFile,
              "convergence-suite": ConvergenceSuiteFile, "kernels-suite": KernelSuiteFile,
              # over the layer table as it is: the built-in types, and any plug-in registered
              "network": layers.network_model(),
              "machine": MachineSheet, "efficiency": EfficiencyFile, "profiles": ProfilesFile, "record": Record,
              "cluster": ClusterFile, "trace": TraceFile}
    assert set(models) == set(KINDS)
    return models[kind]


# A suite file's `kind` (definitions/catalog.py SUITE_KINDS) -> the schema that describes it.
SUITE_SCHEMAS = {"benchmark": "suite", "distributed": "distributed-suite", "comm": "comm-suite",
                 "convergence": "convergence-suite", "kernels": "kernels-suite"}


def file_name(kind: str) -> str:
    return f"{kind}.schema.json"


def schema_of(kind: str) -> dict[str, Any]:
    """The JSON Schema of `kind` (a key of KINDS)."""
    body = model_of(kind).model_json_schema()
    if kind == "record":
        body = _with_file_fields(body)
    return {"$schema": DIALECT, "$comment": f"{KINDS[kind]}; made by `dlbench schema export` from dlbench's models",
            **body}


def _with_file_fields(schema: dict[str, Any]) -> dict[str, Any]:
    """A record file holds the record and the fields of the file itself (store/store.py FILE_FIELDS),
    which Record leaves out."""
    from ..store.store import CHECKSUM_PREFIX, FILE_FIELDS

    file_fields = {
        "checksum": {"type": "string", "pattern": f"^{CHECKSUM_PREFIX}[0-9a-f]{{64}}$",
                     "description": "SHA-256 of the canonical JSON of everything else in the file (schema 4 on)"},
        "upgraded_from": {"type": "object", "description": "what `dlbench store upgrade` rewrote this file from"},
    }
    assert set(file_fields) == set(FILE_FIELDS), "a field of record files is missing from their schema"
    return {**schema, "properties": {**schema["properties"], **file_fields}}


def schema_text(kind: str) -> str:
    return json.dumps(schema_of(kind), indent=2, ensure_ascii=False) + "\n"


def _known(kind: str) -> str:
    if kind not in KINDS:
        raise fail(f"unknown schema {kind!r}; expected one of {', '.join(KINDS)}")
    return kind


@schema_app.command("export")
def export(directory: Annotated[Path, typer.Argument(help="Where to write one <kind>.schema.json per kind.")]) -> None:
    """Write the JSON Schema of every kind of file into DIRECTORY (made if missing)."""
    if directory.exists() and not directory.is_dir():
        raise fail(f"{directory}: not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for kind in KINDS:
            (directory / file_name(kind)).write_text(schema_text(kind), encoding="utf-8")
    except OSError as e:
        raise fail(f"cannot write schemas into {directory}: {e.strerror or e}", 1) from None
    out.print(f"{len(KINDS)} schemas in {directory}: {', '.join(map(file_name, KINDS))}", highlight=False,
              soft_wrap=True)


@schema_app.command("show")
def show(kind: Annotated[str, typer.Argument(help=f"One of: {', '.join(KINDS)}.")]) -> None:
    """Print the JSON Schema of one kind of file."""
    typer.echo(schema_text(_known(kind)), nl=False)
