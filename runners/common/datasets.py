"""Readers of the standard on-disk dataset formats, numpy only, shared by every runner's input
pipeline (the convergence suite, issue 21). Nothing is downloaded.

- IDX (MNIST, Fashion-MNIST, and the digits the controller exports): a big-endian header, magic
  0x0000 then the element type (0x08: unsigned byte) and the number of dimensions, one 32-bit size
  per dimension, then the elements; a file may be gzipped (`name` or `name.gz`).
- CIFAR-10, binary version: records of 1 label byte and 3072 pixel bytes (1024 red, 1024 green,
  1024 blue, each row-major 32x32), 10,000 records per batch file in the distribution; a file of any
  whole number of records is read (tests make small ones).

Every problem is a DatasetError naming the file: missing, truncated, of the wrong size, or not of
the format.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

IDX_UBYTE = 0x08
CIFAR_RECORD = 1 + 3 * 32 * 32


class DatasetError(ValueError):
    def __init__(self, path, problem: str):
        self.path = str(path)
        super().__init__(f"{path}: {problem}")


def locate(folder, name: str) -> Path:
    """`folder/name`, else `folder/name.gz`; DatasetError naming both when neither is a file."""
    plain = Path(folder) / name
    for candidate in (plain, plain.with_name(name + ".gz")):
        if candidate.is_file():
            return candidate
    raise DatasetError(plain, f"missing (nor is there {plain.name}.gz in {plain.parent})")


def _raw(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":  # gzip's magic, whatever the file is called
        try:
            return gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise DatasetError(path, f"a damaged or truncated gzip file ({e})") from None
    return data


def read_idx(path):
    """An IDX file of unsigned bytes as an array of its own shape."""
    import numpy as np  # in every runner's environment, not in the contract's
    path = Path(path)
    data = _raw(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DatasetError(path, "not an IDX file (its first two bytes must be zero)")
    if data[2] != IDX_UBYTE:
        raise DatasetError(path, f"IDX element type 0x{data[2]:02x} is not unsigned bytes (0x08)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise DatasetError(path, f"truncated IDX header ({len(data)} bytes for {ndim} dimensions)")
    shape = tuple(int(v) for v in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape, dtype=np.int64))
    if len(data) != expected:
        kind = "truncated" if len(data) < expected else "of the wrong size"
        raise DatasetError(path, f"{kind}: {len(data)} bytes where its header {list(shape)} needs {expected}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_idx_pair(folder, images: str, labels: str, classes: int) -> tuple:
    """(images (N, 1, H, W) uint8, labels (N,) int64) from an IDX image file and its label file."""
    ip, lp = locate(folder, images), locate(folder, labels)
    x, y = read_idx(ip), read_idx(lp)
    if x.ndim != 3:
        raise DatasetError(ip, f"images must have 3 dimensions (N, H, W), not {list(x.shape)}")
    if y.ndim != 1:
        raise DatasetError(lp, f"labels must have 1 dimension (N), not {list(y.shape)}")
    if len(x) != len(y):
        raise DatasetError(lp, f"{len(y)} labels for the {len(x)} images of {ip.name}")
    if len(y) and int(y.max()) >= classes:
        raise DatasetError(lp, f"label {int(y.max())} is not one of the {classes} classes")
    return x[:, None, :, :], y.astype("int64")


def read_cifar10(folder, names) -> tuple:
    """(images (N, 3, 32, 32) uint8, labels (N,) int64) from CIFAR-10 binary batch files, in order."""
    import numpy as np  # in every runner's environment, not in the contract's
    xs, ys = [], []
    for name in names:
        path = locate(folder, name)
        data = _raw(path)
        if not data or len(data) % CIFAR_RECORD:
            raise DatasetError(path, f"{len(data)} bytes is not a whole number of {CIFAR_RECORD}-byte CIFAR-10 "
                                     "records (truncated, or not the binary version)")
        records = np.frombuffer(data, dtype=np.uint8).reshape(-1, CIFAR_RECORD)
        labels = records[:, 0].astype(np.int64)
        if int(labels.max()) >= 10:
            raise DatasetError(path, f"label {int(labels.max())} is not a CIFAR-10 class (0-9)")
        xs.append(records[:, 1:].reshape(-1, 3, 32, 32))
        ys.append(labels)
    return np.concatenate(xs), np.concatenate(ys)


def files_of(dataset: dict, split: str) -> list[str]:
    return dataset["train_files" if split == "train" else "eval_files"]


def read_split(dataset: dict, folder, split: str) -> tuple:
    """One split ("train" or "eval") of a request's dataset (definitions/convergence.py: DatasetInfo),
    cut to its first `train_samples` / `eval_samples` when the task asks."""
    names = files_of(dataset, split)
    if dataset["format"] == "idx":
        x, y = read_idx_pair(folder, names[0], names[1], dataset["classes"])
    else:
        x, y = read_cifar10(folder, names)
    shape = tuple(dataset["shape"])
    if x.shape[1:] != shape:
        raise DatasetError(locate(folder, names[0]), f"images are {list(x.shape[1:])}, the task's dataset "
                                                     f"{dataset['name']} has {list(shape)}")
    limit = dataset.get(f"{split}_samples")
    if limit is not None:
        if limit > len(x):
            raise DatasetError(locate(folder, names[0]), f"the task asks for {limit} {split} samples; the files "
                                                         f"hold {len(x)}")
        x, y = x[:limit], y[:limit]
    return x, y


def evict_from_page_cache(dataset: dict, folder) -> dict:
    """Drop the dataset's files from the OS page cache (posix_fadvise DONTNEED: no privileges
    needed for pages that are not dirty), so the run reads them from disk, not from a cache warmed
    before its clock; says for each file whether the kernel accepted."""
    out = {}
    for name in files_of(dataset, "train") + files_of(dataset, "eval"):
        path = locate(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            out[path.name] = True
        except (OSError, AttributeError) as e:
            out[path.name] = f"not evicted: {e}"
    return out


def normalise(x, mean, std):
    """uint8 (N, C, H, W) to float32 scaled to [0, 1], less the mean, over the std, per channel."""
    import numpy as np  # in every runner's environment, not in the contract's
    m = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    return ((x.astype(np.float32) / 255.0) - m) / s


def crop_flip(images, padding: int, flip: bool, rng):
    """The convergence suite's augmentation on a batch (N, C, H, W): each image padded with zeros
    by `padding` on every side and cropped back to H x W at a random offset, then mirrored left to
    right with probability 1/2. The same function in the pipelines that run numpy (torch, JAX,
    MXNet); TensorFlow's tf.data does the same with tf.image (runners/tensorflow/convergence.py)."""
    import numpy as np  # in every runner's environment, not in the contract's
    n, _, h, w = images.shape
    out = images
    if padding:
        padded = np.pad(images, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
        dy = rng.integers(0, 2 * padding + 1, n)
        dx = rng.integers(0, 2 * padding + 1, n)
        out = np.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])
    if flip:
        mirror = rng.random(n) < 0.5
        out = np.where(mirror[:, None, None, None], out[..., ::-1], out)
    return out
