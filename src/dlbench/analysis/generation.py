"""What a generate run's requests say: time to first token, time per output token and tokens/s.

A generate repeat measures whole requests (runners/common/harness.py: measure_generation): a
prefill, whose time is the request's TTFT, then new_tokens - 1 decode steps, whose mean is its TPOT
(MLPerf's definition: (latency - TTFT) / (output tokens - 1)). A request's tokens/s is batch x
new_tokens / its time. Each quantity is summarised over every measured request of every ok repeat
(pooled, as the run's summary pools iterations), with its percentiles (the tail a user of a service
sees: MLPerf states its LLM latency bounds at the 99th percentile) and the repeats' own medians, so
that process-to-process spread stays visible beside the pooled figures.
"""

from __future__ import annotations

import numpy as np

from ..store.record import Distribution, GenerationSummary, Repeat


def distribution(per_repeat: list[list[float]], unit: str) -> Distribution | None:
    """Median, mean, spread and percentiles of the pooled values; None when there are none."""
    pooled = np.array([v for values in per_repeat for v in values], dtype=np.float64)
    if pooled.size == 0:
        return None
    q1, median, q3, p90, p99 = np.percentile(pooled, [25, 50, 75, 90, 99])
    return Distribution(unit=unit, requests=int(pooled.size), median=float(median), mean=float(pooled.mean()),
                        stdev=float(pooled.std(ddof=1)) if pooled.size > 1 else 0.0, min=float(pooled.min()),
                        max=float(pooled.max()), q1=float(q1), q3=float(q3), p90=float(p90), p99=float(p99),
                        repeat_medians=[float(np.median(values)) for values in per_repeat if values])


def summarise_generation(repeats: list[Repeat], prompt_length: int, new_tokens: int,
                         batch_size: int) -> GenerationSummary:
    """The record's `generation`, over the ok repeats' measured requests."""
    measured = [r for r in repeats if r.status == "ok" and r.generation and r.iter_s]
    ttft = [list(r.generation["ttft_s"]) for r in measured]
    tpot = [list(r.generation["tpot_s"]) for r in measured]
    rates = [[batch_size * new_tokens / t for t in r.iter_s] for r in measured]
    firsts = [r.generation["first_ttft_s"] for r in measured if r.generation.get("first_ttft_s") is not None]
    return GenerationSummary(prompt_length=prompt_length, new_tokens=new_tokens, batch_size=batch_size,
                             ttft=distribution(ttft, "s"), tpot=distribution(tpot, "s"),
                             tokens_per_s=distribution(rates, "tokens/s"),
                             first_ttft_s=float(np.median(firsts)) if firsts else None)
