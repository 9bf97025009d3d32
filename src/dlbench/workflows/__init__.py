"""The workflows of dlbench as a Python API, for the command line and notebooks alike: each takes a
typed request (requests.py), checks it whole before anything runs (an option a suite kind does not
honour: suite_kinds.py) and reports bad input as one RequestError naming the thing; it prints
nothing, reports progress through an events object, and returns what it made.

    from dlbench.workflows import RunRequest, run_suite
    records = run_suite(RunRequest(suite="fcn", framework=["torch"], profile="smoke"))
    [(r.benchmark, r.workload.precision, r.summary.median_s) for r in records]
    run_suite(RunRequest(suite="comm", framework=["torch"], workers=2))   # every suite kind alike

    from dlbench.workflows import PredictRequest, predict
    predict(PredictRequest(network="resnet50", framework="torch", batch=64, machine=["h200"])).prediction.iteration_s

    from dlbench.workflows import CheckRequest, check
    check(CheckRequest(framework=["torch", "jax"], network=["fcn5"])).failed   # pairs not equivalent

Layer: below the command line (which parses options into requests and renders results), above
reporting, execution and the rest."""

from .calibration import Calibration, CalibrateRequest, CalibrationFailed, calibrate
from .checks import CheckRequest, CheckResults, NetworkCheck, check
from .convergence import ConvergencePlan
from .distributed import DistributedPlan
from .kernels import KernelPlan
from .prediction import MachineComparison, PredictionAccuracy, PredictRequest, SinglePrediction, predict
from .requests import RequestError, RunRequest
from .run import BenchmarkPlan
from .suite_kinds import (
    RUN_OPTIONS,
    SUITE_KIND_TABLE,
    SuiteKind,
    SuitePlan,
    execute_run,
    plan_run,
    refuse_options_not_honoured,
    run_suite,
)

__all__ = ["CheckRequest", "CheckResults", "NetworkCheck", "check", "CalibrateRequest", "Calibration", "CalibrationFailed", "calibrate", "PredictRequest", "predict", "SinglePrediction",
           "MachineComparison", "PredictionAccuracy", "RunRequest", "SuitePlan", "BenchmarkPlan", "DistributedPlan",
           "KernelPlan", "ConvergencePlan", "run_suite", "plan_run", "execute_run", "RequestError", "SuiteKind",
           "RUN_OPTIONS", "SUITE_KIND_TABLE", "refuse_options_not_honoured"]
