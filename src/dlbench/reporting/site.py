"""Write the store as a static site: one publish step, readable offline from disk.

    OUT/index.html              leaderboards per suite and hardware
    OUT/benchmarks/<key>.html   one page per (suite, hardware, benchmark)
    OUT/runs/<run id>.html      one page per run
    OUT/history.html            every series over time, change points marked
    OUT/runs.html               every run
    OUT/compression.html        gradient compression: speedup over dense against link bandwidth, and
                                time to accuracy of data-parallel convergence runs
    OUT/compare.html            with --compare BASELINE CANDIDATE
    OUT/static/                 the stylesheet and the table script (the only things a page loads)

Each record is read (and its checksum verified) once: its page is rendered right away and only its
RunView (model.py) is kept; the aggregate pages are rendered from the RunViews. The store's row
index is not used: it holds no more than a RunView needs, and every record must be read for its own
page anyway. A large store is read and its run pages rendered in worker processes, one chunk of
record files each; meanwhile the parent imports what the aggregate pages need (scipy, ruptures).
Then a forked child writes the history and benchmark pages while the parent writes the index, the
list of runs and the manifest. What a 10,000-run build costs: benchmarks/report_scale.py.

Every string from a record reaches a page through jinja2's autoescaping or markupsafe's escape (the
SVG charts), and the pages carry a Content-Security-Policy that lets only the site's own stylesheet
and script load: a hostile name or error text shows as text and runs nothing.

The site is built in a sibling folder and swapped in when complete: a failed or interrupted build
leaves the previous site as it was. OUT is only ever replaced if it is empty or a site written by
dlbench (it holds SITE_MARKER): `--out ~` never deletes a home folder.

SITE_MARKER is also the site's manifest: per record file its size, modification time and RunView.
A rebuild into the same OUT hard-links the page of every record whose file is unchanged from the
previous site (records are append-only) when the renderer is the same (templates, static files,
this package, dlbench version, the store's machine profiles, which a run's MFU is divided by:
`renderer_key`), and reads and renders only the others; the
aggregate pages are always rebuilt. An unchanged file is then not verified again: like the store's
row index, the reuse trusts size and mtime_ns, and a new or `store upgrade`d record changes both.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import threading
import webbrowser
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from .. import paths
from ..store.record import SCHEMA_VERSION
from ..store.store import Store, StoreError, file_digest, read_regular
from ..store.utilisation import Peaks
from ..version import __version__
from . import charts, pages
from .compression_view import compression_context
from .model import RunView, SiteModel, build_model, run_page_name, slug
from .run_page import network_definition, run_context

SITE_MARKER = ".dlbench-site"  # the manifest: marks the folder as a site and lets a rebuild reuse run pages
MANIFEST_VERSION = 1
STATIC_FILES = ("style.css", "tables.js")
PARALLEL_FROM = 300  # records; below this, starting worker processes costs more than it saves
CHUNK = 100  # record files per task: small enough that the workers finish together


class SiteError(Exception):
    """Why no site was written; `code` is the exit status (2: bad input, 1: nothing to report)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


@dataclass
class SiteResult:
    index: Path
    runs: int
    problems: list[tuple[str, str]] = field(default_factory=list)
    pages: int = 0


_environment: Environment | None = None


def environment() -> Environment:
    """One per process: templates are compiled once and reused for every page."""
    global _environment
    if _environment is None:
        # auto_reload off: the templates do not change during a build, and with it every page's
        # {% extends %} and {% from ... import %} looked the template up again (a stat of its file)
        env = Environment(loader=FileSystemLoader(str(paths.reports_dir() / "templates")),
                          autoescape=select_autoescape(default=True, default_for_string=True),
                          undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, auto_reload=False)
        env.filters["fmt"] = charts.fmt
        env.filters["cssclass"] = slug
        _environment = env
    return _environment


