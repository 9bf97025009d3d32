"""The convergence loop (issue 21), once for every runner: MLPerf Training's timing around the
runner's Trainer (contract.py). Standard library at import; numpy inside the readers.

Order of a run, each step logged in MLLOG (mllog.py):
  cache_clear    the dataset's files dropped from the page cache (datasets.evict_from_page_cache)
  init_start     submission fields, seed, batch, the optimiser's hyper-parameters;
                 runner.prepare_convergence: the network built, the steps compiled (no data touched)
  init_stop      initialisation is timed apart and bounded (`max_init_s`)
  run_start      the clock starts: the splits are read from disk, the framework's pipelines built
                 (train_samples, eval_samples), then epochs of training and, every
                 `eval_every_epochs`, an evaluation (eval_start, eval_accuracy, eval_stop)
  run_stop       at the first evaluation that reaches the target (status success), or after
                 `max_epochs` (status aborted)
Time to target: run_start to run_stop of a successful run. Input-bound share: the time the loop
spent blocked in the pipeline's `next` over the training time (evaluation excluded); with a
framework that dispatches steps asynchronously the device may still be busy meanwhile, so the share
is the host's wait, an upper bound of the device's.
"""

from __future__ import annotations

import math
import time

from runners.common.datasets import evict_from_page_cache, read_split
from runners.common.mllog import MLLogger


