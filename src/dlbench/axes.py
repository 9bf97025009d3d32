"""The axes a benchmark varies along (precision, compile, mode, scenario), as the runners define
them: runners/common/contract.py, standard library only, so that the controller and every runner
share one definition. Every layer of the controller takes them from here."""

from runners.common.contract import (
    CHECK_PRECISION,
    COMPILE_MODES,
    KERNEL_PRECISION,
    PRECISIONS,
    Axis,
    Compile,
    Mode,
    Precision,
    Scenario,
)

__all__ = ["Axis", "Precision", "Compile", "Mode", "Scenario", "PRECISIONS", "CHECK_PRECISION", "COMPILE_MODES",
           "KERNEL_PRECISION"]
