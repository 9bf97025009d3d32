"""benchmarks/fairness.py's llm_configuration: the references of the llm suite are built from what it
reads out of the suite's description, so it must read every field that shapes the network and refuse
a description its fields cannot carry."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dlbench import paths
from dlbench.definitions.loader import load_network

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fairness():
    spec = importlib.util.spec_from_file_location("fairness_benchmark", ROOT / "benchmarks" / "fairness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def network(name: str, tokens: int):
    return load_network(Path(paths.suites_dir()) / "networks" / f"{name}.yaml", tokens)


def test_moe_configuration_carries_routing_and_the_description_context(fairness):
    config = fairness.llm_configuration(network("moe_tiny", 16))
    assert config == {"name": "moe_tiny", "vocabulary": 512, "width": 64, "init_std": 0.02, "layers": 2, "heads": 4,
                      "kv_heads": 2, "hidden": 128, "eps": 1e-5, "rope_theta": 10000.0, "tied": False,
                      "context": 64, "experts": 4, "top_k": 2, "aux_loss_coefficient": 0.02, "params": 287_552}


def test_dense_configuration_of_smollm2(fairness):
    config = fairness.llm_configuration(network("smollm2_135m", 32))
    assert (config["layers"], config["heads"], config["kv_heads"], config["rope_theta"], config["tied"]) == \
        (30, 9, 3, 100000.0, True)
    assert (config["experts"], config["context"], config["params"]) == (0, 8192, 134_515_008)


def test_rotary_scaling_is_refused_not_dropped(fairness):
    # Llama 3.2's rotary scaling has no field in the references' configuration: building without it
    # would time another network than dlbench's
    with pytest.raises(SystemExit, match="rotary scaling"):
        fairness.llm_configuration(network("llama32_1b", 16))
