"""Upgrade stored records written by older dlbench versions, one schema step at a time.

`update_to_N(data)` takes a record of version N-1 (plain JSON data) and returns it at version N.
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


def update_to_5(data: dict) -> dict:
    """5 added multi-worker runs (`distributed`, `comm`, per-rank timings, the `collective` mode).
    A single-process record of version 4 is one as version 5 writes it: absent means none."""
    return data


STEPS = {2: update_to_2, 3: update_to_3, 4: update_to_4, 5: update_to_5}


def upgrade(data: dict, target: int) -> dict:
    version = data["schema_version"]
    while version < target:
        version += 1
        data = STEPS[version](data)
        data["schema_version"] = version
    return data
