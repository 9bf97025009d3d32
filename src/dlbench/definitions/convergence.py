"""Suites of `kind: convergence`: time to a quality target on real data (issue 21).

A task names a network of suites/networks/, a dataset, the optimiser and its schedule (SGD with
momentum, linear warm-up, then step or cosine decay, weight decay), the batch size, the quality
target (top-1 accuracy on the dataset's evaluation split), how often it is evaluated, the most
epochs a run may take, and the number of seeded runs (per profile). Timing and scoring follow
MLPerf Training's rules (docs/architecture.md, "Time to accuracy"): initialisation timed apart and
bounded, the clock from the first touch of training data to the evaluation that reaches the
target, N seeds with the fastest and the slowest dropped.

Datasets (DATASETS): `digits` is scikit-learn's handwritten digits (1,797 8x8 images, shipped in
the package), which the controller exports once as IDX files, split by a fixed stratified
permutation (execution/datasets.py); `mnist`, `fashion_mnist` (IDX, gzipped or not) and `cifar10`
(the binary version) are read from `--data DIR`. Nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, model_validator

from .loader import DefinitionError, load_network, validate
from .network import NetworkSummary
from .schema import Int, Real, _Strict
from .suite import MAX_BATCH, MAX_REPEATS, Device, Precision


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset is on disk and as input: `files` per split (IDX: images then labels;
    CIFAR-10: the batch files), the image shape (C, H, W), classes, the per-channel mean and standard
    deviation the inputs are normalised with (after scaling bytes to [0, 1]), and whether it comes
    with dlbench (digits) or from --data DIR."""

    name: str
    format: Literal["idx", "cifar10_binary"]
    shape: tuple[int, int, int]
    classes: int
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: Literal["package", "data_dir"]
    train_samples: int
    eval_samples: int


CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
DATASETS: dict[str, DatasetInfo] = {
    # the split is execution/datasets.py's: 20% of each class for evaluation, fixed permutation
    "digits": DatasetInfo("digits", "idx", (1, 8, 8), 10, ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                          ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"), (0.3053,), (0.3759,), "package",
                          1438, 359),
    "mnist": DatasetInfo("mnist", "idx", (1, 28, 28), 10, ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                         ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"), (0.1307,), (0.3081,), "data_dir",
                         60000, 10000),
    "fashion_mnist": DatasetInfo("fashion_mnist", "idx", (1, 28, 28), 10,
                                 ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                                 ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"), (0.2860,), (0.3530,),
                                 "data_dir", 60000, 10000),
    "cifar10": DatasetInfo("cifar10", "cifar10_binary", (3, 32, 32), 10, CIFAR_TRAIN, ("test_batch.bin",),
                           (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), "data_dir", 50000, 10000),
}
MAX_EPOCHS = 10_000


class Dataset(_Strict):
    name: Literal["digits", "mnist", "fashion_mnist", "cifar10"]
    # how many samples of each split to use (the first N in file order); None: all. Tests run a
    # tiny CIFAR-binary set made on the spot through the full path with these.
    train_samples: Int(1, 10_000_000) | None = None
    eval_samples: Int(1, 10_000_000) | None = None


class Augmentation(_Strict):
    """The same in every framework: a random crop of the image padded by `crop_padding` zeros on
    each side back to its own size, then a horizontal flip with probability 1/2 (CIFAR's usual
    pair); none by default (digits, MNIST). Training inputs only."""

    crop_padding: Int(0, 64) = 0
    horizontal_flip: bool = False


class ConstantDecay(_Strict):
    kind: Literal["constant"]


class StepDecay(_Strict):
    """The rate times `factor` at each boundary epoch (counted from the start, warm-up included)."""

    kind: Literal["step"]
    boundaries: Annotated[list[Int(1, MAX_EPOCHS)], Field(min_length=1, max_length=64)]
    factor: Real(gt=0, lt=1) = 0.1

    @model_validator(mode="after")
    def _increasing(self):
        if any(a >= b for a, b in zip(self.boundaries, self.boundaries[1:])):
            raise ValueError(f"boundaries must increase, got {self.boundaries}")
        return self


class CosineDecay(_Strict):
    """Half a cosine from the base rate after warm-up to `final_fraction` of it at max_epochs."""

    kind: Literal["cosine"]
    final_fraction: Real(ge=0, lt=1) = 0.0


Decay = Annotated[Union[Annotated[ConstantDecay, Tag("constant")], Annotated[StepDecay, Tag("step")],
                        Annotated[CosineDecay, Tag("cosine")]],
                  Discriminator(lambda v: v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None))]


class Optimizer(_Strict):
    """SGD with momentum in torch's form, in every runner: g = grad + weight_decay * w (every
    trainable parameter), v = momentum * v + g, w = w - lr * v. The rate of step s (counted over
    the run, steps_per_epoch = ceil(train samples / batch)): base * (s + 1) / W during the W =
    warmup_epochs * steps_per_epoch warm-up steps, then `decay` of the base rate by the epoch
    (fractional: s / steps_per_epoch) the step is in (runners/common/convergence.py: learning_rate)."""

    name: Literal["sgd_momentum"]
    learning_rate: Real(gt=0, le=100)
    momentum: Real(ge=0, lt=1) = 0.9
    weight_decay: Real(ge=0, le=1) = 0.0
    warmup_epochs: Real(ge=0, le=MAX_EPOCHS) = 0.0
    decay: Decay = ConstantDecay(kind="constant")


