"""What the commands look up by name: the suites (catalog), the runners (registry), the results
store; each unknown or invalid name is an error that exits 2 with the valid ones."""

from __future__ import annotations

import functools
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


def suite_kind(path: Path, suites: SuiteCatalog | None = None) -> str:
    """The `kind` of a suite file (benchmark, distributed, comm, kernels, convergence)."""
    try:
        return (suites or catalog()).suite_kind(path)
    except DefinitionError as e:
        raise fail(str(e)) from None


def _load_suite(suites: SuiteCatalog, suite: str, profile: str, device: str, modes: tuple[str, ...] | None = None):
    path = suites.suite_path(suite)
    if path is None:
        raise fail(f"unknown suite {suite!r}; valid suites: {', '.join(suites.suite_names() + ['all'])} "
                   "(or a path to a .yaml file)")
    try:
        return suites.load_suite(path, profile, device, modes)
    except DefinitionError as e:
        raise fail(str(e)) from None


def load_suites(suite: str, profile: str, device: str, modes: tuple[str, ...] | None = None,
                suites: SuiteCatalog | None = None) -> list:
    """`--suite`: a name, a path, or 'all' (every suite shipped in suites/); `suites`: the command's
    catalog, where it has one (each file is then parsed once however often it is resolved)."""
    suites = suites or catalog()
    names = suites.suite_names() if suite == "all" else [suite]
    return [_load_suite(suites, n, profile, device, modes) for n in names]
