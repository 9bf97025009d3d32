"""The data-parallel convergence runs of one or more stores (`dlbench run --suite convergence
--workers N --compression ...`) as a markdown table: per framework, task, workers and link, each
method's seeds (time to target, epochs, megabytes rank 0's link port carried over the job) and its
score against the dense run of its invocation (convergence.against_dense), a seed that missed the
target said so; then rank 0's bytes on the wire per training step (over every seed: the job's
bytes, initialisation and evaluations included, over its steps) beside the method's analytical
bytes per rank and step (distributed.exchange). No framework needed.
Usage: .venv/bin/python benchmarks/convergence_compression.py STORE [STORE...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dlbench.store.store import Store


def seed_cell(run) -> str:
    if run.status != "ok":
        return f"{run.status}"
    wire = f", {run.wire_sent_bytes[0] / 1e6:.1f} MB" if run.wire_sent_bytes else ""
    if not run.reached:
        return f"missed ({run.epochs} ep{wire})"
    return f"{run.time_to_target_s:.1f} s ({run.epochs} ep{wire})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("stores", type=Path, nargs="+")
    records = [r for s in parser.parse_args().stores for r in Store(s).records()
               if r.convergence is not None and r.distributed is not None]
    records.sort(key=lambda r: (r.framework.get("name"), r.benchmark, r.workload.compression != "none",
                                r.started_at))
    seeds = max((len(r.convergence.runs) for r in records), default=0)
    print("| framework | benchmark | method | status | " + " | ".join(f"seed {i}" for i in range(seeds))
          + " | score (s) | × dense (score) | × dense (per seed) |")
    print("|---" * (7 + seeds) + "|")
    wire_rows = []
    for r in records:
        c = r.convergence
        d = c.against_dense
        per_seed = " ".join(f"{s.speedup:.2f}" if s.speedup is not None else "–" for s in d.seeds) if d else ""
        cells = [seed_cell(run) for run in c.runs] + [""] * (seeds - len(c.runs))
        score = f"{c.score_s:.1f}" if c.score_s is not None else "–"
        against = f"{d.score_speedup:.2f}" if d and d.score_speedup is not None else "–"
        print(f"| {r.framework.get('name')} | {r.benchmark} | {r.workload.compression} | {r.status} | "
              + " | ".join(cells) + f" | {score} | {against} | {per_seed} |")
        sent = [(run.wire_sent_bytes[0], run.steps) for run in c.runs if run.wire_sent_bytes and run.steps]
        exchange = r.distributed.exchange
        if sent and exchange is not None:
            per_step = sum(b for b, _ in sent) / sum(n for _, n in sent)
            wire_rows.append(f"| {r.framework.get('name')} | {r.workload.compression} | {per_step / 1e3:,.1f} | "
                             f"{exchange.bytes_per_rank / 1e3:,.1f} | {per_step / exchange.bytes_per_rank:.3f} |")
    if wire_rows:
        print("\n| framework | method | on the wire per step (kB, rank 0) | analytical per rank (kB) | ratio |")
        print("|---|---|---|---|---|")
        print("\n".join(wire_rows))


if __name__ == "__main__":
    main()