class Target(_Strict):
    metric: Literal["top1"] = "top1"
    value: Real(gt=0, le=1)  # accuracy on the evaluation split, as a fraction


class Runs(_Strict):
    """Seeded runs per task and profile (fresh processes); the score drops the fastest and the
    slowest when there are at least three (MLPerf's olympic average)."""

    smoke: Int(1, MAX_REPEATS) = 1
    default: Int(1, MAX_REPEATS) = 5
    paper: Int(1, MAX_REPEATS) = 5


class Task(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
    network: str  # a name in suites/networks, or a .yaml path relative to the suite file
    dataset: Dataset
    batch_size: Int(1, MAX_BATCH)
    optimizer: Optimizer
    target: Target
    eval_every_epochs: Int(1, MAX_EPOCHS) = 1
    max_epochs: Int(1, MAX_EPOCHS)
    augmentation: Augmentation = Augmentation()
    precision: Precision = "fp32"
    loader_workers: Int(0, 64) = 2  # the framework pipeline's worker processes or threads
    max_init_s: Real(gt=0, le=86400) = 900.0  # initialisation's bound (MLPerf bounds it too)

    @model_validator(mode="after")
    def _schedule_fits(self):
        d = self.optimizer.decay
        if self.optimizer.warmup_epochs >= self.max_epochs:
            raise ValueError(f"optimizer.warmup_epochs ({self.optimizer.warmup_epochs:g}) must be below "
                             f"max_epochs ({self.max_epochs})")
        if isinstance(d, StepDecay) and d.boundaries[-1] >= self.max_epochs:
            raise ValueError(f"optimizer.decay.boundaries must lie below max_epochs ({self.max_epochs})")
        return self


class ConvergenceSuiteFile(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    kind: Literal["convergence"]
    description: str = ""
    runs: Runs = Runs()
    seed: Int(0, 2**31 - 1) = 0  # run k of a task is seeded with seed + k
    tasks: Annotated[list[Task], Field(min_length=1)]


@dataclass(frozen=True)
class ConvergenceTask:
    suite: str
    name: str
    network: NetworkSummary
    network_file: str
    dataset: DatasetInfo
    spec: Task
    seeds: tuple[int, ...]
    profile: str
    device: Device

    def request_part(self) -> dict[str, Any]:
        """What a worker needs of the task (the rest of the request is the run's)."""
        s = self.spec
        d = self.dataset
        return {
            "task": self.name,
            "network": self.network.resolved,
            "dataset": {"name": d.name, "format": d.format, "shape": list(d.shape), "classes": d.classes,
                        "train_files": list(d.train_files), "eval_files": list(d.eval_files),
                        "mean": list(d.mean), "std": list(d.std),
                        "train_samples": s.dataset.train_samples, "eval_samples": s.dataset.eval_samples},
            "batch_size": s.batch_size,
            "optimizer": s.optimizer.model_dump(),
            "target": s.target.model_dump(),
            "eval_every_epochs": s.eval_every_epochs,
            "max_epochs": s.max_epochs,
            "augmentation": s.augmentation.model_dump(),
            "precision": s.precision,
            "loader_workers": s.loader_workers,
        }


def load_convergence(path: Path, data: Any, profile: str, device: Device, network_path) -> list[ConvergenceTask]:
    """The tasks of a `kind: convergence` suite for one profile; every problem is one
    DefinitionError naming the file and the field. `network_path(ref, suite_path, field)` finds a
    network file (catalog.SuiteCatalog._network_path)."""
    spec = validate(ConvergenceSuiteFile, data, path)
    seen: set[str] = set()
    tasks = []
    runs = getattr(spec.runs, profile)
    for i, t in enumerate(spec.tasks):
        if t.name in seen:
            raise DefinitionError(path, f"tasks[{i}].name", f"task {t.name} is defined twice")
        seen.add(t.name)
        net_path = network_path(t.network, path, f"tasks[{i}].network")
        network = load_network(net_path)
        dataset = DATASETS[t.dataset.name]
        inp = network.resolved["input"]
        shape = tuple(inp.get("shape") or ())
        numel = dataset.shape[0] * dataset.shape[1] * dataset.shape[2]
        if inp.get("kind") != "tensor" or not (shape == dataset.shape or shape == (numel,)):
            raise DefinitionError(path, f"tasks[{i}].network",
                                  f"network {network.name} takes input {list(shape) or inp.get('kind')}, but "
                                  f"{dataset.name} images are {list(dataset.shape)} (or {numel} flattened)")
        if inp.get("classes") != dataset.classes:
            raise DefinitionError(path, f"tasks[{i}].network", f"network {network.name} has {inp.get('classes')} "
                                                               f"classes, {dataset.name} has {dataset.classes}")
        aug = t.augmentation
        if aug.crop_padding and len(shape) != 3:
            raise DefinitionError(path, f"tasks[{i}].augmentation.crop_padding",
                                  "a random crop needs an image input ([C, H, W]), not a flat one")
        tasks.append(ConvergenceTask(suite=spec.name, name=t.name, network=network, network_file=str(net_path),
                                     dataset=dataset, spec=t, seeds=tuple(spec.seed + k for k in range(runs)),
                                     profile=profile, device=device))
    return tasks
