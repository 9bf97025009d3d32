"""The GitHub workflows: they parse, cover every runner and suite (the nightly's matrix is listed by
its start job, whose steps are run here), every `dlbench` command they call exists with the options
given (resolved through the CLI's own click command), their shell steps pass shellcheck, and the
nightly's publish steps (history, merge, comparison) work when run."""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import typer.main
import yaml
from store_records import record_from_times
from test_dockerfiles import tool

from dlbench.analysis.comparison import parse_selector
from dlbench.cli import app
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.suite import PROFILES
from dlbench.execution.backends import BACKENDS
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
CLI = typer.main.get_command(app)


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


NIGHTLY, CI = load("nightly.yml"), load("ci.yml")


def steps(workflow: dict):
    for job_id, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, job, step


def stand_in_checkout(where: Path) -> Path:
    """A checkout for running a job's steps here: its bin/dlbench and .venv/bin/python are this
    interpreter with dlbench (as bin/dlbench would have set .venv up on the runner); which runners
    and suites dlbench sees is DLBENCH_ROOT's."""
    for name, command in (("bin/dlbench", "-m dlbench.cli"), (".venv/bin/python", "")):
        path = where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\nexec {sys.executable} {command} \"$@\"\n")
        path.chmod(0o755)
    return where


def run_job_steps(workflow: dict, job_id: str, root: Path = ROOT) -> dict[str, str]:
    """The job's `run` steps executed in order on this machine, as GitHub runs them (bash -e -o
    pipefail, each step with its own $GITHUB_OUTPUT), in a stand-in checkout with DLBENCH_ROOT=root;
    returns the job's `outputs`, their expressions filled in from the steps' outputs."""
    job = workflow["jobs"][job_id]
    outputs: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="dlbench-job-") as tmp:
        work = stand_in_checkout(Path(tmp) / "checkout")
        for i, step in enumerate(job["steps"]):
            if "run" not in step:
                continue  # checkout and setup-python: the stand-in checkout is both
            output = Path(tmp) / f"output-{i}"
            output.write_text("")
            env = {"PATH": os.environ["PATH"], "HOME": tmp, "DLBENCH_ROOT": str(root), "GITHUB_OUTPUT": str(output),
                   **{k: str(v) for k, v in {**workflow.get("env", {}), **job.get("env", {}), **step.get("env", {})}.items()}}
            done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=work,
                                  env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{job_id} {step.get('name', step.get('id'))}:\n{done.stdout}{done.stderr}"
            if "id" in step:
                outputs[step["id"]] = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)

    def fill(m):
        step_id, key = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", m.group(1)).groups()
        return outputs[step_id][key]

    return {name: EXPRESSION.sub(fill, str(value)) for name, value in job.get("outputs", {}).items()}


@functools.cache
def job_outputs(name: str, job_id: str, root: Path = ROOT) -> dict[str, str]:
    return run_job_steps(load(name), job_id, root)


def matrix_values(name: str, job: dict, root: Path = ROOT) -> dict[str, list]:
    """The job's matrix with `${{ fromJSON(needs.JOB.outputs.KEY) }}` values read from that job's
    outputs, as GitHub fills them in (the job run here, with DLBENCH_ROOT=root)."""
    matrix = {}
    for key, value in job.get("strategy", {}).get("matrix", {}).items():
        if key in ("include", "exclude"):
            continue
        generated = re.fullmatch(r"\$\{\{\s*fromJSON\(needs\.([\w-]+)\.outputs\.([\w-]+)\)\s*\}\}", str(value))
        if generated:
            needed, output = generated.groups()
            assert needed in ([job["needs"]] if isinstance(job["needs"], str) else job["needs"])
            value = json.loads(job_outputs(name, needed, root)[output])
        matrix[key] = value
    return matrix


def matrix_combinations(name: str, job: dict) -> list[dict]:
    matrix = matrix_values(name, job)
    return [dict(zip(matrix, values)) for values in itertools.product(*matrix.values())] or [{}]


def expand(script: str, workflow: dict, job: dict, step: dict, matrix: dict) -> str:
    """The script as the runner's shell would see it: expressions filled in (matrix values; others
    become a placeholder word), then the workflow's, job's and step's `env` values substituted."""
    def expression(m):
        expr = m.group(1)
        if expr.startswith("matrix."):
            return str(matrix[expr.removeprefix("matrix.")])
        return "EXPRESSION"

    text = EXPRESSION.sub(expression, script)
    env = {**workflow.get("env", {}), **job.get("env", {}), **step.get("env", {})}
    for key, value in env.items():
        if not EXPRESSION.search(str(value)):
            text = re.sub(rf"\$\{{{key}\}}|\${key}\b", str(value), text)
    return text


