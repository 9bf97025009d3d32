"""The JAX multi-worker runner's framework-free parts: which CPUs a rank takes (XLA:CPU sizes its
thread pools from the affinity mask, so ranks sharing a machine must get disjoint ones) and how
the compiled step's all-reduces are counted."""

from __future__ import annotations


import pytest


from runners.jax.distributed import _count_collectives, cpu_slice, machine_slot, slot_from_env  # noqa: E402


def test_ranks_of_one_machine_take_consecutive_slots():
    local = ("127.0.0.1:5001", "127.0.0.1:5002", "127.0.0.1:5003")
    assert [machine_slot(r, r, local) for r in range(3)] == [0, 1, 2]


def test_loopback_hosts_are_one_machine():
    # --hosts 127.0.0.2,127.0.0.3: LOCAL_RANK is 0 on both "hosts", yet they share the cores
    hosts = ("127.0.0.2:5001", "127.0.0.3:5002")
    assert [machine_slot(r, 0, hosts) for r in range(2)] == [0, 1]


def test_ranks_of_other_hosts_do_not_count():
    hosts = ("node1:5001", "node1:5002", "node2:5003", "node2:5004")
    assert [machine_slot(r, r % 2, hosts) for r in range(4)] == [0, 1, 0, 1]


def test_ranks_on_a_shaped_link_take_the_slot_dlbench_gives():
    # --link: each rank in a namespace of this machine, at an address of its own, LOCAL_RANK 0
    from dlbench.execution.launch_styles import JobLayout, rank_processes
    from dlbench.execution.placement import namespace_placement

    placement = namespace_placement(["10.9.9.1", "10.9.9.2"], ["dlbx-w0", "dlbx-w1"], 2)
    layout = JobLayout(python="py", worker="w.py", request="r.json", job_dir="j", placement=placement, threads=1,
                       coordinator_port=5000, worker_ports=(5001, 5002))
    envs = [spec.env for spec in rank_processes(layout)]
    assert [slot_from_env(env) for env in envs] == [0, 1]
    assert [slot_from_env({k: v for k, v in env.items() if k != "DLBENCH_MACHINE_SLOT"}) for env in envs] == [0, 0]


def test_without_addresses_the_local_rank_is_the_slot():
    assert machine_slot(3, 1, ()) == 1


@pytest.mark.parametrize("threads, slot, want", [(1, 0, [0]), (1, 1, [1]), (2, 1, [2, 3]), (3, 1, [3, 0, 1])])
def test_cpu_slices_are_disjoint_blocks(threads, slot, want):
    assert cpu_slice([0, 1, 2, 3], threads, slot) == want


def test_cpu_slices_follow_the_allowed_cpus():
    assert cpu_slice([4, 6], 1, 1) == [6]


def test_all_reduces_counted_in_compiled_hlo():
    hlo = """
  %all-reduce = (f32[2048]{0}, /*index=5*/f32[4096,1024]{1,0}) all-reduce(%ynn_fusion.2, %dot), channel_id=1
  %get-tuple-element.16 = f32[2048]{0} get-tuple-element(%all-reduce), index=0
  %ars = f32[8]{0} all-reduce-start(%p), channel_id=2
  %ard = f32[8]{0} all-reduce-done(%ars)
  ROOT %psum.7 = f32[64,64]{1,0} all-reduce(%dot), channel_id=3
  %fusion = f32[8]{0} fusion(%all-reduce), kind=kLoop
"""
    assert _count_collectives(hlo) == 3
    assert _count_collectives("  ROOT %add = f32[8]{0} add(%a, %b)") == 0
