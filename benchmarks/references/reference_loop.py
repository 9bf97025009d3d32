"""What the reference scripts share: their arguments and one plain timing loop. Standard library only,
so that it runs in every framework environment.

A reference script builds the network the way its framework's own model zoo or examples do, then
hands `time_steps` a step and a synchronisation. The loop synchronises after every step, as dlbench's
harness does, so the two sides differ in the model and training code only, not in how they are timed.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", required=True, choices=["resnet50", "lstm32", "gpt2_small", *LLM_NETWORKS])
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--sequence", type=int, default=None,
                    help="tokens per sample for a language model (the suite's per profile; at most its context)")
    ap.add_argument("--llm", type=json.loads, default=None,
                    help="the llm suite's networks: their configuration as JSON (fairness.py's llm_configuration: "
                         "vocabulary, width, layers, heads, kv_heads, hidden, eps, rope_theta, tied, init_std, "
                         "experts, top_k, aux_loss_coefficient, context, params)")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds of measured steps, at least")
    ap.add_argument("--min-iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps after the first")
    ap.add_argument("--learning-rate", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--inputs", help="a canonical .npz (x: images NCHW float32 or token ids; y: labels) to train on "
                                     "instead of the framework's own random batch: the one dlbench's runner gets")
    args = ap.parse_args()
    if (args.network in LLM_NETWORKS) != (args.llm is not None):
        ap.error("--llm is given for the llm suite's networks and for them only")
    return args


def canonical_inputs(args: argparse.Namespace, channels_last: bool = False):
    """(x, y) numpy arrays from --inputs (images NHWC when `channels_last`), or None without it."""
    if not args.inputs:
        return None
    import numpy as np  # every framework environment has it

    with np.load(args.inputs) as data:
        x, y = data["x"], data["y"]
    if channels_last and x.ndim == 4:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    return x, y


# The shapes the suite's descriptions use (suites/networks/resnet50.yaml, lstm32.yaml).
IMAGE, CLASSES = (224, 224, 3), 1000
VOCABULARY, SEQUENCE, EMBEDDING, HIDDEN = 10000, 32, 256, 256
# GPT-2 small (suites/networks/gpt2_small.yaml, HuggingFace's gpt2 configuration): the tables are sized
# for the context, a step runs --sequence positions of it
GPT2 = {"vocabulary": 50257, "context": 1024, "width": 768, "layers": 12, "heads": 12, "dropout": 0.1, "eps": 1e-5}
GPT2_PARAMS = 124_439_808  # the count GPT2LMHeadModel reports, the tied table counted once
# The llm suite's decoders the references build: their configuration comes from the suite's description
# (--llm, written by fairness.py), so that a reference is the same network as dlbench's by construction.
LLM_NETWORKS = ("llama_tiny", "moe_tiny", "smollm2_135m")


def sequence(args: argparse.Namespace) -> int:
    """A language model's tokens per sample: --sequence, else the --inputs batch's, else 128."""
    given = canonical_inputs(args)
    length = args.sequence or (given[0].shape[1] if given is not None else 128)
    if given is not None and given[0].shape[1] != length:
        raise SystemExit(f"--sequence {length} but --inputs holds {given[0].shape[1]} tokens per sample")
    context = args.llm["context"] if args.llm else GPT2["context"]
    if not 0 < length <= context:
        raise SystemExit(f"--sequence {length}: {args.network}'s context is {context}")
    return length


def time_steps(step: Callable[[], object], sync: Callable[[], object], args: argparse.Namespace,
               **facts) -> None:
    """Run one step (compilation), `warmup` more, then time steps until min_iters and min_time;
    print one JSON line: samples/s from the mean step time, and what the script says of itself."""
    step()
    sync()
    for _ in range(args.warmup):
        step()
    sync()
    n, started = 0, time.perf_counter()
    while True:
        step()
        sync()
        n += 1
        elapsed = time.perf_counter() - started
        if n >= args.min_iters and elapsed >= args.min_time:
            break
    result = {"samples_per_s": n * args.batch / elapsed, "mean_s": elapsed / n, "iterations": n}
    if args.network == "gpt2_small" or args.llm:
        result.update(sequence=sequence(args), tokens_per_s=n * args.batch * sequence(args) / elapsed)
        expected = args.llm["params"] if args.llm else GPT2_PARAMS
        if facts.get("params") != expected:  # said, not hidden: the table shows both counts
            result["params_differ"] = f"{facts.get('params')} parameters, not {args.network}'s {expected:,}"
    print(json.dumps({**result, **facts}))
