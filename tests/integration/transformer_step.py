"""What every runner's float64 check step on transformer_tiny must give (tests/integration/test_<fw>_runner.py):
the description's parameters, the canonical tensors and no tensor of its own for the tied head (layer 006),
float64 logits and loss equal to the numpy reference, and the tied embedding trained by the head's gradient
(rows of tokens absent from the input still move)."""

from __future__ import annotations

import numpy as np

from dlbench.definitions.weights import weight_shapes
from dlbench.execution.equivalence import TOLERANCE_FLOAT64, relative_error

from . import numpy_reference


def assert_tiny_step(arrays: dict, net, weights: dict, inputs: dict) -> None:
    assert arrays["__params__"] == net.params
    exported = {k[len("init/"):] for k in arrays if k.startswith("init/")}
    assert exported == set(weight_shapes(net.resolved)) and "006.weight" not in exported
    assert arrays["logits"].dtype == np.float64
    expected = numpy_reference.forward(net.resolved, weights, inputs["x"])
    assert relative_error(arrays["logits"], expected) <= TOLERANCE_FLOAT64
    assert relative_error(arrays["loss"], np.asarray(numpy_reference.cross_entropy(expected, inputs["y"]))) \
        <= TOLERANCE_FLOAT64
    unused = np.setdiff1d(np.arange(net.resolved["input"]["vocabulary"]), inputs["x"])
    assert unused.size > 0
    moved = arrays["after/000.weight"][unused] - arrays["loaded/000.weight"][unused]
    assert np.all(np.abs(moved).max(axis=1) > 0)
