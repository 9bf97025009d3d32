"""The rotary position embedding's tables, computed once in numpy for every runner (the semantics in
src/dlbench/definitions/schema.py): each framework turns the same float64 cos and sin tables into
its own constants, so that no runner's rotation differs from another's by how it computed them.

numpy only, imported where used (every framework's environment has it; runners.common stays standard
library at import); the controller never imports this module.
"""

from __future__ import annotations

import math


def frequencies(head_size: int, theta: float, scaling: dict | None = None) -> np.ndarray:
    """f_i = theta^(-2i/S), i = 0 .. S/2 - 1, float64; with `scaling` (Llama 3's: factor,
    low_freq_factor, high_freq_factor, original_context) the long wavelengths divided by `factor`,
    the short ones kept and those between interpolated, as HuggingFace's rope_type "llama3"."""
    import numpy as np  # not at import: runners.common is standard library until used

    f = theta ** (-np.arange(0, head_size, 2, dtype=np.float64) / head_size)
    if scaling is None:
        return f
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_context"]
    wavelength = 2 * math.pi / f
    low_wavelength, high_wavelength = context / low, context / high
    smooth = (context / wavelength - low) / (high - low)
    interpolated = (1 - smooth) * f / factor + smooth * f
    return np.where(wavelength > low_wavelength, f / factor,
                    np.where(wavelength < high_wavelength, f, interpolated))


def tables(positions: int, head_size: int, theta: float, scaling: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each (positions, S) float64: the angle t f_i at column i and again at i + S/2 (the
    halves rotate together: rotate_half)."""
    import numpy as np  # not at import: runners.common is standard library until used

    angles = np.outer(np.arange(positions, dtype=np.float64), frequencies(head_size, theta, scaling))
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles), np.sin(angles)


def layer_tables(spec: dict, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """The tables of a resolved grouped_attention or llama_block entry, for `positions` positions."""
    return tables(positions, spec["head_size"], spec["rope_theta"], spec.get("rope_scaling"))