def _common(root: str, generated_at: str, has_compare: bool) -> dict:
    return {"root": root, "generated_at": generated_at, "dlbench_version": __version__, "has_compare": has_compare}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _write_once(path: Path, text: str) -> None:
    """Write a file several worker processes may write with the same content: each writes its own
    temporary file and renames it into place, so a reader never sees a half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def _few_collections():
    """Fewer garbage collections while pages are rendered: a record and its page make thousands
    of short-lived objects (nearly all freed by reference counting), and with the default
    threshold a collection runs every few hundred of them, walking every object alive; frozen,
    the ones that were there before (modules, templates) are left out of those walks."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(20_000, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def render_runs(store_root: str, record_paths: list[str], build_dir: str, generated_at: str,
                has_compare: bool) -> tuple[list[RunView], list[tuple[str, str]]]:
    """Read each record, write its page, return the views of those that rendered and the problems
    of those that did not (a module-level function: it runs in worker processes)."""
    with _few_collections():
        return _render_runs(store_root, record_paths, build_dir, generated_at, has_compare)


def _render_runs(store_root: str, record_paths: list[str], build_dir: str, generated_at: str,
                 has_compare: bool) -> tuple[list[RunView], list[tuple[str, str]]]:
    store, env = Store(Path(store_root)), environment()
    peaks = Peaks(store)  # each machine profile read once per worker, for the runs' MFU
    template = env.get_template("run.html.j2")
    common = _common("../", generated_at, has_compare)
    views, problems = [], []
    definitions_written: set[str] = set()
    for path in map(Path, record_paths):
        try:
            record = store.read(path)
        except StoreError as e:
            problems.append((str(path), str(e)))
            continue
        page = run_page_name(path.stem)  # file names are unique in runs/; run ids in crafted records may not be
        try:
            context = run_context(record, page, peaks)
            html = template.render(**common, **context)
        except Exception as e:  # noqa: BLE001 - one odd record must not cost the whole site
            problems.append((str(path), f"{path}: page not rendered: {type(e).__name__}: {e}"))
            continue
        _write(Path(build_dir) / page, html)
        if context["definition_page"] not in definitions_written:  # one file per network, not per run
            definitions_written.add(context["definition_page"])
            _write_once(Path(build_dir) / context["definition_page"], network_definition(record))
        views.append(context["view"])
    return views, problems


def _workers(n_records: int) -> int:
    if n_records < PARALLEL_FROM:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8, n_records // CHUNK + 1))


