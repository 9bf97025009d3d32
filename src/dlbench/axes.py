"""The axes a benchmark varies along (precision, compile, mode, scenario; compression of
a data-parallel job), as the runners define
them: runners/common/contract.py, standard library only, so that the controller and every runner
share one definition. Every layer of the controller takes them from here."""

from runners.common.contract import (
    CHECK_PRECISION,
    COMPILE_MODES,
    KERNEL_PRECISION,
    PRECISIONS,
    Axis,
    Compile,
    Compression,
    CompressionMethod,
    Mode,
    Precision,
    Scenario,
    gtopk_tree,
    topk_count,
)

# The dtype of the kernels whose measured ceiling stands for a run of each precision (calibrate's
# kernels, utilisation's peaks): the inverse of KERNEL_PRECISION; tf32 has none on purpose
# (calibrate's float32 matmuls run with TF32 off).
KERNEL_DTYPE = {precision: dtype for dtype, precision in KERNEL_PRECISION.items()}

__all__ = ["KERNEL_DTYPE", "Axis", "Precision", "Compile", "Mode", "Scenario", "PRECISIONS", "CHECK_PRECISION", "COMPILE_MODES",
           "KERNEL_PRECISION", "Compression", "CompressionMethod", "topk_count", "gtopk_tree"]
