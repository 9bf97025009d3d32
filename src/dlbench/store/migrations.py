"""Upgrade stored records written by older dlbench versions, one schema step at a time.

`update_to_N(data)` takes a record of version N-1 (plain JSON data) and returns it at version N.
Records are upgraded on read; the files themselves are never rewritten here.
"""

from __future__ import annotations


def update_to_2(data: dict) -> dict:
    """2 added the equivalence status of the run's network and framework."""
    data["equivalence"] = {"status": "unchecked", "reason": "recorded before dlbench checked equivalence"}
    return data


def update_to_3(data: dict) -> dict:
    """3 added telemetry (sampled series per repeat, derived figures, a run summary)."""
    data["telemetry"] = {"enabled": False, "reason": "recorded before dlbench sampled telemetry"}
    return data


STEPS = {2: update_to_2, 3: update_to_3}


def upgrade(data: dict, target: int) -> dict:
    version = data["schema_version"]
    while version < target:
        version += 1
        data = STEPS[version](data)
        data["schema_version"] = version
    return data