def renderer_key(has_compare: bool, store: Store | None = None) -> str:
    """What a run page depends on besides its record: the templates, the static files, this
    package's code and store/intervals.py, dlbench's version, whether the site has a compare page (its navigation
    links there) and the store's machine profiles (a run's MFU is divided by its machine's peak:
    a new calibration re-renders the pages). A previous site's run page is reused only under the
    same key."""
    digest = hashlib.sha256(f"{__version__}|{SCHEMA_VERSION}|{has_compare}".encode())
    machines = store.root / "machines" if store is not None else None
    if machines is not None and machines.is_dir():  # profiles are never rewritten: their names suffice
        digest.update("|".join(sorted(p.relative_to(machines).as_posix() for p in machines.glob("*/*.json"))).encode())
    for folder, pattern in ((paths.reports_dir() / "templates", "*.j2"), (paths.reports_dir() / "static", "*"),
                            (Path(__file__).parent, "*.py"),
                            # the reported interval is derived as a record is read (a run's view keeps it)
                            (Path(__file__).parent.parent / "store", "intervals.py")):
        for f in sorted(folder.glob(pattern)):
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def previous_runs(out_dir: Path, key: str) -> dict[str, dict]:
    """The manifest of the site in out_dir, if it was rendered under `key`: record file name ->
    {"size", "mtime_ns", "digest", "view"}; empty when there is none or it does not fit."""
    try:
        data = json.loads((out_dir / SITE_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("manifest") != MANIFEST_VERSION or data.get("renderer") != key:
        return {}
    runs = data.get("runs")
    return runs if isinstance(runs, dict) else {}


def _reuse(entry: dict, old_dir: Path, build_dir: Path) -> RunView | None:
    """Hard-link an unchanged record's page (and its network's file) from the previous site."""
    try:
        view = RunView.from_json(entry["view"])
    except (KeyError, TypeError, ValueError):
        return None
    for rel in (view.page, view.network_page):
        if not re.fullmatch(r"(runs|networks)/[A-Za-z0-9_.-]+", rel) or ".." in rel:
            return None  # a manifest names only files of the site itself
        target = build_dir / rel
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(old_dir / rel, target)
        except FileNotFoundError:
            return None
        except OSError:  # a file system without hard links
            shutil.copyfile(old_dir / rel, target)
    return view


def read_and_render_runs(store: Store, build_dir: Path, generated_at: str, has_compare: bool,
                         workers: int | None = None, old_dir: Path | None = None,
                         old_runs: dict[str, dict] | None = None,
                         ) -> tuple[list[RunView], list[tuple[str, str]], dict[str, dict]]:
    """Views of every readable record, the problems of the others, and the manifest entries.
    A record whose file has the size and modification time the previous site saw (records are
    never rewritten in place, except by `dlbench store upgrade`, which changes both) keeps its
    page; the others are read, verified and rendered."""
    old_runs = old_runs or {}
    views, fresh, seen = [], [], {}
    for path in store.paths():
        try:
            st = path.stat()
        except FileNotFoundError:
            continue  # removed since the listing
        try:  # the bytes, not only size and mtime: a byte flipped with both put back is read (and refused) again
            digest = file_digest(read_regular(path))
        except StoreError:
            digest = None
        seen[path.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "digest": digest}
        entry = old_runs.get(path.name)
        view = None
        if (old_dir is not None and entry and digest is not None
                and (entry.get("size"), entry.get("mtime_ns"), entry.get("digest")) == (st.st_size, st.st_mtime_ns, digest)):
            view = _reuse(entry, old_dir, build_dir)
        if view is not None:
            views.append(view)
        else:
            fresh.append(str(path))
    workers = workers or _workers(len(fresh))
    if workers <= 1:
        new_views, problems = render_runs(str(store.root), fresh, str(build_dir), generated_at, has_compare)
    else:
        chunks = [fresh[i:i + CHUNK] for i in range(0, len(fresh), CHUNK)]
        new_views, problems = [], []
        # fork where it is safe (_can_fork); else spawn, a fresh interpreter per worker
        method = "fork" if _can_fork() else "spawn"
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method)) as pool:
            results = pool.map(render_runs, [str(store.root)] * len(chunks), chunks, [str(build_dir)] * len(chunks),
                               [generated_at] * len(chunks), [has_compare] * len(chunks))
            # every task is queued and the workers started: meanwhile, this otherwise idle process imports
            # what the aggregate pages need (scipy and ruptures: about a second, else spent after the workers)
            import scipy.stats  # noqa: F401 - model._scores

            from . import history_view  # noqa: F401 - ruptures
            for v, p in results:
                new_views.extend(v)
                problems.extend(p)
    views.extend(new_views)
    by_page = {run_page_name(Path(name).stem): name for name in seen}
    manifest = {by_page[v.page]: {**seen[by_page[v.page]], "view": v.to_json()} for v in views if v.page in by_page}
    return views, problems, manifest


def _can_fork() -> bool:
    """Forking is safe where the caller is single-threaded (the CLI is): the child starts at once,
    with the modules, the compiled templates and the view model already in memory."""
    return threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()


def _start_in_child(work: Callable[[], None]) -> Callable[[], None]:
    """Run `work` in a forked child process while the caller goes on; returns the function that
    waits for it. Where the child failed, `work` runs again here, so that its error is raised
    here, with its traceback, and the build fails as it would have without the child."""
    def child() -> None:
        try:
            work()
        except BaseException:  # noqa: BLE001 - reported by running it again in the parent
            os._exit(1)

    process = multiprocessing.get_context("fork").Process(target=child, daemon=True)
    process.start()

    def finish() -> None:
        process.join()
        if process.exitcode != 0:
            work()
    return finish


