"""Machine profiles in the store: revisions never overwritten, checksums verified, `--machine` resolved."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from dlbench.store.merge import merge
from dlbench.store.profiles import MachineProfile, MatmulCeiling, ProfileError, ProfileStore, read_profile
from dlbench.store.store import Store, checksum_of
from dlbench.store.verify import verify


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


@pytest.mark.parametrize("older", [1, 2])
def test_an_older_profile_reads_as_one_without_what_came_later_and_a_newer_one_is_refused(tmp_path, older):
    """Format 2 added `class_probes`, format 3 `yardstick`; a profile calibrate wrote before reads with
    none of them."""
    profiles = ProfileStore(Store(tmp_path))
    profiles.write(make())
    path = profiles.path("a" * 64, 1)
    data = json.loads(path.read_text())
    assert data["format"] == 3 and data["class_probes"] == {} and data["yardstick"] == {}
    del data["checksum"], data["yardstick"]
    if older == 1:
        del data["class_probes"]
    data["format"] = older
    data["checksum"] = checksum_of(data)
    path.write_text(json.dumps(data))
    old = read_profile(path)
    assert old.class_probes == {} and old.yardstick == {} and old.peak_flops() == 1e9
    data["format"] = 4
    data["checksum"] = checksum_of({k: v for k, v in data.items() if k != "checksum"})
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="format 4; this dlbench reads formats 1, 2, 3"):
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


def test_verify_and_merge_cover_profiles_and_kernel_records(tmp_path):
    from test_kernel_suite import kernel_record

    from dlbench.store.kernels import KernelStore

    a, b = Store(tmp_path / "a"), Store(tmp_path / "b")
    ProfileStore(a).write(make())
    KernelStore(a).write(kernel_record("20261201T000000Z-a", times={"k": 1.0}))
    ProfileStore(b).write(make(peak=7e9))  # the same machine's revision 1, other content
    report = verify(a)
    assert (report.kernels, report.profiles, report.problems) == (1, 1, [])
    merged = merge(b, [a.root])
    assert [p.relative_to(b.root).as_posix() for p in merged.added] == ["kernels/20261201T000000Z-a.json"]
    assert len(merged.conflicts) == 1 and "profile-0001.json" in merged.conflicts[0][1]
    assert ProfileStore(b).latest("a" * 64).peak_flops() == 7e9  # the destination's kept
    again = merge(b, [a.root])
    assert len(again.duplicates) == 1 and not again.added
    kernel_file = a.root / "kernels" / "20261201T000000Z-a.json"
    kernel_file.write_text(kernel_file.read_text().replace('"median_s": 1.0', '"median_s": 2.0'))
    report = verify(a)
    assert len(report.problems) == 1 and "checksum" in report.problems[0].reason
    assert merge(Store(tmp_path / "c"), [a.root]).unreadable[0][0] == kernel_file
