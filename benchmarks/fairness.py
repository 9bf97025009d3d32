"""Is dlbench's runner as fast as the framework's own model? Runner throughput ÷ reference throughput.

For ResNet-50, LSTM-32, GPT-2 small and the llm suite's decoders (llama_tiny, smollm2_135m, moe_tiny) training, each framework's dlbench runner (built from the
suite's framework-neutral description) is set against that framework's own reference model, written
the way the framework's model zoo or examples write it (benchmarks/references/<fw>_reference.py):

    torch       torchvision.models.resnet50 (a hand-written torchvision-style model where torchvision
                cannot be imported), torch.nn LSTM, transformers' GPT2LMHeadModel(GPT2Config(...))
                with attn_implementation="sdpa"
    tensorflow  keras.applications.ResNet50, keras LSTM layers, keras_hub's GPT2CausalLM on a
                GPT2Backbone (the tied head: the token embedding's reverse); GradientTape in a tf.function
    jax         flax linen ResNet-50 as in flax's ImageNet example, nn.RNN(OptimizedLSTMCell), a linen
                GPT-2 as flax's lm1b example writes its decoder (MultiHeadDotProductAttention, Embed.attend);
                TrainState + optax.sgd(momentum), one jitted step with the state donated
    mxnet       gluon model_zoo resnet50_v1, gluon rnn.LSTM, a Gluon GPT-2 written as GluonNLP's GPT2Model
                (GluonNLP 0.10 ships none in its package), hybridised with static allocation

The llm suite's decoders: transformers' LlamaForCausalLM / MixtralForCausalLM (torch; the
transformers of the torch environment), keras_hub's LlamaCausalLM / MixtralCausalLM (tensorflow), a
flax linen Llama as flax's examples write one (jax; its MoE by jax.lax.ragged_dot) and a Gluon Llama as
GluonNLP's GPT2Model is written (mxnet), each built from llm_configuration: the suite's description
read here and passed as JSON (--llm), so that both sides are the same network by construction.

GPT-2 small is built from its configuration only (random initialisation: no weights are downloaded),
at the suite's sequence length for the profile and device (default CPU: batch 2, 128 tokens; its
position table keeps the 1,024 context; `--sequence gpt2_small=T` for another), in fp32, with
dropout 0.1 as the suite's, SGD with the suite's momentum and the suite's loss (mean cross-entropy
at every position against the given labels); throughput is also given in tokens/s. transformers and
keras_hub are not in the runners' environments (CI builds those): references/requirements-<fw>.txt
pins what a reference needs beyond its environment, installed on first use with `pip install
--no-deps --target` into ~/.cache/dlbench/references/<fw>-<hash> (keyed by the file and the
environment) and put on PYTHONPATH for the reference process only.

Both sides run in the same framework environment (the venv dlbench builds), with the same batch,
threads and OpenMP variables, train on the same data (one canonical batch drawn here, given to
dlbench's worker as its `inputs` and to the reference as `--inputs`: the step time can depend on
the data; on MXNet ResNet-50 at batch 4 the reference trained on dlbench's draw of labels took
807-826 ms/step, on its own draw 554-565, in the same quiet minutes) and synchronise after every
step. Rounds alternate the two sides, and which of them goes first (ABBA), so that this machine's
drift hits both alike; the figure is the median of the paired ratios of mean step times. Target:
>= 0.97 for every framework.

    .venv/bin/python benchmarks/fairness.py [--framework all|torch,jax,...] [--network resnet50,lstm32,gpt2_small]
                                            [--rounds 3] [--threads N] [--device cpu|cuda]
                                            [--batch NETWORK=B] [--sequence NETWORK=T] [--json FILE]
    e.g. --network llama_tiny,moe_tiny,smollm2_135m --sequence smollm2_135m=32

The references differ where the framework's own model differs from the suite (keras' ResNet50 has
conv biases; gluon's resnet50_v1 strides its first 1x1 convolution, so does a little less work;
transformers' gpt2 configuration computes its tanh GELU in five element-wise operations, "gelu_new",
where dlbench's runner calls torch's fused one, DLBENCH_REFERENCE_GPT2_GELU=gelu_pytorch_tanh
gives the reference the same); the parameter count of each side is printed so that such differences
stay visible (GPT-2 small: 124,439,808 on every side, the tied table counted once).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from dlbench import paths
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.loader import load_network
from dlbench.execution.environments import EnvironmentBuildError
from dlbench.execution.equivalence import make_inputs
from dlbench.execution.orchestrator import Orchestrator, PlannedRun, RunOptions
from dlbench.execution.registry import RunnerRegistry
from dlbench.machine import available_cpus
from dlbench.store.store import Store

REFERENCES = Path(__file__).resolve().parent / "references"


def reference_frameworks() -> list[str]:
    """The runners (runners/*/runner.toml) that have a reference script, references/<fw>_reference.py."""
    scripts = {p.name.removesuffix("_reference.py") for p in REFERENCES.glob("*_reference.py")}
    return [name for name in RunnerRegistry(paths.runners_dir()).names() if name in scripts]


FRAMEWORKS = reference_frameworks()
NETWORKS = {"resnet50": "cnn", "lstm32": "rnn", "gpt2_small": "transformer",
            "llama_tiny": "llm", "moe_tiny": "llm", "smollm2_135m": "llm"}
LLM = ("llama_tiny", "moe_tiny", "smollm2_135m")  # their references are built from llm_configuration's JSON
TARGET = 0.97
# Networks whose references import packages the runner's environment does not have (transformers 5.24
# for GPT-2, keras_hub): references/requirements-<fw>.txt, installed on first use by reference_packages.
# The llm suite's torch reference uses the transformers the torch environment has (5.23.0).
NEEDS_PACKAGES = {"gpt2_small": {"torch", "tensorflow"}, **{name: {"tensorflow"} for name in LLM}}
# untimed reference steps after the first (which compiles), where the script's default 5 is minutes:
# a GPT-2 step takes seconds on a CPU, and dlbench's own warm-up takes at least 2 (profiles.yaml)
REFERENCE_WARMUP = {"gpt2_small": 2, "smollm2_135m": 2}
# what must import from that folder in the runner's environment before a reference is timed
PACKAGE_IMPORTS = {"torch": "from transformers import GPT2Config, GPT2LMHeadModel",
                   "tensorflow": "from keras_hub.models import GPT2Backbone"}


def clean_environment() -> dict:
    """os.environ without what would put another interpreter's packages on the reference's path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def reference_packages(framework: str, env, console: Console) -> Path | None:
    """The folder holding references/requirements-<fw>.txt's pinned packages for `env`'s interpreter,
    installed there on first use (`pip install --no-deps --target`: the file names every package the
    reference needs that the runner's environment lacks, so nothing of the environment's own, torch,
    numpy or keras, is installed a second time or shadowed), then checked to import; None where the
    framework's references need nothing beyond its environment. Kept apart from the environment (CI
    builds those and need not install these) under the cache, keyed by the file and the environment."""
    requirements = REFERENCES / f"requirements-{framework}.txt"
    if not requirements.exists():
        return None
    key = hashlib.sha256(requirements.read_bytes() + env.key.encode() + str(env.python).encode()).hexdigest()[:16]
    target = paths.cache_dir() / "references" / f"{framework}-{key}"
    if (target / ".complete").exists():
        return target
    console.print(f"  {framework}: installing {requirements.name} into {target}", highlight=False)
    building = target.with_name(target.name + f".building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    out = subprocess.run([str(env.python), "-m", "pip", "install", "--no-deps", "--no-compile", "--target",
                          str(building), "-r", str(requirements)], capture_output=True, text=True,
                         env=clean_environment(), timeout=1800, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{framework}: pip could not install {requirements}:\n{out.stderr[-3000:]}")
    if framework in PACKAGE_IMPORTS:
        probe = subprocess.run([str(env.python), "-c", PACKAGE_IMPORTS[framework]], capture_output=True, text=True,
                               env={**clean_environment(), "PYTHONPATH": str(building)}, timeout=600, cwd=building,
                               check=False)
        if probe.returncode != 0:
            raise SystemExit(f"{framework}: {requirements.name} installed but `{PACKAGE_IMPORTS[framework]}` fails "
                             f"in {env.python}:\n{probe.stderr[-3000:]}")
    (building / ".complete").write_text(requirements.read_text())
    shutil.rmtree(target, ignore_errors=True)
    building.rename(target)
    return target


def llm_configuration(network) -> dict:
    """The llm suite's decoder as the references' --llm JSON, read from the resolved description: every
    llama_block alike (the suite's are), the MoE's routing where the blocks have one. A description
    these fields do not cover (a capacity factor, rotary scaling, blocks that differ) is refused, so that
    a reference is never a different network than dlbench's."""
    layers = network.resolved["layers"]
    embedding, blocks = layers[0], [layer for layer in layers if layer["type"] == "llama_block"]
    head = next(layer for layer in layers if layer["type"] == "lm_head")
    block = blocks[0]
    if any({k: v for k, v in b.items() if k not in ("in_shape", "out_shape")}
           != {k: v for k, v in block.items() if k not in ("in_shape", "out_shape")} for b in blocks):
        raise SystemExit(f"{network.name}: its llama_blocks differ; the references build identical ones")
    moe = block["moe"]
    if block["rope_scaling"] is not None or (moe and moe["capacity_factor"] is not None):
        raise SystemExit(f"{network.name}: rotary scaling and capacity factors are not built by the references")
    source = Path(paths.suites_dir()) / "networks" / f"{network.name}.yaml"
    context = load_network(source).resolved["input"]["sequence_length"]  # the description's own, not the profile's
    return {"name": network.name, "vocabulary": embedding["vocabulary"], "width": embedding["dim"],
            "init_std": embedding["init_std"], "layers": len(blocks), "heads": block["heads"],
            "kv_heads": block["kv_heads"], "hidden": block["hidden"], "eps": block["eps"],
            "rope_theta": block["rope_theta"], "tied": head["tied"], "context": context,
            "experts": moe["experts"] if moe else 0, "top_k": moe["top_k"] if moe else 0,
            "aux_loss_coefficient": moe["aux_loss_coefficient"] if moe else 0.0,
            "params": network.resolved["params"]}


def compare(framework: str, network: str, args, console: Console) -> dict:
    catalog = SuiteCatalog(paths.suites_dir())
    suite = catalog.load_suite(catalog.suite_path(NETWORKS[network]), "default", args.device, ("train",))
    bench = next(b for b in suite.benchmarks if b.network.name == network)
    if network in args.sequence:  # the network at another length than the suite's
        bench = dataclasses.replace(bench, network=load_network(Path(bench.network_file), args.sequence[network]))
    batch = args.batch.get(network) or bench.batch_sizes[0]
    language_model = network == "gpt2_small" or network in LLM
    tokens = bench.network.resolved["input"].get("sequence_length") if language_model else None
    runner = RunnerRegistry(paths.runners_dir()).get(framework)
    measure = bench.policy.measure
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "inputs.npz"
        np.savez(inputs, **make_inputs(bench.network, batch))  # the canonical batch `dlbench check` uses
        options = RunOptions(device=args.device, env_backend="venv", threads=args.threads, repeats=1,
                             timeout_s=1800, cache=paths.cache_dir(), inputs=inputs)
        orch = Orchestrator(Store(Path(tmp)), options)
        env = orch.environment(runner)
        if isinstance(env, EnvironmentBuildError):
            raise SystemExit(f"{framework}: environment could not be built: {env}")
        command = [str(env.python), str(REFERENCES / f"{framework}_reference.py"), "--network", network,
                   "--batch", str(batch), "--threads", str(args.threads), "--device", args.device,
                   "--min-time", str(measure.min_time_s), "--min-iters", str(measure.min_iters),
                   "--learning-rate", str(bench.learning_rate), "--momentum", str(bench.momentum),
                   "--inputs", str(inputs)] + (["--sequence", str(tokens)] if tokens else [])
        if network in LLM:
            command += ["--llm", json.dumps(llm_configuration(bench.network))]
        if network in REFERENCE_WARMUP:
            command += ["--warmup", str(REFERENCE_WARMUP[network])]
        # the variables dlbench gives its workers, so both sides get the same OpenMP pools
        ref_env = {**clean_environment(), "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
        needs = framework in NEEDS_PACKAGES.get(network, ())
        packages = reference_packages(framework, env, console) if needs else None
        if packages is not None:  # the reference-only packages, for the reference process alone
            ref_env["PYTHONPATH"] = str(packages)
        ratios, ours, theirs, reference = [], [], [], {}
        def ours_run():
            record = orch.execute_one(PlannedRun(runner, bench, batch))
            if record.status != "ok":
                raise SystemExit(f"{framework} {network}: dlbench run {record.status}: {record.reason}\n"
                                 f"{record.output_tail}")
            return record

        def reference_run():
            out = subprocess.run(command, capture_output=True, text=True, env=ref_env, timeout=1800)
            if out.returncode != 0:
                raise SystemExit(f"{framework} {network}: reference failed:\n{out.stderr[-3000:]}")
            return json.loads(out.stdout.strip().splitlines()[-1])

        for i in range(args.rounds):
            # ABBA: the side that goes first alternates, so a load that rises or falls over the rounds
            # (other jobs on the machine) is not always met by the same side second
            if i % 2 == 0:
                record, reference = ours_run(), reference_run()
            else:
                reference, record = reference_run(), ours_run()
            # the reference gives a mean step time: compare dlbench's mean with it, like for like
            ours.append(batch / record.summary.mean_s)
            theirs.append(reference["samples_per_s"])
            ratios.append(ours[-1] / theirs[-1])
            per_token = f" ({ours[-1] * tokens:.1f} / {theirs[-1] * tokens:.1f} tokens/s)" if tokens else ""
            console.print(f"  {framework} {network} round {i + 1}: dlbench {ours[-1]:8.3f} samples/s, "
                          f"reference {theirs[-1]:8.3f}{per_token}, ratio {ratios[-1]:.3f}", highlight=False)
    return {"framework": framework, "network": network, "batch": batch, "sequence": tokens,
            "ratio": statistics.median(ratios),
            "low": min(ratios), "high": max(ratios), "ours": statistics.median(ours),
            "theirs": statistics.median(theirs), "params_ours": record.params,
            "params_theirs": reference["params"], "reference": reference["model"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", default="all", help="all, or a comma list of " + ", ".join(FRAMEWORKS))
    ap.add_argument("--network", default="resnet50,lstm32", help="comma list of " + ", ".join(NETWORKS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=available_cpus())
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch", action="append", default=[], metavar="NETWORK=B",
                    help="batch size for a network (default: the default profile's for the device)")
    ap.add_argument("--sequence", action="append", default=[], metavar="NETWORK=T",
                    help="tokens per sample for a language model (default: the suite's for the profile and device)")
    ap.add_argument("--json", type=Path, help="also write the table here as JSON")
    args = ap.parse_args()
    frameworks = tuple(FRAMEWORKS) if args.framework == "all" else tuple(args.framework.split(","))
    networks = tuple(args.network.split(","))
    for name in frameworks:
        if name not in FRAMEWORKS:
            ap.error(f"unknown framework {name!r}; the runners with a reference script: {', '.join(FRAMEWORKS)}")
    for name in networks:
        if name not in NETWORKS:
            ap.error(f"unknown network {name!r}")
    args.batch = {k: int(v) for k, v in (item.split("=", 1) for item in args.batch)}
    args.sequence = {k: int(v) for k, v in (item.split("=", 1) for item in args.sequence)}
    console = Console(stderr=True)
    rows = [compare(fw, net, args, console) for net in networks for fw in frameworks]

    table = Table(title=f"dlbench runner ÷ framework reference, training, {args.device}, {args.threads} threads, "
                        f"median of {args.rounds} paired rounds")
    for col in ("framework", "network", "batch", "sequence", "dlbench samples/s", "reference samples/s",
                "tokens/s dlbench / reference", "ratio", "range", "params dlbench / reference", "reference model"):
        table.add_column(col)
    for r in rows:
        ok = r["ratio"] >= TARGET
        seq = r["sequence"]
        table.add_row(r["framework"], r["network"], str(r["batch"]), str(seq or ""), f"{r['ours']:.3f}",
                      f"{r['theirs']:.3f}", f"{r['ours'] * seq:.1f} / {r['theirs'] * seq:.1f}" if seq else "",
                      f"[{'green' if ok else 'red'}]{r['ratio']:.3f}[/]", f"{r['low']:.3f}-{r['high']:.3f}",
                      f"{r['params_ours']:,} / {r['params_theirs']:,}", r["reference"])
    Console(width=max(Console().width, 220)).print(table)
    missed = [f"{r['framework']} {r['network']}" for r in rows if r["ratio"] < TARGET]
    print(f"target >= {TARGET}: " + ("met by every runner" if not missed else "NOT met by " + ", ".join(missed)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