def rank_share(total: int, rank: int, world: int) -> slice:
    """Rank `rank`'s contiguous share of `total` items among `world` ranks of a data-parallel run
    (the first `total % world` ranks one more): of each global training batch, which the controller
    checks divides evenly, and of the evaluation split."""
    base, extra = divmod(total, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def learning_rate(step: int, steps_per_epoch: int, optimizer: dict, max_epochs: int) -> float:
    """The rate of training step `step` (0-based over the run): linear warm-up, then the decay
    (definitions/convergence.py: Optimizer says the same)."""
    base = optimizer["learning_rate"]
    warmup = int(round(optimizer["warmup_epochs"] * steps_per_epoch))
    if step < warmup:
        return base * (step + 1) / warmup
    decay = optimizer["decay"]
    epoch = step / steps_per_epoch
    if decay["kind"] == "step":
        return base * decay["factor"] ** sum(epoch >= b for b in decay["boundaries"])
    if decay["kind"] == "cosine":
        start, end = optimizer["warmup_epochs"], max_epochs
        progress = min(max((epoch - start) / (end - start), 0.0), 1.0)
        low = base * decay["final_fraction"]
        return low + (base - low) * 0.5 * (1 + math.cos(math.pi * progress))
    return base


def log_hyperparameters(log: MLLogger, request: dict) -> None:
    opt = request["optimizer"]
    log.event("seed", request["seed"])
    log.event("global_batch_size", request["batch_size"])
    log.event("gradient_accumulation_steps", 1)
    log.event("opt_name", "sgd")
    log.event("opt_base_learning_rate", opt["learning_rate"])
    log.event("opt_momentum", opt["momentum"])  # dlbench's key: MLPerf names momentum per optimiser
    log.event("opt_weight_decay", opt["weight_decay"])
    log.event("opt_learning_rate_warmup_epochs", opt["warmup_epochs"])
    decay = opt["decay"]
    log.event("opt_learning_rate_decay_schedule", decay["kind"])  # dlbench's key: constant | step | cosine
    if decay["kind"] == "step":
        log.event("opt_learning_rate_decay_boundary_epochs", decay["boundaries"])
        log.event("opt_learning_rate_decay_factor", decay["factor"])
    log.event("max_epochs", request["max_epochs"])
    log.event("eval_every_epochs", request["eval_every_epochs"])
    log.event("target_accuracy", request["target"]["value"])
    log.event("augmentation", request["augmentation"])


def run_convergence(runner, request: dict, clock=time.perf_counter) -> dict:
    """One seeded run; the result's `convergence` part (harness.run_request adds the rest)."""
    dataset, folder = request["dataset"], request["data_dir"]
    log = MLLogger(request["mllog"])
    try:
        return _run(runner, request, dataset, folder, log, clock)
    finally:
        log.close()


def _run(runner, request, dataset, folder, log: MLLogger, clock) -> dict:
    cache = evict_from_page_cache(dataset, folder)
    log.event("cache_clear", all(v is True for v in cache.values()), {"files": cache})
    init_started = clock()
    log.start("init_start")
    sub = request["submission"]
    log.event("submission_benchmark", sub["benchmark"])
    log.event("submission_division", sub["division"])
    log.event("submission_org", sub["org"])
    log.event("submission_platform", sub["platform"])
    log.event("submission_status", sub["status"])
    log.event("submission_framework", sub["framework"])  # dlbench's key: the runner and its version
    log_hyperparameters(log, request)
    trainer = runner.prepare_convergence(request)
    init_s = clock() - init_started
    log.end("init_stop")
    out = {"seed": request["seed"], "init_s": init_s, "cache_clear": cache, "params": trainer.params,
           "settings": trainer.settings}
    if init_s > request["max_init_s"]:
        log.start("run_start")
        log.end("run_stop", metadata={"status": "aborted", "reason": "initialisation over its bound"})
        raise RuntimeError(f"initialisation took {init_s:.1f} s, over the task's bound of {request['max_init_s']:g} s")
    try:
        log.start("run_start")
        run_started = clock()
        train, evaluation = read_split(dataset, folder, "train"), read_split(dataset, folder, "eval")
        log.event("train_samples", int(len(train[1])))
        log.event("eval_samples", int(len(evaluation[1])))
        batch = request["batch_size"]
        steps_per_epoch = len(train[1]) // batch
        if steps_per_epoch < 1:
            raise ValueError(f"{len(train[1])} training samples make no batch of {batch}")
        out["pipeline"] = trainer.attach(train, evaluation, request["seed"])
        out["read_s"] = clock() - run_started
        target, cadence, max_epochs = request["target"]["value"], request["eval_every_epochs"], request["max_epochs"]
        evals, epoch_times, step, wait_s, train_s = [], [], 0, 0.0, 0.0
        reached_at = None
        epoch = 0
        for epoch in range(1, max_epochs + 1):
            log.start("epoch_start", metadata={"epoch_num": epoch})
            epoch_started = clock()
            batches = trainer.train_batches(epoch)
            while True:
                asked = clock()
                try:
                    b = next(batches)
                except StopIteration:
                    wait_s += clock() - asked
                    break
                wait_s += clock() - asked
                trainer.train_step(b, learning_rate(step, steps_per_epoch, request["optimizer"], max_epochs))
                step += 1
            trainer.synchronize()
            seconds = clock() - epoch_started
            train_s += seconds
            epoch_times.append(seconds)
            log.end("epoch_stop", metadata={"epoch_num": epoch})
            if epoch % cadence and epoch != max_epochs:
                continue
            log.start("eval_start", metadata={"epoch_num": epoch})
            correct = count = 0
            for b in trainer.eval_batches():
                c, n = trainer.eval_step(b)
                correct, count = correct + int(c), count + int(n)
            correct, count = trainer.across_ranks(correct, count)
            accuracy = correct / count
            log.event("eval_accuracy", accuracy, {"epoch_num": epoch})
            log.end("eval_stop", metadata={"epoch_num": epoch})
            evals.append({"epoch": epoch, "accuracy": accuracy, "time_s": clock() - run_started})
            if accuracy >= target:
                reached_at = epoch
                break
        run_s = clock() - run_started
        status = "success" if reached_at is not None else "aborted"
        log.end("run_stop", metadata={"status": status})
    finally:
        trainer.close()
    out.update(reached=reached_at is not None, epochs=epoch, epochs_to_target=reached_at,
               time_to_target_s=run_s if reached_at is not None else None, run_s=run_s, evals=evals,
               epoch_s=epoch_times, train_s=train_s, input_wait_s=wait_s,
               input_bound_share=wait_s / train_s if train_s > 0 else None, steps=step,
               steps_per_epoch=steps_per_epoch, train_samples=int(len(train[1])),
               eval_samples=int(len(evaluation[1])))
    return out
