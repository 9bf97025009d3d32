"""Containers against venvs: throughput of the same run in the framework's image and in its venv.

For each framework, round by round, one `dlbench run` in the image (`--env docker`) and one in the
venv (`--env venv`), same benchmark, profile and threads, one repeat each, alternating which goes
first, so that this machine's drift hits both alike. The figure per framework is the median of the
paired ratios (samples/s in the container over samples/s in the venv), with their range. Target:
within 2% of 1.0. Every run's status is printed: a container run that is not ok is a finding, not
a missing number.

    DOCKER_HOST=... DLBENCH_BASE_IMAGE=... .venv/bin/python benchmarks/containers.py ratio \\
        [--frameworks torch,tensorflow,jax,mxnet] [--suite cnn] [--benchmark alexnet_r] [--rounds 2]
    .venv/bin/python benchmarks/containers.py build [--frameworks ...]   # each image removed and built from
                                                                          # nothing: seconds and size

The engine is whatever dlbench finds ($DLBENCH_DOCKER, DOCKER_HOST); the store is a temporary one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DLBENCH = str(Path(sys.executable).parent / "dlbench")


def run_once(framework: str, env: str, args, store: Path) -> dict:
    cmd = [DLBENCH, "run", "--suite", args.suite, "--framework", framework, "--benchmark", args.benchmark,
           "--mode", "train", "--env", env, "--profile", args.profile, "--device", "cpu", "--repeats", "1",
           "--no-check", "--no-telemetry", "--store", str(store)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    rows = json.loads(subprocess.run([DLBENCH, "results", "--store", str(store), "--format", "json"],
                                     capture_output=True, text=True, check=True).stdout)
    latest = max(rows, key=lambda r: r.get("started_at") or r.get("run_id"))
    return latest


def ratio(args) -> None:
    results: dict[str, list[tuple[float, float]]] = {}
    for framework in args.frameworks.split(","):
        with tempfile.TemporaryDirectory(prefix="dlbench-containers-") as tmp:
            pairs = []
            for r in range(args.rounds):
                order = ("docker", "venv") if r % 2 == 0 else ("venv", "docker")
                got = {}
                for env in order:
                    row = run_once(framework, env, args, Path(tmp) / env)
                    got[env] = row
                    print(f"{framework} round {r + 1} {env}: {row.get('status')} "
                          f"{row.get('samples_per_s')} samples/s {row.get('reason') or ''}", flush=True)
                if all(got[e].get("status") == "ok" and got[e].get("samples_per_s") for e in got):
                    pairs.append((float(got["docker"]["samples_per_s"]), float(got["venv"]["samples_per_s"])))
            results[framework] = pairs
    print("\nframework | rounds | container samples/s (median) | venv samples/s (median) | ratio median | range")
    for framework, pairs in results.items():
        if not pairs:
            print(f"{framework} | 0 | - | - | - | -")
            continue
        ratios = [d / v for d, v in pairs]
        print(f"{framework} | {len(pairs)} | {statistics.median(d for d, _ in pairs):.2f} | "
              f"{statistics.median(v for _, v in pairs):.2f} | {statistics.median(ratios):.3f} | "
              f"{min(ratios):.3f}-{max(ratios):.3f}")


def build(args) -> None:
    from dlbench.execution.container_engine import ContainerEngine

    engine = ContainerEngine()
    print("framework | seconds | image size (MB) | status")
    for framework in args.frameworks.split(","):
        subprocess.run([DLBENCH, "env", "remove", framework, "--env", "docker"], capture_output=True, text=True)
        started = time.monotonic()
        done = subprocess.run([DLBENCH, "env", "create", framework, "--env", "docker", "--device", "cpu"],
                              capture_output=True, text=True)
        seconds = time.monotonic() - started
        tag = done.stdout.strip().rsplit(": ", 1)[-1] if done.returncode == 0 else None
        size = engine.inspect_images(tag)[0].size_bytes / 1e6 if tag else float("nan")
        print(f"{framework} | {seconds:.0f} | {size:.0f} | {'ok' if done.returncode == 0 else done.stderr[-300:]}",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["ratio", "build"])
    parser.add_argument("--frameworks", default="torch,tensorflow,jax,mxnet")
    parser.add_argument("--suite", default="cnn")
    parser.add_argument("--benchmark", default="alexnet_r")
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    ratio(args) if args.what == "ratio" else build(args)


if __name__ == "__main__":
    main()
