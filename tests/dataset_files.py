"""Small dataset files in the standard formats, written by the convergence suite's tests (unit and
integration): IDX (MNIST's layout, gzipped or not) and CIFAR-10 binary batches of random bytes."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from dlbench.definitions.convergence import DATASETS
from dlbench.execution.datasets import idx_bytes


def write_idx_set(folder: Path, n_train=12, n_eval=5, gz=False) -> tuple:
    rng = np.random.default_rng(1)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
              "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_eval, 28, 28), dtype=np.uint8),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_eval, dtype=np.uint8)}
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        content = idx_bytes(a)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(content))
        else:
            (folder / name).write_bytes(content)
    return arrays


def write_cifar_set(folder: Path, per_file=3) -> tuple:
    rng = np.random.default_rng(2)
    folder.mkdir(parents=True, exist_ok=True)
    images, labels = [], []
    for name in DATASETS["cifar10"].train_files + DATASETS["cifar10"].eval_files:
        y = rng.integers(0, 10, per_file, dtype=np.uint8)
        x = rng.integers(0, 256, (per_file, 3, 32, 32), dtype=np.uint8)
        (folder / name).write_bytes(np.concatenate([y[:, None], x.reshape(per_file, -1)], axis=1).tobytes())
        images.append(x)
        labels.append(y)
    return images, labels


def request_dataset(name: str) -> dict:
    d = DATASETS[name]
    return {"name": d.name, "format": d.format, "shape": list(d.shape), "classes": d.classes,
            "train_files": list(d.train_files), "eval_files": list(d.eval_files), "mean": list(d.mean),
            "std": list(d.std), "train_samples": None, "eval_samples": None}
