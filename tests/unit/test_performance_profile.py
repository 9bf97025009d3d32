"""Machine profiles in the store: revisions never overwritten, checksums verified, `--machine` resolved."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from dlbench.performance.profile import MachineProfile, MatmulCeiling, ProfileError, ProfileStore, read_profile
from dlbench.store.store import Store


def make(machine_id="a" * 64, hostname="box", peak=1e9) -> MachineProfile:
    return MachineProfile(machine_id=machine_id, created_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
                          dlbench={"version": "test"}, machine={"hostname": hostname, "machine_id": machine_id},
                          device="cpu", threads=2,
                          matmul_peak={"float32": MatmulCeiling(flops_per_s=peak, framework="torch", kernel="k")})


def test_revisions_count_up_and_never_replace(tmp_path):
    profiles = ProfileStore(Store(tmp_path))
    first = profiles.write(make(peak=1e9))
    second = profiles.write(make(peak=2e9))
    assert (first.revision, second.revision) == (1, 2)
    assert profiles.revisions("a" * 64) == [1, 2]
    assert profiles.latest("a" * 64).peak_flops() == 2e9
    assert read_profile(profiles.path("a" * 64, 1)).peak_flops() == 1e9
    assert not list((tmp_path / ".incoming").glob("*.tmp"))
    assert second.ref == "aaaaaaaaaaaa@2"


def test_a_changed_profile_is_refused_by_name(tmp_path):
    profiles = ProfileStore(Store(tmp_path))
    profiles.write(make())
    path = profiles.path("a" * 64, 1)
    data = json.loads(path.read_text())
    data["matmul_peak"]["float32"]["flops_per_s"] = 5e12
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="checksum mismatch") as info:
        read_profile(path)
    assert str(path) in str(info.value)
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="unreadable"):
        read_profile(path)


def test_machine_option_resolves_ids_hostnames_revisions_and_paths(tmp_path):
    profiles = ProfileStore(Store(tmp_path))
    profiles.write(make())
    profiles.write(make(peak=3e9))
    profiles.write(make(machine_id="b" * 64, hostname="other"))
    assert profiles.resolve(None, "a" * 64).revision == 2
    assert profiles.resolve("aaaa", "z").revision == 2
    assert profiles.resolve("aaaa@1", "z").peak_flops() == 1e9
    assert profiles.resolve("other", "z").machine_id == "b" * 64
    assert profiles.resolve(str(profiles.path("a" * 64, 1)), "z").revision == 1
    with pytest.raises(ProfileError, match="run `dlbench calibrate` first"):
        profiles.resolve(None, "c" * 64)
    with pytest.raises(ProfileError, match="no such profile file or machine"):
        profiles.resolve("nowhere", "z")
    with pytest.raises(ProfileError, match="has revisions \\[1, 2\\], not 7"):
        profiles.resolve("aaaa@7", "z")
