"""What the commands look up by name: the suites (catalog), the runners (registry), the results
store; each unknown or invalid name is an error that exits 2 with the valid ones."""

from __future__ import annotations

import functools
import os
import shlex
from pathlib import Path

from .. import paths
from ..definitions.catalog import SuiteCatalog
from ..definitions.loader import DefinitionError
from ..execution.registry import RunnerRegistry
from ..store.store import Store, StoreError, StoreWriteError
from .console import fail
from .options import listed_choices


def open_store(store: Path | None) -> Store:
    """`--store`, else $DLBENCH_STORE, else ./results."""
    return Store(store or paths.default_store())


def existing_store(store: Path | None, makes_records: str = "dlbench run --suite fcn --profile smoke") -> Store:
    """The store of a command that only reads it (results, report, compare, history, kernels,
    predict --accuracy): a folder that is not there is a mistyped --store, or a machine that has
    run nothing yet, not a store without runs; one error that says how to make one (the command
    `makes_records`), exit 2. An existing folder without records is an empty store and reads as one."""
    st = open_store(store)
    if not st.root.is_dir():
        given = ("--store" if store is not None else
                 "$DLBENCH_STORE" if os.environ.get("DLBENCH_STORE") else "the default, ./results")
        what = "a file, not a folder" if st.root.exists() else "nothing there"
        run = makes_records + (f" --store {shlex.quote(str(store))}" if store else "")
        raise fail(f"no store at {st.root} ({given}: {what}); make one with `{run}`, or point --store or "
                   "$DLBENCH_STORE at an existing store")
    return st


def writable_store(store: Path | None) -> Store:
    """The store of `dlbench run`, checked before its first benchmark (Store.check_writable: a
    directory, writable, with room for a record): otherwise one error and exit 2, nothing run."""
    st = open_store(store)
    try:
        st.check_writable()
    except StoreError as e:
        raise fail(str(e)) from None
    return st


def reports_unsaved_records(command):
    """A record the store refused after the run began (a full disk, a mount gone read-only): the
    store kept it elsewhere (Store.keep_elsewhere) and the command ends with that one error, which
    says where and how to merge it back, exit 1; the records written before it are in the store."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except StoreWriteError as e:
            raise fail(str(e), 1) from None

    return wrapper


def refresh_index(st: Store) -> None:
    """Bring the row index up to date after writing records, so that the next `results` reads it
    instead of parsing the new records (or, in a store without an index yet, all of them). The
    index is a cache: failing to update it here loses nothing, the next read rebuilds it."""
    from ..store.index import read_rows

    try:
        read_rows(st)
    except Exception:  # noqa: BLE001 - a cache update must never fail the command that wrote the records
        pass


def catalog() -> SuiteCatalog:
    return SuiteCatalog(paths.suites_dir())


def registry() -> RunnerRegistry:
    return RunnerRegistry(paths.runners_dir())


def runner(registry: RunnerRegistry, name: str):
    try:
        return registry.get(name)
    except DefinitionError as e:
        raise fail(str(e)) from None


def framework_names(registry: RunnerRegistry, given: list[str]) -> list[str]:
    """`--framework` values: names, comma lists, or 'all' (the runners that exist), deduplicated."""
    names = listed_choices("framework", given, registry.names())
    if not names:
        raise fail(f"no framework given; valid frameworks: {', '.join(registry.names() + ['all'])}")
    return names


def suite_kind(path: Path) -> str:
    """The `kind` of a suite file (benchmark, distributed, comm, kernels)."""
    try:
        return catalog().suite_kind(path)
    except DefinitionError as e:
        raise fail(str(e)) from None


def _load_suite(suite: str, profile: str, device: str, modes: tuple[str, ...] | None = None):
    suites = catalog()
    path = suites.suite_path(suite)
    if path is None:
        raise fail(f"unknown suite {suite!r}; valid suites: {', '.join(suites.suite_names() + ['all'])} "
                   "(or a path to a .yaml file)")
    try:
        return suites.load_suite(path, profile, device, modes)
    except DefinitionError as e:
        raise fail(str(e)) from None


def load_suites(suite: str, profile: str, device: str, modes: tuple[str, ...] | None = None) -> list:
    """`--suite`: a name, a path, or 'all' (every suite shipped in suites/)."""
    names = catalog().suite_names() if suite == "all" else [suite]
    return [_load_suite(n, profile, device, modes) for n in names]