def dlbench_calls(script: str) -> list[list[str]]:
    """Every `dlbench`/`bin/dlbench` command line in a shell script, as its argument list (up to the
    first shell operator or redirection)."""
    calls = []
    for line in script.replace("\\\n", " ").splitlines():
        line = re.sub(r"(?<=\s)\d+(?=[<>])", "", line)  # 2>&1: the descriptor is not an argument
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
        for i, token in enumerate(tokens):
            if token in ("dlbench", "bin/dlbench"):
                args = []
                for t in tokens[i + 1:]:
                    if set(t) <= set("();<>|&"):
                        break
                    args.append(t)
                calls.append(args)
    return calls


def parse_call(args: list[str]):
    """(command name path, parsed parameters) of a dlbench command line, as the CLI would parse it."""
    node, ctx, path, rest = CLI, None, ["dlbench"], list(args)
    while hasattr(node, "list_commands"):
        ctx = node.make_context(path[-1], [], parent=ctx, resilient_parsing=True)
        assert rest, f"{' '.join(path)} needs a command; it has {node.list_commands(ctx)}"
        name, rest = rest[0], rest[1:]
        sub = node.get_command(ctx, name)
        assert sub is not None, f"`{' '.join(path)}` has no command {name!r}: {node.list_commands(ctx)}"
        node, path = sub, path + [name]
    return " ".join(path[1:]), node.make_context(path[-1], rest, parent=ctx).params


def all_calls() -> list[tuple[str, str, list[str]]]:
    calls = []
    for name, workflow in (("nightly.yml", NIGHTLY), ("ci.yml", CI)):
        for job_id, job, step in steps(workflow):
            if "run" in step:
                for matrix in matrix_combinations(name, job):
                    for args in dlbench_calls(expand(step["run"], workflow, job, step, matrix)):
                        calls.append((f"{name}:{job_id}:{step.get('name', step['run'][:30])}", json.dumps(matrix), args))
    return calls


CALLS = all_calls()


# ---- structure -----------------------------------------------------------------------------------

def test_the_nightly_runs_every_suite_on_every_runner_on_gpu_runners_in_containers():
    assert NIGHTLY["on"]["schedule"][0]["cron"] and "workflow_dispatch" in NIGHTLY["on"]
    bench = NIGHTLY["jobs"]["bench"]
    assert bench["runs-on"] == ["self-hosted", "linux", "x64", "dlbench-gpu"]
    assert bench["strategy"]["fail-fast"] is False
    # the matrix is what dlbench finds, listed by the start job: no framework or suite is named here
    matrix = bench["strategy"]["matrix"]
    assert matrix["framework"] == "${{ fromJSON(needs.start.outputs.frameworks) }}"
    assert matrix["suite"] == "${{ fromJSON(needs.start.outputs.suites) }}"
    listed = matrix_values("nightly.yml", bench)
    assert listed["framework"] == RunnerRegistry(ROOT / "runners").names()
    assert listed["suite"] == SuiteCatalog(ROOT / "suites").suite_names()
    assert NIGHTLY["jobs"]["start"]["steps"][0]["id"] == "clock"  # the night's start is read before the listing
    uploads = [s for _, _, s in steps({"jobs": {"bench": bench}}) if s.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["if"] == "${{ !cancelled() }}"  # failed runs are published too


def test_the_runner_labels_are_documented():
    readme = (ROOT / "README.md").read_text()
    for label in NIGHTLY["jobs"]["bench"]["runs-on"]:
        assert label in readme
    assert "dlbench-gpu" in (WORKFLOWS / "nightly.yml").read_text().split("name: nightly")[0]  # header comment


def test_the_nightly_publishes_even_after_a_failed_benchmark_and_deploys_the_site():
    publish, deploy = NIGHTLY["jobs"]["publish"], NIGHTLY["jobs"]["deploy"]
    assert "!cancelled()" in publish["if"] and set(publish["needs"]) == {"start", "bench"}
    assert publish["permissions"]["contents"] == "write"
    assert any(s.get("uses", "").startswith("actions/upload-pages-artifact") for s in publish["steps"])
    assert deploy["needs"] == "publish" and deploy["environment"]["name"] == "github-pages"
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}


def test_pull_requests_run_the_tests_and_the_smoke_profile():
    assert "pull_request" in CI["on"]
    runs = [s["run"] for _, _, s in steps(CI) if "run" in s]
    assert "bash .ci/run" in runs
    smoke = [args for _, _, args in CALLS if args[:1] == ["run"] and "smoke" in args]
    assert smoke and all(a[a.index("--profile") + 1] == "smoke" for a in smoke)


# ---- the dlbench commands ------------------------------------------------------------------------