def render_aggregates(model: SiteModel, build_dir: Path, generated_at: str, split: bool = False,
                      meanwhile: Callable[[], None] | None = None) -> int:
    """Write the leaderboards, the list of runs, the history, the benchmark pages (and the compare
    page); `split`: the history and benchmark pages (about half of the time) in a forked child
    while this process writes the rest and does `meanwhile`."""
    env = environment()
    has_compare = model.comparison is not None
    top = _common("", generated_at, has_compare)
    nested = _common("../", generated_at, has_compare)

    def history_and_benchmarks() -> None:
        _write(build_dir / "history.html", env.get_template("history.html.j2").render(**top, **pages.history_context(model)))
        template = env.get_template("benchmark.html.j2")
        for page in model.benchmarks:
            _write(build_dir / page.page, template.render(**nested, **pages.benchmark_context(page, model)))

    finish = _start_in_child(history_and_benchmarks) if split and _can_fork() else None
    if finish is None:
        history_and_benchmarks()
    _write(build_dir / "index.html", env.get_template("index.html.j2").render(**top, **pages.index_context(model)))
    _write(build_dir / "runs.html", env.get_template("runs.html.j2").render(**top, model=model))
    _write(build_dir / "compression.html", env.get_template("compression.html.j2").render(
        **top, **compression_context(model)))
    if has_compare:
        _write(build_dir / "compare.html", env.get_template("compare.html.j2").render(
            **top, model=model, **pages.compare_context(model.comparison, model)))
    for name in STATIC_FILES:
        static = build_dir / "static" / name
        static.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(paths.reports_dir() / "static" / name, static)
    if meanwhile is not None:
        meanwhile()
    if finish is not None:
        finish()
    return 3 + len(model.benchmarks) + has_compare


def _check_replaceable(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise SiteError(f"--out {out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / SITE_MARKER).exists():
        raise SiteError(f"--out {out_dir}: exists, is not empty and is not a site dlbench wrote "
                        f"(no {SITE_MARKER}); choose another directory or empty it")


def _swap_in(build_dir: Path, out_dir: Path) -> None:
    """Replace out_dir by build_dir; the old site is renamed away first and removed last."""
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    if out_dir.exists():
        os.rename(out_dir, old)
    os.rename(build_dir, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def build_site(store_root: Path, out_dir: Path, comparison_args: tuple[str, str] | None = None,
               workers: int | None = None, now: datetime | None = None) -> SiteResult:
    """Build the whole site from the store into out_dir (see the module docstring)."""
    out_dir = Path(out_dir).absolute()
    _check_replaceable(out_dir)
    store = Store(Path(store_root))
    generated = now or datetime.now(timezone.utc)
    generated_at = generated.strftime("%Y-%m-%d %H:%M UTC")
    request = None
    if comparison_args is not None:
        from .comparison_view import ComparisonRequestError, parse_request
        try:
            request = parse_request(*comparison_args)  # a bad selector fails before any work
        except ComparisonRequestError as e:
            raise SiteError(str(e), e.code) from None
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    build_dir = out_dir.with_name(f".{out_dir.name}.building-{os.getpid()}")
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir()
    key = renderer_key(request is not None, store)
    try:
        views, problems, manifest = read_and_render_runs(
            store, build_dir, generated_at, request is not None, workers, out_dir, previous_runs(out_dir, key))
        if not views:
            detail = f" ({len(problems)} unreadable; the first: {problems[0][1]})" if problems else ""
            raise SiteError(f"no records in {store.root}{detail}; run `dlbench run` first", 1)
        model = build_model(views, problems, generated, __version__)
        from .history_view import attach_change_points  # here: worker processes need no ruptures
        attach_change_points(model)
        if request is not None:
            from .comparison_view import ComparisonRequestError, run_comparison
            try:
                model.comparison = run_comparison(store, request)
            except ComparisonRequestError as e:
                raise SiteError(str(e), e.code) from None

        def write_manifest() -> None:
            (build_dir / SITE_MARKER).write_text(json.dumps(
                {"manifest": MANIFEST_VERSION, "written_by": f"dlbench {__version__}", "generated_at": generated_at,
                 "renderer": key, "runs": manifest}))
        written = render_aggregates(model, build_dir, generated_at, split=(workers or _workers(len(views))) > 1,
                                    meanwhile=write_manifest)
        _swap_in(build_dir, out_dir)
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    return SiteResult(out_dir / "index.html", len(views), problems, written + len(views))


def open_in_browser(index: Path) -> bool:
    return webbrowser.open(index.absolute().as_uri())
