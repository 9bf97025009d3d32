"""Shared by the integration tests: torch's reference step of a check, run once per session.

The jax, tensorflow and mxnet modules each check the seed networks against torch (check_network:
the same seeded weights and inputs, batch and hyper-parameters, a deterministic step), so torch's
step of a network comes out the same in each; it ran three times, some 100 s of CI's two cores per
module. Here the first run's arrays are kept (saved to an npz file, on disk: alexnet's are
~1.5 GB of float64) and a later probe of exactly the same request (the same environment, network,
batch, settings and weight and input arrays) reads them back instead of starting torch again."""

from __future__ import annotations

import hashlib
import shutil
import threading

import numpy as np
import pytest

from dlbench.execution import equivalence


def _digest(path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with np.load(path) as data:
        for name in sorted(data.files):
            array = np.ascontiguousarray(data[name])
            h.update(f"{name}:{array.dtype}:{array.shape}".encode())
            h.update(array.tobytes())
    return h.hexdigest()


@pytest.fixture(scope="session", autouse=True)
def torch_reference_once(tmp_path_factory):
    real = equivalence._probe
    kept_dir = tmp_path_factory.mktemp("torch-reference")
    kept: dict[tuple, tuple[str, object, object]] = {}
    lock = threading.Lock()

    def probe(runner, env, network, workdir, device, timeout_s, weights_path, inputs_path, batch, **settings):
        if runner.name != "torch":
            return real(runner, env, network, workdir, device, timeout_s, weights_path, inputs_path, batch, **settings)
        key = (str(env.python), env.key, network.definition_hash, device, batch, tuple(sorted(settings.items())),
               _digest(weights_path), _digest(inputs_path))
        with lock:
            found = kept.get(key)
        if found is not None:
            path, params, version = found
            with np.load(path) as data:
                arrays = {k: data[k] for k in data.files}
            return {**arrays, "__params__": params, "__version__": version}, None, "ok"
        arrays, reason, status = real(runner, env, network, workdir, device, timeout_s, weights_path, inputs_path,
                                      batch, **settings)
        if arrays is not None:
            path = kept_dir / f"{network.name}-{hashlib.blake2b(repr(key).encode(), digest_size=8).hexdigest()}.npz"
            np.savez(path, **{k: v for k, v in arrays.items() if not k.startswith("__")})
            with lock:
                kept[key] = (str(path), arrays["__params__"], arrays["__version__"])
        return arrays, reason, status

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(equivalence, "_probe", probe)
        yield
    shutil.rmtree(kept_dir, ignore_errors=True)  # gigabytes: not left for pytest's retention of old runs