def test_the_workflows_call_dlbench():
    called = {parse_call(args)[0] for _, _, args in CALLS}
    assert {"env create", "run", "store merge", "report", "compare"} <= called


@pytest.mark.parametrize("where, matrix, args", CALLS, ids=lambda v: v if isinstance(v, str) and ":" in v else "")
def test_every_dlbench_command_exists_with_its_options(where, matrix, args):
    command, params = parse_call(args)  # raises on an unknown command or option, a bad value, a missing one
    if command == "run":
        catalog = SuiteCatalog(ROOT / "suites")
        assert params["suite"] in catalog.suite_names() + catalog.kernel_suite_names() + ["all"]
        assert set(params["framework"]) <= set(RunnerRegistry(ROOT / "runners").names()) | {"all"}
        assert params["profile"] in PROFILES and params["env"] in BACKENDS
        assert params["device"] in ("cpu", "cuda")  # never auto: a CI host says what it is
    if command == "env create":
        assert params["env"] in BACKENDS and params["device"] in ("cpu", "cuda")
    if command in ("run", "env create") and where.startswith("nightly.yml"):
        assert params["env"] == "docker" and params["device"] == "cuda"
    if command == "compare":
        assert params["fail_on_regression"] is not None
        # the selectors are real ones once the shell has filled in the times (as the job writes them),
        # and the previous night ends before tonight begins
        times = {"PREVIOUS_STARTED": "2026-11-29T01:17:00Z", "PREVIOUS_PUBLISHED": "2026-11-29T06:40:00Z",
                 "STARTED": "2026-11-30T01:17:00Z"}
        baseline, candidate = (parse_selector(re.sub(r"\$\{?(\w+)\}?", lambda m: times[m.group(1)], params[option]),
                                              option) for option in ("baseline", "candidate"))
        assert baseline.until is not None and candidate.since is not None and baseline.until < candidate.since


def test_the_command_parser_catches_mistakes():
    # what the test above relies on: a wrong command or option does not parse
    with pytest.raises(AssertionError, match="no command 'merg'"):
        parse_call(["store", "merg", "a"])
    with pytest.raises(Exception, match="No such option"):
        parse_call(["run", "--suite", "fcn", "--enviroment", "docker"])
    with pytest.raises(Exception, match="Missing parameter: candidate"):
        parse_call(["compare", "--baseline", "framework=torch"])
    assert dlbench_calls('x=1 bin/dlbench compare --a "b c" --n 5 > out.txt 2>&1 || status=$?\necho bin/dlbench x') == \
        [["compare", "--a", "b c", "--n", "5"], ["x"]]


