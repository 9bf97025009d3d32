"""The axes a benchmark varies along (precision, compile, mode, scenario), as the runners define
them: runners/common/contract.py, standard library only, so that the controller and every runner
share one definition. Every layer of the controller takes them from here."""

from runners.common.contract import (
    CHECK_PRECISION,
    COMPILE_MODES,
    KERNEL_PRECISION,
    PRECISIONS,
    REQUEST_AXES,
    Axis,
    Compile,
    Compression,
    CompressionMethod,
    Mode,
    Parallelism,
    Precision,
    RequestAxis,
    Scenario,
    gtopk_tree,
    topk_count,
)

# The dtype of the kernels whose measured ceiling stands for a run of each precision (calibrate's
# kernels, utilisation's peaks): the inverse of KERNEL_PRECISION; tf32 has none on purpose
# (calibrate's float32 matmuls run with TF32 off).
KERNEL_DTYPE = {precision: dtype for dtype, precision in KERNEL_PRECISION.items()}

# The axes that pair runs (RequestAxis.pairs: compare, history, the report), in REQUEST_AXES' order.
PAIRING_AXES = tuple(spec for spec in REQUEST_AXES.values() if spec.pairs)
# Those that key a series of timed runs (`dlbench history`, the report's boards and series): a run
# with a value of an axis of its own figures (LoadGen's scenario) is shown apart.
SERIES_AXES = tuple(spec for spec in PAIRING_AXES if not spec.own_figures)
# Precision and compile mode have their own columns in the tables and their grid in the report; any
# other axis of a series is a column after them and named beside them (`dlbench results`, the report).
OTHER_AXES = tuple(spec for spec in SERIES_AXES if spec.field not in ("precision", "compile"))


__all__ = ["KERNEL_DTYPE", "Axis", "Precision", "Compile", "Mode", "Scenario", "PRECISIONS", "CHECK_PRECISION", "COMPILE_MODES",
           "KERNEL_PRECISION", "REQUEST_AXES", "RequestAxis", "PAIRING_AXES",
           "SERIES_AXES", "OTHER_AXES", "Compression", "CompressionMethod", "Parallelism", "topk_count", "gtopk_tree"]
