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
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DLBENCH = str(Path(sys.executable).parent / "dlbench")


def load_average() -> str:
    """The 1-minute load average: every figure here is printed beside it (this machine is shared)."""
    return Path("/proc/loadavg").read_text().split()[0]


def run_once(framework: str, env: str, args, store: Path) -> dict:
    cmd = [DLBENCH, "run", "--suite", args.suite, "--framework", framework, "--benchmark", args.benchmark,
           "--mode", "train", "--env", env, "--profile", args.profile, "--device", "cpu", "--repeats", "1",
           "--no-check", "--no-telemetry", "--store", str(store)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    # a session of its own, as from a terminal: where the kernel groups tasks by session (autogroup),
    # the venv's worker then weighs one session, not a share of this script's (and its other jobs')
    subprocess.run(cmd, capture_output=True, text=True, timeout=3600, start_new_session=True)
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
                          f"{row.get('samples_per_s')} samples/s load {load_average()} {row.get('reason') or ''}",
                          flush=True)
                if all(got[e].get("status") == "ok" and got[e].get("samples_per_s") for e in got):
                    pairs.append((float(got["docker"]["samples_per_s"]), float(got["venv"]["samples_per_s"])))
            results[framework] = pairs
    print("\nframework | rounds | container samples/s (median) | venv samples/s (median) | ratio median | "
          "95% CI of the median | range")
    for framework, pairs in results.items():
        if not pairs:
            print(f"{framework} | 0 | - | - | - | - | -")
            continue
        ratios = sorted(d / v for d, v in pairs)
        low, high, level = median_interval(ratios)
        print(f"{framework} | {len(pairs)} | {statistics.median(d for d, _ in pairs):.2f} | "
              f"{statistics.median(v for _, v in pairs):.2f} | {statistics.median(ratios):.3f} | "
              f"{low:.3f}-{high:.3f} ({level:.0%}) | {ratios[0]:.3f}-{ratios[-1]:.3f}")


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median of sorted `values`: the order statistics
    values[k] and values[n-1-k] cover it with probability 1 - 2 P(Binomial(n, 1/2) <= k); the largest
    k reaching `level` (with few rounds, k = 0: min and max, their coverage printed beside)."""
    from scipy.stats import binom

    n = len(values)

    def coverage(k: int) -> float:
        return float(1 - 2 * binom.cdf(k, n, 0.5))

    k = 0
    while 2 * (k + 1) < n - 1 and coverage(k + 1) >= level:
        k += 1
    return values[k], values[n - 1 - k], coverage(k)


def build(args) -> None:
    from dlbench.execution.container_engine import ContainerEngine

    engine = ContainerEngine()
    print("framework | seconds | image size (MB) | load average before, after | status")
    for framework in args.frameworks.split(","):
        subprocess.run([DLBENCH, "env", "remove", framework, "--env", "docker"], capture_output=True, text=True)
        load_before = load_average()
        started = time.monotonic()
        done = subprocess.run([DLBENCH, "env", "create", framework, "--env", "docker", "--device", "cpu"],
                              capture_output=True, text=True)
        seconds = time.monotonic() - started
        tag = done.stdout.strip().rsplit(": ", 1)[-1] if done.returncode == 0 else None
        size = engine.inspect_images(tag)[0].size_bytes / 1e6 if tag else float("nan")
        print(f"{framework} | {seconds:.0f} | {size:.0f} | {load_before}, {load_average()} | {'ok' if done.returncode == 0 else done.stderr[-300:]}",
              flush=True)


# One worker of `share`: THREADS processes each spinning for SECONDS; prints the CPU seconds they got.
_SPIN = """
import multiprocessing as mp, os, sys, time
def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
threads, seconds = int(sys.argv[1]), float(sys.argv[2])
procs = [mp.Process(target=spin, args=(seconds,)) for _ in range(threads)]
[p.start() for p in procs]
[p.join() for p in procs]
t = os.times()
print(t.children_user + t.children_system)
"""


def share(args) -> None:
    """CPU seconds a container's worker gets against the same worker on the host, both running at
    once beside `--load` spinning host processes: 1.0 where the container weighs what its threads
    weigh on the host. Once as dlbench ran containers before (the engine's own cgroup), once with the
    placement dlbench now asks for (the caller's cgroup, the threads' weight)."""
    from dlbench.execution.containers import cpu_placement
    from dlbench.execution.container_engine import ContainerEngine

    engine = ContainerEngine()
    placed = cpu_placement(engine)
    print(f"placement now: {placed.describe()}")
    variants = {"engine default": [], "dlbench placement": placed.options(args.threads, os.nice(0))}
    print("round | variant | container CPU s | host CPU s | container / host | load average")
    ratios: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for variant, options in (variants.items() if r % 2 == 0 else reversed(variants.items())):
            # the load: processes of other sessions (another user's jobs), each its own autogroup
            load = [subprocess.Popen([sys.executable, "-c", _SPIN, "1", str(args.seconds + 2)], start_new_session=True,
                                     stdout=subprocess.DEVNULL) for _ in range(args.load)]
            # other containers of the same engine (another benchmark, a build's RUN step), in its own cgroup
            rivals = [subprocess.Popen(engine.command("run", "--rm", "--network", "none", "--entrypoint", "python3",
                                                      args.image, "-c", _SPIN, "1", str(args.seconds + 2)),
                                       stdout=subprocess.DEVNULL) for _ in range(args.rival_containers)]
            container = subprocess.Popen(engine.command("run", "--rm", "--init", "--network", "none", *options,
                                                        "--entrypoint", "python3", args.image, "-c", _SPIN,
                                                        str(args.threads), str(args.seconds)),
                                         stdout=subprocess.PIPE, text=True)
            time.sleep(0.5)  # the container's start (its client's round trips), so both spin side by side
            host = subprocess.run([sys.executable, "-c", _SPIN, str(args.threads), str(args.seconds)],
                                  stdout=subprocess.PIPE, text=True)
            out, _ = container.communicate()
            for p in load + rivals:
                p.wait()
            c, h = float(out.strip().splitlines()[-1]), float(host.stdout.strip())
            ratios[variant].append(c / h)
            print(f"{r + 1} | {variant} | {c:.2f} | {h:.2f} | {c / h:.2f} | {load_average()}", flush=True)
    for variant, values in ratios.items():
        print(f"{variant}: median container/host {statistics.median(values):.2f} "
              f"(range {min(values):.2f}-{max(values):.2f}, {len(values)} rounds)")


# One framework's float32 512^3 matrix product, repeated for SECONDS: products per CPU-second of the
# process (all its threads) and per second. Per CPU-second is what the environment costs the work
# itself, whatever share of the machine the process got.
_MATMUL = {
    "torch": "import torch; a = torch.rand(512, 512); b = torch.rand(512, 512)\ndef step(): torch.mm(a, b)",
    "tensorflow": "import tensorflow as tf; a = tf.random.uniform((512, 512)); b = tf.random.uniform((512, 512))\n"
                  "def step(): tf.linalg.matmul(a, b).numpy()",
    "jax": "import jax, jax.numpy as jnp; a = jnp.ones((512, 512)); b = jnp.ones((512, 512))\n"
           "def step(): jnp.dot(a, b).block_until_ready()",
    "mxnet": "import mxnet as mx; a = mx.nd.ones((512, 512)); b = mx.nd.ones((512, 512))\n"
             "def step(): mx.nd.dot(a, b).wait_to_read()",
}
_TIMED = """
import sys, time
{setup}
seconds = float(sys.argv[1])
step()
c0, w0, n = time.process_time(), time.perf_counter(), 0
while time.perf_counter() - w0 < seconds:
    step()
    n += 1
print(n / (time.process_time() - c0), n / (time.perf_counter() - w0))
"""


def efficiency(args) -> None:
    """Products per CPU-second in the image and in the venv, alternated (ABBA), with the median of
    the per-round ratios: what running in a container costs the computation itself."""
    from dlbench.execution.backends import backend
    from dlbench.execution.registry import RunnerRegistry
    from dlbench import paths

    registry = RunnerRegistry(paths.runners_dir())
    print("framework | round | container per CPU-s | venv per CPU-s | ratio | container per s | venv per s | load")
    for framework in args.frameworks.split(","):
        runner = registry.get(framework)
        venv = backend("venv", paths.cache_dir()).existing(runner, "cpu")
        image = backend("docker", paths.cache_dir()).existing(runner, "cpu")
        if venv is None or image is None:
            print(f"{framework} | - | no {'venv' if venv is None else 'image'}: build it first")
            continue
        code = _TIMED.format(setup=_MATMUL[framework])
        threads = str(args.threads)
        env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        container = image.container
        ratios = []
        for r in range(args.rounds):
            got = {}
            for side in (("docker", "venv") if r % 2 == 0 else ("venv", "docker")):
                if side == "venv":
                    cmd = [str(venv.python), "-c", code, str(args.seconds)]
                else:
                    cmd = container.engine.command(
                        "run", "--rm", *container.run_options(), *container.cpu.options(args.threads, os.nice(0)),
                        *[x for k, v in env.items() for x in ("--env", f"{k}={v}")], "--env", "HOME=/tmp",
                        "--entrypoint", str(image.python), container.image, "-c", code, str(args.seconds))
                done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env},
                                      start_new_session=True)
                line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
                if done.returncode != 0 or not line:
                    raise SystemExit(f"{framework} {side}: exit {done.returncode}: {done.stderr[-500:]}")
                got[side] = [float(x) for x in line.split()]
            ratio_r = got["docker"][0] / got["venv"][0]
            ratios.append(ratio_r)
            print(f"{framework} | {r + 1} | {got['docker'][0]:.1f} | {got['venv'][0]:.1f} | {ratio_r:.3f} | "
                  f"{got['docker'][1]:.1f} | {got['venv'][1]:.1f} | {load_average()}", flush=True)
        ratios.sort()
        low, high, level = median_interval(ratios)
        print(f"{framework}: per CPU-second, container / venv median {statistics.median(ratios):.3f}, "
              f"{low:.3f}-{high:.3f} ({level:.0%} interval of the median), {len(ratios)} rounds", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["ratio", "build", "share", "efficiency"])
    parser.add_argument("--frameworks", default="torch,tensorflow,jax,mxnet")
    parser.add_argument("--suite", default="cnn")
    parser.add_argument("--benchmark", default="alexnet_r")
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)  # share: 2 where not given
    parser.add_argument("--load", type=int, default=4, help="share: spinning host processes beside the pair")
    parser.add_argument("--rival-containers", type=int, default=0,
                        help="share: spinning containers of the same engine, placed by the engine, beside the pair")
    parser.add_argument("--seconds", type=float, default=10.0, help="share: how long each worker spins")
    parser.add_argument("--image", default="dlbench/base:bookworm-local", help="share: an image with python3")
    args = parser.parse_args()
    if args.what in ("share", "efficiency") and not args.threads:
        args.threads = 2
    {"ratio": ratio, "build": build, "share": share, "efficiency": efficiency}[args.what](args)


if __name__ == "__main__":
    main()
