"""TensorFlow's multi-worker rank builds TF_CONFIG from what dlbench's `ranks` launch style gives
it (runners/tensorflow/distributed.py; imported without TensorFlow, which it loads
only when a rank joins)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlbench.execution.launch_styles import JobLayout, rank_processes
from dlbench.execution.placement import hosts_placement

ROOT = Path(__file__).resolve().parents[2]

from runners.common import distributed_harness  # noqa: E402
from runners.tensorflow import distributed  # noqa: E402


def test_tf_config_names_every_worker_from_the_ranks_environment(tmp_path):
    placement = hosts_placement("127.0.0.2,127.0.0.3", 4, cpus=4)
    layout = JobLayout(python=Path("/env/bin/python"), worker=ROOT / "runners/tensorflow/distributed_worker.py",
                       request=tmp_path / "request.json", job_dir=tmp_path, placement=placement, threads=1,
                       coordinator_port=29500, worker_ports=(40001, 40002, 40003, 40004))
    workers = ["127.0.0.2:40001", "127.0.0.2:40002", "127.0.0.3:40003", "127.0.0.3:40004"]
    for rank, spec in enumerate(rank_processes(layout)):
        cluster = distributed_harness.cluster_from_env({"device": "cpu"}, spec.env)
        config = distributed.tf_config(cluster)
        assert config == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}


def test_tf_config_refuses_a_worker_list_that_does_not_match_the_world():
    cluster = distributed_harness.Cluster(rank=0, world_size=2, local_rank=0, local_world_size=2,
                                          coordinator_address="127.0.0.1", coordinator_port=1,
                                          worker_addresses=("127.0.0.1:5000",), device="cpu", threads=1)
    with pytest.raises(RuntimeError, match="names 1 workers, WORLD_SIZE is 2"):
        distributed.tf_config(cluster)
