"""What the commands look up by name: the suites (catalog), the runners (registry), the results
store; each unknown or invalid name is an error that exits 2 with the valid ones. The look-ups are
the workflows' (workflows/lookup.py); here their RequestError becomes the command's error."""

from __future__ import annotations

import functools
from pathlib import Path

from ..definitions.catalog import SuiteCatalog
from ..execution.registry import RunnerRegistry
from ..store.store import Store, StoreWriteError
from ..workflows import lookup as found
from ..workflows.requests import RequestError
from .console import fail

open_store = found.open_store
refresh_index = found.refresh_index
catalog = found.catalog
registry = found.registry


def refused(call, *args, **kwargs):
    """`call(*args, **kwargs)`, with its RequestError as the command's error (exit 2)."""
    try:
        return call(*args, **kwargs)
    except RequestError as e:
        raise fail(str(e)) from None


def existing_store(store: Path | None, makes_records: str = "dlbench run --suite fcn --profile smoke") -> Store:
    """The store of a command that only reads it (workflows/lookup.py existing_store): a folder that
    is not there is one error that says how to make one (the command `makes_records`), exit 2."""
    return refused(found.existing_store, store, makes_records)


def writable_store(store: Path | None) -> Store:
    """The store of `dlbench run`, checked before its first benchmark (Store.check_writable: a
    directory, writable, with room for a record): otherwise one error and exit 2, nothing run."""
    return refused(found.writable_store, store)


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


def runner(registry: RunnerRegistry, name: str):
    return refused(found.runner, registry, name)


def framework_names(registry: RunnerRegistry, given: list[str]) -> list[str]:
    """`--framework` values: names, comma lists, or 'all' (the runners that exist), deduplicated."""
    return refused(found.framework_names, registry, given)


def suite_kind(path: Path, suites: SuiteCatalog | None = None) -> str:
    """The `kind` of a suite file (benchmark, distributed, comm, kernels, convergence)."""
    return refused(found.suite_kind, suites or catalog(), path)


def load_suites(suite: str, profile: str, device: str, modes: tuple[str, ...] | None = None,
                suites: SuiteCatalog | None = None) -> list:
    """`--suite`: a name, a path, or 'all' (every suite shipped in suites/); `suites`: the command's
    catalog, where it has one (each file is then parsed once however often it is resolved)."""
    return refused(found.load_suites, suites or catalog(), suite, profile, device, modes)
