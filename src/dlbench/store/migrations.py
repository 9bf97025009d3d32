"""Upgrade stored records written by older dlbench versions, one schema step at a time.

`update_to_N(data)` takes a record of version N-1 (plain JSON data) and returns it at version N;
a version that only added optional fields has no function of its own (MODEL_DEFAULTS_SUFFICE).
Records are upgraded on read; the files themselves are rewritten only by `dlbench store upgrade`
(Store.upgrade), which keeps the originals. A step must be deterministic (the same old record always
gives the same new one): `dlbench store merge` compares records of different versions by their
upgraded content.
"""

from __future__ import annotations

from ..machine import machine_id


def update_to_2(data: dict) -> dict:
    """2 added the equivalence status of the run's network and framework."""
    data["equivalence"] = {"status": "unchecked", "reason": "recorded before dlbench checked equivalence"}
    return data


def update_to_3(data: dict) -> dict:
    """3 added telemetry (sampled series per repeat, derived figures, a run summary)."""
    data["telemetry"] = {"enabled": False, "reason": "recorded before dlbench sampled telemetry"}
    return data


def update_to_4(data: dict) -> dict:
    """4 added `machine.machine_id` and the file's checksum. An older record has no checksum (it is
    read as unverified: there is nothing to verify it against), and its machine id is computed from
    the fingerprint it stored, which holds every part the id is made of."""
    machine = data.get("machine")
    if isinstance(machine, dict) and "machine_id" not in machine:
        data["machine"] = {**machine, "machine_id": machine_id(machine)}
    return data


# What each runner ran when a record did not say (before schema 6): its runner.toml's default then.
_COMPILE_BEFORE_6 = {"torch": "eager", "tensorflow": "eager", "jax": "compiled", "mxnet": "compiled"}


def update_to_6(data: dict) -> dict:
    """6 named the precisions (fp32 pinned, tf32, amp_*) and added the compile mode, the allocator
    peak and compiler counters per repeat and the summary's compile time. "float32" was IEEE on the
    CPU (fp32) but not pinned on CUDA, where cuDNN allowed TF32 convolutions by default."""
    workload = data.get("workload")
    if isinstance(workload, dict):
        if workload.get("precision") == "float32" and workload.get("mode") != "collective":
            workload["precision"] = "fp32" if workload.get("device") == "cpu" else "float32 (TF32 not pinned)"
        if "compile" not in workload:
            framework = (data.get("framework") or {}).get("name")
            runner = ((data.get("settings") or {}).get("runner") or {})
            mode = _COMPILE_BEFORE_6.get(framework, "eager")
            if framework == "tensorflow" and runner.get("jit_compile_requested"):
                mode = "compiled"
            workload["compile"] = mode
    return data


def update_to_7(data: dict) -> dict:
    """7 added each repeat's contention (and the `contended` repeat status, which no older record
    has) and the guard's settings in repeat_policy (absent: none); equivalence gained keys only."""
    for rep in data.get("repeats") or []:
        if isinstance(rep, dict) and "contention" not in rep:
            rep["contention"] = {"measured": False, "reason": "recorded before dlbench measured contention"}
    return data


def update_to_8(data: dict) -> dict:
    """8 judged --target-ci on the reported interval and recorded its half-width
    (`achieved_reported_ci_pct`, left absent: the tables derive it on read); an adaptive record
    before 8 stopped on the stored bootstrap's half-width, which its `target_interval` now says."""
    policy = data.get("repeat_policy")
    if isinstance(policy, dict) and policy.get("kind") == "adaptive" and "target_interval" not in policy:
        policy["target_interval"] = "bootstrap"
    return data


def update_to_17(data: dict) -> dict:
    """17 added the gradient compression of data-parallel training: every older data-parallel
    training record (a training workload with a `distributed` part) exchanged dense float32
    gradients, so its compression is "none"; other records have none (None)."""
    workload = data.get("workload")
    if isinstance(workload, dict) and workload.get("mode") == "train" and data.get("distributed") \
            and "compression" not in workload:
        workload["compression"] = "none"
    return data


# The versions that only added fields an older record lacks and the model defaults to "none" (None,
# {}, []; record.py's history says which): a record of the version before reads as one of them
# with nothing changed but its version number. Each is still a step, so that every version says
# how a record reaches it.
MODEL_DEFAULTS_SUFFICE = (5, 9, 10, 11, 12, 13, 14, 15, 16, 18)


def _version_only(data: dict) -> dict:
    return data


STEPS = {2: update_to_2, 3: update_to_3, 4: update_to_4, 6: update_to_6, 7: update_to_7, 8: update_to_8, 17: update_to_17,
         **dict.fromkeys(MODEL_DEFAULTS_SUFFICE, _version_only)}


def upgrade(data: dict, target: int) -> dict:
    version = data["schema_version"]
    while version < target:
        version += 1
        data = STEPS[version](data)
        data["schema_version"] = version
    return data
