"""The model's data term checked against what convergence runs measured (issue 21).

The model (model.py) adds to an iteration what its data path does not hide behind the computation:
with prefetching max(0, t_io + t_h2d - t_compute), t_io = a batch's bytes / the read bandwidth
(DataPath). A convergence run reads real data through its framework's own input pipeline and
measures the time its training loop waits in the pipeline's `next` (runners/common/convergence.py):
the input-bound share, input_wait_s / train_s. Here the two meet, per record (framework x task),
over the seeds that trained:

- a batch's bytes are what the files hold for it: IDX and CIFAR-10 binary store one byte per pixel
  and one per label, so batch x (C·H·W + 1);
- the bandwidth is the one stated (`--io-bandwidth`), else the run's own: the bytes of both splits
  over `read_s`, which also covers building the pipelines, so the rate is a lower bound of the
  disk's and the t_io it gives an upper bound;
- the computation the prefetch hides the read behind is the measured step less its wait,
  (train_s - input_wait_s) / steps, so that the data term alone is on trial, not the model's
  compute prediction (`predict --accuracy` scores that on the timed suites);
- predicted share: exposed / (exposed + compute) per step, with prefetching (the model's data term)
  and without (the whole read in the step's path, the most the term could ever say).

What the measured wait holds beyond that term is the pipeline's own per-batch cost: Python
dispatch, collation, inter-process queues, a worker not yet started. That cost is per batch, not
per byte, and no bandwidth explains it; `unexplained_s` says how much of it there is per step. A
host-to-device copy (CUDA) is not in the term here: the profile has no bandwidth for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import DataPath

LABEL_BYTES = 1  # IDX and CIFAR-10 binary: one unsigned byte per label, one per pixel


@dataclass(frozen=True)
class DataTermCheck:
    suite: str
    task: str
    framework: str
    device: str
    batch: int
    runs: int  # seeded runs that trained (their sums below)
    steps: int
    bytes_per_batch: int  # as the files hold it
    read_bytes_per_s: float
    bandwidth_source: str  # stated (--io-bandwidth) | measured (the runs' read of the splits)
    io_s: float  # t_io of one batch at that bandwidth
    compute_s: float  # measured per step, less the wait: (train_s - input_wait_s) / steps
    predicted_exposed_s: float  # the model's data term per step (prefetching): max(0, t_io - compute)
    predicted_share: float  # exposed / (exposed + compute)
    unhidden_share: float  # without prefetching: t_io / (t_io + compute)
    measured_wait_s: float  # input_wait_s / steps
    measured_share: float  # input_wait_s / train_s over the runs
    pipeline: str

    @property
    def unexplained_s(self) -> float:
        """Measured wait per step that the data term does not predict (the pipeline's per-batch cost)."""
        return self.measured_wait_s - self.predicted_exposed_s

    def to_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "unexplained_s": self.unexplained_s}


def check_data_term(*, batch: int, sample_bytes: int, steps: int, train_s: float, input_wait_s: float,
                    read_bytes_per_s: float) -> dict:
    """The model's data term for one step against the measured wait, from plain sums (see the module's
    text): io_s, compute_s, predicted_exposed_s, predicted_share, unhidden_share, measured_wait_s,
    measured_share."""
    if steps <= 0 or train_s <= 0 or read_bytes_per_s <= 0:
        raise ValueError("a data-term check needs steps, training time and a read bandwidth above zero")
    compute = max(train_s - input_wait_s, 0.0) / steps
    path = DataPath(sample_bytes, read_bytes_per_s=read_bytes_per_s, prefetch=True)
    io, _ = path.times(batch)
    exposed = path.exposed(batch, compute)
    return {"io_s": io, "compute_s": compute, "predicted_exposed_s": exposed,
            "predicted_share": exposed / (exposed + compute) if exposed + compute > 0 else 0.0,
            "unhidden_share": io / (io + compute) if io + compute > 0 else 0.0,
            "measured_wait_s": input_wait_s / steps, "measured_share": input_wait_s / train_s}


def sample_bytes_of(network_definition: dict) -> int | None:
    """One sample as the dataset files hold it: a byte per input element and one for the label."""
    shape = (network_definition.get("input") or {}).get("shape")
    if not shape:
        return None
    return math.prod(int(d) for d in shape) + LABEL_BYTES


def data_term_checks(records, io_bandwidth_bytes_per_s: float | None = None) -> list[DataTermCheck]:
    """One DataTermCheck per convergence record with at least one seed that trained (steps, train_s,
    input_wait_s; for a measured bandwidth read_s and the split sizes too)."""
    out = []
    for r in records:
        c = r.convergence
        if c is None:
            continue
        trained = [x for x in c.runs if x.status == "ok" and x.steps and x.train_s and x.input_wait_s is not None]
        sample = sample_bytes_of(r.network.definition)
        if not trained or sample is None:
            continue
        steps = sum(x.steps for x in trained)
        train_s = sum(x.train_s for x in trained)
        wait_s = sum(x.input_wait_s for x in trained)
        if io_bandwidth_bytes_per_s is not None:
            bandwidth, source = io_bandwidth_bytes_per_s, "stated"
        else:
            read = [x for x in trained if x.read_s and x.train_samples]
            if not read:
                continue
            read_bytes = sum((x.train_samples + (x.eval_samples or 0)) * sample for x in read)
            bandwidth, source = read_bytes / sum(x.read_s for x in read), "measured"
        numbers = check_data_term(batch=c.batch_size, sample_bytes=sample, steps=steps, train_s=train_s,
                                  input_wait_s=wait_s, read_bytes_per_s=bandwidth)
        out.append(DataTermCheck(
            suite=r.suite, task=c.task, framework=str(r.framework.get("name")), device=r.workload.device,
            batch=c.batch_size, runs=len(trained), steps=steps, bytes_per_batch=c.batch_size * sample,
            read_bytes_per_s=bandwidth, bandwidth_source=source, pipeline=str(trained[0].pipeline.get("pipeline", "")),
            **numbers))
    return out
