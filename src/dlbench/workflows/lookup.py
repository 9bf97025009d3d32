"""What the workflows look up by name: the suites (one catalog per request), the runners, the
device, the results store; an unknown or invalid name is one RequestError listing the valid ones."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Sequence

from .. import paths
from ..axes import Compression
from ..definitions.catalog import SuiteCatalog
from ..definitions.loader import DefinitionError
from ..definitions.suite import PROFILES
from ..execution.backends import BACKENDS
from ..execution.registry import RunnerInfo, RunnerRegistry
from ..machine import detect_device
from ..store.store import Store, StoreError
from .requests import RequestError, RunRequest

DEVICES = ("auto", "cpu", "cuda")


def check_choice(kind: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise RequestError(f"unknown {kind} {value!r}; valid {kind}s: {', '.join(map(str, choices))}")


def listed_choices(kind: str, given: list[str] | None, valid: Sequence[str]) -> list[str] | None:
    """A list option's values (repeatable, comma lists, 'all' = every valid one), checked and
    deduplicated in order, as plain names; None where the option was not given."""
    if not given:
        return None
    valid = [str(v) for v in valid]  # an axis's members as their plain names
    names = [n.strip() for item in given for n in item.split(",") if n.strip()]
    for n in names:
        check_choice(kind, n, [*valid, "all"])
    return list(dict.fromkeys(valid if "all" in names else names))


def listed_compressions(given: list[str] | None) -> list[str] | None:
    """`--compression`'s values (repeatable, comma lists, 'all' = Compression.every()), each
    parsed (method and parameter) and deduplicated in order, as their spellings; None where the
    option was not given. A value that does not parse is one RequestError naming the option."""
    if not given:
        return None
    texts = [t.strip() for item in given for t in item.split(",") if t.strip()]
    chosen: list[str] = []
    for text in texts:
        try:
            values = Compression.every() if text == "all" else (Compression.parse(text, who="--compression"),)
        except ValueError as e:
            raise RequestError(str(e)) from None
        chosen += [v.value for v in values]
    return list(dict.fromkeys(chosen))


def catalog() -> SuiteCatalog:
    return SuiteCatalog(paths.suites_dir())


def registry() -> RunnerRegistry:
    return RunnerRegistry(paths.runners_dir())


def runner(registry: RunnerRegistry, name: str) -> RunnerInfo:
    try:
        return registry.get(name)
    except DefinitionError as e:
        raise RequestError(str(e)) from None


def framework_names(registry: RunnerRegistry, given: list[str]) -> list[str]:
    """Framework names, comma lists, or 'all' (the runners that exist), deduplicated."""
    names = listed_choices("framework", given, registry.names())
    if not names:
        raise RequestError(f"no framework given; valid frameworks: {', '.join(registry.names() + ['all'])}")
    return names


def resolved_device(device: str) -> str:
    """`auto`: cuda where this machine has a usable GPU, else cpu."""
    check_choice("device", device, DEVICES)
    return detect_device() if device == "auto" else device


def runs_on(request: RunRequest) -> tuple[RunnerRegistry, list[str]]:
    """The names every suite kind checks first, in this order: the profile, the environment backend
    and the frameworks (the registry and the frameworks' names, deduplicated)."""
    check_choice("profile", request.profile, list(PROFILES))
    check_choice("environment backend", request.env, list(BACKENDS))
    found = registry()
    return found, framework_names(found, request.framework)


def open_store(store: Path | None) -> Store:
    """`store`, else $DLBENCH_STORE, else ./results."""
    return Store(store or paths.default_store())


def existing_store(store: Path | None, makes_records: str = "dlbench run --suite fcn --profile smoke") -> Store:
    """The store of a workflow that only reads it (results, report, compare, history, kernels,
    predict's accuracy): a folder that is not there is a mistyped store, or a machine that has run
    nothing yet, not a store without runs; one RequestError that says how to make one (the command
    `makes_records`). An existing folder without records is an empty store and reads as one."""
    st = open_store(store)
    if not st.root.is_dir():
        given = ("--store" if store is not None else
                 "$DLBENCH_STORE" if os.environ.get("DLBENCH_STORE") else "the default, ./results")
        what = "a file, not a folder" if st.root.exists() else "nothing there"
        run = makes_records + (f" --store {shlex.quote(str(store))}" if store else "")
        raise RequestError(f"no store at {st.root} ({given}: {what}); make one with `{run}`, or point --store or "
                           "$DLBENCH_STORE at an existing store")
    return st


def writable_store(store: Path | None) -> Store:
    """The store a run writes to, checked before its first benchmark (Store.check_writable: a
    directory, writable, with room for a record)."""
    st = open_store(store)
    try:
        st.check_writable()
    except StoreError as e:
        raise RequestError(str(e)) from None
    return st


def suite_kind(suites: SuiteCatalog, path: Path) -> str:
    try:
        return suites.suite_kind(path)
    except DefinitionError as e:
        raise RequestError(str(e)) from None


def load_suites(suites: SuiteCatalog, suite: str, profile: str, device: str,
                modes: tuple[str, ...] | None = None) -> list:
    """A suite by name or path, or 'all' (every single-process suite shipped in suites/)."""
    out = []
    for name in suites.suite_names() if suite == "all" else [suite]:
        path = suites.suite_path(name)
        if path is None:
            raise RequestError(f"unknown suite {name!r}; valid suites: {', '.join(suites.suite_names() + ['all'])} "
                               "(or a path to a .yaml file)")
        try:
            out.append(suites.load_suite(path, profile, device, modes))
        except DefinitionError as e:
            raise RequestError(str(e)) from None
    return out


def refresh_index(st: Store) -> None:
    """Bring the row index up to date after writing records, so that the next `results` reads it
    instead of parsing the new records (or, in a store without an index yet, all of them). The
    index is a cache: failing to update it here loses nothing, the next read rebuilds it."""
    from ..store.index import read_rows

    try:
        read_rows(st)
    except Exception:  # noqa: BLE001 - a cache update must never fail the workflow that wrote the records
        pass
