"""The convergence suite's data on the controller's side (issue 21): scikit-learn's digits exported
as IDX files, and the files of `--data DIR` checked before any worker starts.

Why the digits go to disk as IDX: the workers run in the frameworks' environments, which do not
have scikit-learn (nor should they, for one 8x8 dataset); written once by the controller, in the
MNIST format, they reach every runner through the same reader and the same pipeline as MNIST does,
and a run reads its data from disk inside its clock, as MLPerf's rules ask, not from an array handed
over warm. The split is fixed: a permutation seeded with 0 per class, its first 20% (rounded) for
evaluation, the rest for training, each split in class-interleaved order as the permutation left it.

The checks here are the runners' readers' (runners/common/datasets.py) done once, up front: a
missing, truncated or wrongly sized file is one DataError naming it, exit 2, nothing run.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import struct
import tempfile
from pathlib import Path

from ..definitions.convergence import DatasetInfo

DIGITS_EVAL_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0
CIFAR_RECORD = 1 + 3 * 32 * 32


class DataError(ValueError):
    def __init__(self, path, problem: str):
        self.path = str(path)
        super().__init__(f"{path}: {problem}")


def idx_bytes(array) -> bytes:
    """An unsigned-byte array in the IDX format (big-endian header: 0, 0, 0x08, ndim, the sizes)."""
    import numpy as np

    a = np.ascontiguousarray(array, dtype=np.uint8)
    return bytes([0, 0, 0x08, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.tobytes()


def digits_split():
    """(train images, train labels, eval images, eval labels): scikit-learn's digits, pixels 0-16
    mapped to bytes 0-255 (round(v * 255 / 16): one to one), split as the module says."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255 / 16)).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    rng = np.random.default_rng(DIGITS_SPLIT_SEED)
    train, evaluation = [], []
    for c in range(10):
        members = rng.permutation(np.flatnonzero(labels == c))
        cut = int(round(len(members) * DIGITS_EVAL_FRACTION))
        evaluation.append(members[:cut])
        train.append(members[cut:])
    tr, ev = rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(evaluation))
    return images[tr], labels[tr], images[ev], labels[ev]


def digits_folder(cache: Path, info: DatasetInfo) -> Path:
    """The digits as IDX files under the cache (written once, atomically; reused while scikit-learn's
    data and the split give the same bytes)."""
    xt, yt, xe, ye = digits_split()
    files = dict(zip((*info.train_files, *info.eval_files), (idx_bytes(xt), idx_bytes(yt), idx_bytes(xe), idx_bytes(ye))))
    digest = hashlib.sha256(b"".join(files[k] for k in sorted(files))).hexdigest()[:16]
    folder = Path(cache) / "datasets" / f"digits-{digest}"
    if folder.is_dir() and all((folder / k).is_file() for k in files):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".digits-", dir=folder.parent))
    try:
        for name, content in files.items():
            (tmp / name).write_bytes(content)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not folder.is_dir():  # another process did not win the race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _located(folder: Path, name: str) -> Path:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(folder / name, f"missing (nor is there {name}.gz in {folder}); the task's dataset needs it")


def _content(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise DataError(path, f"a damaged or truncated gzip file ({e})") from None
    return data


def _idx_count(path: Path, ndim: int) -> int:
    data = _content(path)
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise DataError(path, "not an IDX file of unsigned bytes (0, 0, 0x08, ndim)")
    if data[3] != ndim or len(data) < 4 + 4 * ndim:
        raise DataError(path, f"an IDX file of {data[3]} dimensions where {ndim} are expected, or a truncated header")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    size = 1
    for s in shape:
        size *= s
    expected = 4 + 4 * ndim + size
    if len(data) != expected:
        kind = "truncated" if len(data) < expected else "of the wrong size"
        raise DataError(path, f"{kind}: {len(data)} bytes where its header {list(shape)} needs {expected}")
    return shape[0]


def check_data(info: DatasetInfo, folder: Path) -> dict[str, int]:
    """The dataset's files in `folder` as its readers will find them: {split: samples}, or DataError."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(folder, f"--data: not a folder (dataset {info.name} is read from its files there)")
    counts = {}
    for split, names in (("train", info.train_files), ("eval", info.eval_files)):
        if info.format == "idx":
            images, labels = _located(folder, names[0]), _located(folder, names[1])
            n, m = _idx_count(images, 3), _idx_count(labels, 1)
            if n != m:
                raise DataError(labels, f"{m} labels for the {n} images of {images.name}")
            counts[split] = n
        else:
            total = 0
            for name in names:
                path = _located(folder, name)
                size = len(_content(path))
                if size == 0 or size % CIFAR_RECORD:
                    raise DataError(path, f"{size} bytes is not a whole number of {CIFAR_RECORD}-byte CIFAR-10 "
                                          "records (truncated, or not the binary version)")
                total += size // CIFAR_RECORD
            counts[split] = total
    return counts
