"""What benchmarks/ scripts that time one seed network in the torch runner share: the planned run of
fcn5 or alexnet_r training at a batch size, from the default profile of its suite on the CPU."""

from __future__ import annotations

from dlbench import paths
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution.orchestrator import PlannedRun
from dlbench.execution.registry import RunnerRegistry

SUITE_OF = {"fcn5": "fcn.yaml", "alexnet_r": "cnn.yaml"}


def torch_training_run(network: str, batch: int) -> PlannedRun:
    """`network`-train (one of SUITE_OF) in the torch runner at `batch`, default profile, CPU."""
    suite = SuiteCatalog(paths.suites_dir()).load_suite(paths.suites_dir() / SUITE_OF[network], "default", "cpu")
    bench = next(b for b in suite.benchmarks if b.name == f"{network}-train")
    return PlannedRun(RunnerRegistry(paths.runners_dir()).get("torch"), bench, batch)
