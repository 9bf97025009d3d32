"""The decoder and Mixture-of-Experts kernels (RMSNorm, rotary, SwiGLU, grouped-query attention, the
MoE router and the experts' products) timed in every framework at the llm suite's CPU default
shapes, beside what the performance model predicts for each from a machine profile that has not
measured that shape (its class fits, else the roofline at the profile's ceilings): how far the
model is off on a new operation until the kernels suite has timed it (once timed, the model takes
the measured median). Both sides are a kernel called alone, timed cold (the kernels suite's
default): the prediction is the eager one, the framework's smallest-operation call added to the
work, that call as calibrate timed it cold (`dispatch_cold_s`; inside a compiled step the model
leaves the call out, and the kernel timed alone could not be compared with that).

Shapes (the llm suite's default profile on a CPU): smollm2_135m at 2 x 128 tokens (256 rows of
576; 9 query and 3 key/value heads of 64; SwiGLU 1,536) and moe_tiny at 16 x 64 tokens (1,024
rows of 64; 4 query and 2 key/value heads of 16; 4 experts of 128, top 2).

Usage: .venv/bin/python benchmarks/decoder_kernels.py --store STORE [--framework torch ...]
  (STORE holds the machine profile of `dlbench calibrate`; the kernels run with the kernels
  suite's default policy, cold caches, one worker per framework, one thread per worker unless
  --threads says otherwise.)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from dlbench import paths
from dlbench.execution.environments import VenvBackend
from dlbench.execution.kernels import kernel_request
from dlbench.execution.launcher import run_worker
from dlbench.execution.registry import RunnerRegistry
from dlbench.machine import fingerprint
from dlbench.performance.kernel_suite import KernelPolicy
from dlbench.performance.kernels import KernelSpec
from dlbench.performance.model import class_fits, op_time
from dlbench.performance.workload import Op
from dlbench.store.profiles import ProfileStore
from dlbench.store.store import Store

SMOLLM = dict(rows=256, dim=576, hidden=1536, batch=2, steps=128, heads=9, kv_heads=3, head_size=64)
MOE = dict(rows=1024, dim=64, hidden=128, batch=16, steps=64, heads=4, kv_heads=2, head_size=16, experts=4, top_k=2)


def specs() -> list[tuple[str, KernelSpec]]:
    out = []
    for name, s in (("smollm2_135m", SMOLLM), ("moe_tiny", MOE)):
        head = dict(batch=s["batch"], heads=s["heads"], kv_heads=s["kv_heads"], head_size=s["head_size"])
        out += [(name, KernelSpec.of("rms_norm_fwd", rows=s["rows"], dim=s["dim"])),
                (name, KernelSpec.of("rms_norm_bwd", rows=s["rows"], dim=s["dim"], input_grad=1)),
                (name, KernelSpec.of("rotary_fwd", steps=s["steps"], **head)),
                (name, KernelSpec.of("rotary_bwd", steps=s["steps"], **head)),
                (name, KernelSpec.of("grouped_attention_fwd", steps=s["steps"], causal=1, **head)),
                (name, KernelSpec.of("grouped_attention_bwd", steps=s["steps"], causal=1, **head))]
        if name == "smollm2_135m":
            out += [(name, KernelSpec.of("swiglu_fwd", rows=s["rows"], dim=s["dim"], hidden=s["hidden"])),
                    (name, KernelSpec.of("swiglu_bwd", rows=s["rows"], dim=s["dim"], hidden=s["hidden"], input_grad=1))]
        else:
            moe = dict(dim=s["dim"], experts=s["experts"], top_k=s["top_k"])
            out += [(name, KernelSpec.of("moe_router_fwd", rows=s["rows"], **moe)),
                    (name, KernelSpec.of("moe_router_bwd", rows=s["rows"], **moe)),
                    (name, KernelSpec.of("moe_experts_fwd", tokens=s["rows"], hidden=s["hidden"], **moe)),
                    (name, KernelSpec.of("moe_experts_bwd", tokens=s["rows"], hidden=s["hidden"], **moe))]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--framework", action="append", default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    registry = RunnerRegistry(paths.runners_dir())
    profile = ProfileStore(Store(args.store)).latest_matching(fingerprint()["machine_id"], "cpu", args.threads)
    if profile is None:
        raise SystemExit(f"no machine profile of this machine in {args.store}: run `dlbench calibrate` first")
    policy = KernelPolicy(warmup_iters=2, min_iters=5, min_time_s=0.2, max_iters=1000, repeats=1, cache="cold")
    chosen = specs()
    print(f"profile {profile.ref}; policy {policy.model_dump()}; threads {args.threads}")
    print(f"{'framework':<11} {'network':<13} {'kernel':<80} {'measured ms':>12} {'model ms':>10} {'model/measured':>15}")
    for framework in args.framework or sorted(registry.names()):
        runner = registry.get(framework)
        env = VenvBackend(paths.cache_dir()).ensure(runner, "cpu")
        outcome = run_worker(env.python, runner.worker,
                             kernel_request([s for _, s in chosen], policy, "cpu", args.threads), timeout_s=1800)
        if outcome.status != "ok":
            print(f"{framework}: {outcome.status}: {outcome.reason}")
            continue
        classes = class_fits(profile, framework, compiled=False)
        ratios = []
        for (network, spec), result in zip(chosen, outcome.result["kernels"]):
            if result["status"] != "ok":
                print(f"{framework:<11} {network:<13} {spec.key:<80} {result['status']}: {result.get('reason')}")
                continue
            if not result["median_s"]:  # a backward timed with its forward: the difference lost in the noise
                print(f"{framework:<11} {network:<13} {spec.key:<80} {'0 (backward - forward)':>12}")
                continue
            predicted, _, _ = op_time(Op(spec.key, spec.flops, spec.bytes, spec), framework, profile, {}, False,
                                      classes=classes)
            # the kernel was timed cold: its call too (op_time's eager call is the warm one)
            predicted += profile.dispatch_cold_s.get(framework, 0.0) - profile.dispatch_s.get(framework, 0.0)
            ratio = predicted / result["median_s"]
            ratios.append(ratio)
            print(f"{framework:<11} {network:<13} {spec.key:<80} {result['median_s'] * 1e3:>12.3f} "
                  f"{predicted * 1e3:>10.3f} {ratio:>15.2f}")
        if ratios:
            print(f"{framework}: model/measured median {statistics.median(ratios):.2f}, "
                  f"range {min(ratios):.2f} .. {max(ratios):.2f} over {len(ratios)} kernels")


if __name__ == "__main__":
    main()