def test_the_shell_steps_pass_shellcheck():
    shellcheck = tool("shellcheck")
    for name, workflow in (("nightly.yml", NIGHTLY), ("ci.yml", CI)):
        for job_id, job, step in steps(workflow):
            if "run" not in step:
                continue
            # as GitHub runs them: bash -e -o pipefail; expressions are filled in before the shell starts
            script = "set -eo pipefail\n" + EXPRESSION.sub("EXPRESSION", step["run"])
            done = subprocess.run([shellcheck, "--shell=bash", "-"], input=script, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, f"{name} {job_id} {step.get('name')}:\n{done.stdout}"


# ---- the publish job, run --------------------------------------------------------------------------

def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


class PublishJob:
    """The nightly's publish job on this machine: its `run` steps executed in order with bash as GitHub
    runs them (-e -o pipefail), against a bare repository standing in for GitHub's. The steps that use
    actions are stood in for: checkout by a clone, download-artifact by the stores a night produced."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.origin = tmp / "origin.git"
        git("init", "-q", "--bare", "-b", "main", str(self.origin), cwd=tmp)
        seed = tmp / "seed"
        (seed / "bin").mkdir(parents=True)
        dlbench = seed / "bin" / "dlbench"
        dlbench.write_text(f"#!/bin/sh\nexec {sys.executable} -m dlbench.cli \"$@\"\n")
        dlbench.chmod(0o755)
        git("init", "-q", "-b", "main", cwd=seed)
        git("add", ".", cwd=seed)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "seed", cwd=seed)
        git("push", "-q", str(self.origin), "main", cwd=seed)
        self.nights = 0

    def night(self, started: datetime, stores: dict[str, list]) -> tuple[int, str]:
        """Run the job for one night whose benchmark jobs produced `stores` (name -> records), the job's
        clock (`date`) reading half an hour after `started`; returns the exit status of the last step
        that ran and the job summary."""
        self.nights += 1
        work = self.tmp / f"night{self.nights}"
        clock = self.tmp / f"clock{self.nights}"
        clock.mkdir()
        (clock / "date").write_text(f"#!/bin/sh\necho {(started + timedelta(minutes=30)).strftime('%Y-%m-%dT%H:%M:%SZ')}\n")
        (clock / "date").chmod(0o755)
        git("clone", "-q", str(self.origin), str(work), cwd=self.tmp)
        job = NIGHTLY["jobs"]["publish"]
        files = {k: self.tmp / f"{k.lower()}-{self.nights}" for k in ("GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")}
        for f in files.values():
            f.write_text("")
        env = {"PATH": f"{clock}:{os.environ['PATH']}", "HOME": str(self.tmp), "GIT_CONFIG_NOSYSTEM": "1",
               **NIGHTLY["env"], "STARTED": started.strftime("%Y-%m-%dT%H:%M:%SZ"), **{k: str(v) for k, v in files.items()}}
        assert set(job["env"]) == {"STARTED"}
        status = 0
        for step in job["steps"]:
            uses = step.get("uses", "")
            if uses.startswith("actions/download-artifact"):
                for name, records in stores.items():
                    store = Store(work / step["with"]["path"] / name)
                    for record in records:
                        store.write(record)
            if "run" not in step:
                continue
            done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=work,
                                  env=env, capture_output=True, text=True, timeout=300)
            status = done.returncode
            if status != 0:
                self.last_output = done.stdout + done.stderr
                break
            for line in files["GITHUB_ENV"].read_text().splitlines():
                key, _, value = line.partition("=")
                env[key] = value
        return status, files["GITHUB_STEP_SUMMARY"].read_text()


def night_records(started: datetime, level_s: float, machine: str = "gpu-host-1") -> list:
    """Two benchmarks, three worker processes each, iteration times around level_s."""
    records = []
    for k, benchmark in enumerate(("fcn5-train", "fcn8-train")):
        times = [[level_s * (1 + 0.01 * p) * (1 + 0.002 * i) for i in range(10)] for p in range(3)]
        records.append(record_from_times(times, started=started + timedelta(minutes=5 * k), benchmark=benchmark,
                                         machine=machine, version="2.13.0"))
    return records


def test_the_publish_job_keeps_the_history_and_fails_a_night_that_regressed(tmp_path):
    job = PublishJob(tmp_path)
    now = datetime.now(timezone.utc).replace(microsecond=0)

    first = now - timedelta(days=4)
    status, summary = job.night(first, {"store-torch-fcn": night_records(first + timedelta(minutes=1), 0.010)})
    assert status == 0, getattr(job, "last_output", "")
    assert "first night" in summary
    branch = git("ls-tree", "-r", "--name-only", "dlbench-results", cwd=job.origin).split()
    assert "nights.tsv" in branch and sum(p.startswith("store/runs/") for p in branch) == 2
    assert not [p for p in branch if "/.index/" in p]

    # the next night is 25% slower: the job fails, after pushing the history, with the table in its summary
    second = now - timedelta(days=3)
    status, summary = job.night(second, {"store-torch-fcn": night_records(second + timedelta(minutes=1), 0.0125)})
    assert status == 3, getattr(job, "last_output", "")
    assert "fcn5-train" in summary and "fcn8-train" in summary and "regression" in summary
    assert first.strftime("%Y-%m-%dT%H:%M:%SZ") in summary  # compared with the previous night
    nights = git("show", "dlbench-results:nights.tsv", cwd=job.origin).splitlines()
    assert len(nights) == 2 and nights[1].startswith(second.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert len([p for p in git("ls-tree", "-r", "--name-only", "dlbench-results", cwd=job.origin).split()
                if p.startswith("store/runs/")]) == 4
    assert (tmp_path / "night2" / "site" / "index.html").is_file()  # the site was built before the comparison

    # a third night as fast as the second passes: the baseline is the previous night, not the first
    third = now - timedelta(days=2)
    status, summary = job.night(third, {"store-torch-fcn": night_records(third + timedelta(minutes=1), 0.0125)})
    assert status == 0, getattr(job, "last_output", "")
    assert second.strftime("%Y-%m-%dT%H:%M:%SZ") in summary and "fcn5-train" in summary

    # a night on another machine has nothing to pair with: said in the summary, not a failure
    fourth = now - timedelta(days=1)
    status, summary = job.night(fourth, {"store-torch-fcn": night_records(fourth + timedelta(minutes=1), 0.05,
                                                                           machine="gpu-host-2")})
    assert status == 0, getattr(job, "last_output", "")
    assert "Nothing was compared" in summary


def test_a_night_without_stores_fails_before_touching_the_history(tmp_path):
    job = PublishJob(tmp_path)
    status, _ = job.night(datetime.now(timezone.utc), {})
    assert status == 1 and "no benchmark job uploaded a store" in job.last_output
    assert "dlbench-results" not in git("branch", "--list", cwd=job.origin)
