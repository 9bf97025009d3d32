"""Provenance in every record: the machine with its GPUs and drivers (through a scripted NVML), a
machine id that changes with the hardware and not with software or load, the runner environment's
interpreter and lock (every installed package), dlbench's version and commit, the network's hash."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
import types
from pathlib import Path

import pytest

from dlbench.execution.orchestrator import Orchestrator, RunOptions, plan
from dlbench.machine import fingerprint, gpus, machine_id
from dlbench.store.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import fake_pynvml  # noqa: E402

GPU0 = {"static": {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-5d1b2a4e-0001-4c1f-9a2b-1c2d3e4f5a6b",
                   "memory_total": 85_520_809_984}}
GPU1 = {"static": {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-5d1b2a4e-0002-4c1f-9a2b-1c2d3e4f5a6b",
                   "memory_total": 85_520_809_984}}
TRACE = {"driver": "550.54.15", "cuda_driver": 12040, "devices": [GPU0, GPU1]}


@pytest.fixture
def nvml(monkeypatch):
    """The scripted NVML with two GPUs, and a variant of it whose binding also answers serials and
    PCI bus ids (the fake does not script them: like a consumer board, it cannot say)."""
    monkeypatch.setenv(fake_pynvml.ENV, json.dumps(TRACE))
    serials = types.ModuleType("fake_pynvml_with_serials")

    class PciInfo:
        def __init__(self, index):
            self.busId = f"00000000:{0x17 + index:02X}:00.0".encode()

    serials.nvmlDeviceGetSerial = lambda handle: f"165432100{handle.index}".encode()
    serials.nvmlDeviceGetPciInfo = lambda handle: PciInfo(handle.index)
    serials.__getattr__ = lambda name: getattr(fake_pynvml, name)
    monkeypatch.setitem(sys.modules, "fake_pynvml_with_serials", serials)
    fingerprint.cache_clear()
    yield
    fingerprint.cache_clear()


def test_gpus_names_uuids_memory_and_drivers(nvml):
    g = gpus("fake_pynvml")
    assert g["driver"] == "550.54.15" and g["cuda_driver"] == "12.4"
    assert [(d["index"], d["name"], d["uuid"], d["memory_bytes"]) for d in g["gpus"]] == [
        (0, "NVIDIA H100 80GB HBM3", GPU0["static"]["uuid"], 85_520_809_984),
        (1, "NVIDIA H100 80GB HBM3", GPU1["static"]["uuid"], 85_520_809_984)]
    # what this binding cannot answer is None, and says why
    assert all(d["serial"] is None and d["pci_bus_id"] is None for d in g["gpus"])
    assert "no nvmlDeviceGetSerial" in g["unsupported"]["nvmlDeviceGetSerial[0]"]


def test_gpus_serials_and_bus_ids_where_nvml_has_them(nvml):
    g = gpus("fake_pynvml_with_serials")
    assert [(d["serial"], d["pci_bus_id"]) for d in g["gpus"]] == [
        ("1654321000", "00000000:17:00.0"), ("1654321001", "00000000:18:00.0")]
    assert g["unsupported"] == {}


def test_gpus_a_driver_that_does_not_say_its_cuda_version(monkeypatch, nvml):
    monkeypatch.setenv(fake_pynvml.ENV, json.dumps({"driver": "535.1", "devices": [GPU0]}))
    g = gpus("fake_pynvml")
    assert g["driver"] == "535.1" and g["cuda_driver"] is None and "nvmlSystemGetCudaDriverVersion" in g["unsupported"]
    assert len(g["gpus"]) == 1


def test_gpus_without_nvml_say_why(monkeypatch, nvml):
    monkeypatch.setenv(fake_pynvml.ENV, json.dumps({"init_error": "LIBRARY_NOT_FOUND"}))
    g = gpus("fake_pynvml")
    assert g["gpus"] == [] and g["unavailable"].startswith("NVML:")
    assert gpus("no_such_binding")["unavailable"].startswith("no_such_binding not importable")


def test_fingerprint_holds_the_gpus_and_a_machine_id(nvml):
    fp = fingerprint("fake_pynvml")
    assert [d["uuid"] for d in fp["gpus"]] == [GPU0["static"]["uuid"], GPU1["static"]["uuid"]]
    assert fp["driver"] == "550.54.15" and fp["cuda_driver"] == "12.4"
    assert fp["machine_id"] == machine_id(fp) and len(fp["machine_id"]) == 16
    fingerprint.cache_clear()
    assert fingerprint("fake_pynvml")["machine_id"] == fp["machine_id"]  # measured again: the same
    assert fingerprint("fake_pynvml_with_serials")["machine_id"] == fp["machine_id"]


def base_machine() -> dict:
    return {"hostname": "node7", "cpu_model": "AMD EPYC 9654", "cpu_logical": 384, "cpu_physical": 192,
            "cpu_available": 384, "memory_bytes": 1_622_987_620_352, "os": "Linux-6.8", "kernel": "6.8.0",
            "python": "3.11.7", "arch": "x86_64", "driver": "550.54.15", "cuda_driver": "12.4",
            "gpus": [{"index": 0, "name": "NVIDIA H100", "uuid": "GPU-a", "memory_bytes": 85_520_809_984},
                     {"index": 1, "name": "NVIDIA H100", "uuid": "GPU-b", "memory_bytes": 85_520_809_984}]}


@pytest.mark.parametrize("change", [
    {"os": "Linux-6.9"}, {"kernel": "6.9.1"}, {"python": "3.12.1"}, {"driver": "560.1"}, {"cuda_driver": "12.6"},
    {"cpu_available": 8},  # an affinity mask, not the machine
    {"memory_bytes": 1_622_987_620_352 - 48 * 2**20},  # a new kernel reserves a little more (at a GiB's half)
    {"gpus_reordered": True}, {"serials": True}, {"unavailable": "x", "unsupported": {"q": "r"}},
])
def test_machine_id_ignores_software_and_what_varies(change):
    fp = base_machine()
    changed = {**fp, **{k: v for k, v in change.items() if k not in ("gpus_reordered", "serials")}}
    if "gpus_reordered" in change:
        changed["gpus"] = list(reversed(fp["gpus"]))
    if "serials" in change:
        changed["gpus"] = [{**g, "serial": "123", "pci_bus_id": "0:1"} for g in fp["gpus"]]
    assert machine_id(changed) == machine_id(fp)


@pytest.mark.parametrize("change", [
    {"hostname": "node8"}, {"cpu_model": "AMD EPYC 9754"}, {"cpu_logical": 192}, {"cpu_physical": 96},
    {"arch": "aarch64"},
    {"gpus": [{"index": 0, "name": "NVIDIA H100", "uuid": "GPU-a", "memory_bytes": 1}]},  # one GPU gone
    {"gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-c"}]},  # one GPU swapped
])
def test_machine_id_changes_with_the_hardware(change):
    assert machine_id({**base_machine(), **change}) != machine_id(base_machine())


# --------------------------------------------------------------------------- in a record


@pytest.fixture
def fast(fast_fake_runner):
    pass


def test_a_run_record_carries_its_provenance(tmp_path, suite, fake, fast):
    store = Store(tmp_path / "store")
    options = RunOptions(device="cpu", env_backend="current", threads=1, repeats=1, timeout_s=60.0,
                         cache=tmp_path / "cache")
    fcn5 = [b for b in suite.benchmarks if b.name == "fcn5-train"]
    (returned,) = Orchestrator(store, options).execute(plan([fake], fcn5))
    stored = store.inspect(store.paths()[0])
    assert stored.verified and stored.record == returned
    rec = stored.record
    # the runner environment: interpreter, its version, and the lock (every installed distribution)
    env = rec.environment
    assert env["python"] == sys.executable and env["python_version"] == platform.python_version()
    installed = {f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions() if d.metadata["Name"]}
    assert set(env["packages"]) == installed
    assert f"pydantic=={importlib.metadata.version('pydantic')}" in env["packages"]
    # the machine, with an id to filter and merge on
    assert rec.machine["machine_id"] == machine_id(rec.machine) == fingerprint()["machine_id"]
    assert "gpus" in rec.machine and ("driver" in rec.machine or "unavailable" in rec.machine)
    # dlbench and the network
    from dlbench.version import __version__
    assert rec.dlbench["version"] == __version__ and "commit" in rec.dlbench
    assert rec.network.hash == fcn5[0].network.definition_hash


def test_a_venv_environment_describes_its_interpreter_version_and_lock(tmp_path, fake):
    from dlbench.execution.environments import MARKER, VenvBackend

    venv = VenvBackend(tmp_path / "cache")
    path = venv.path_for(fake, "cpu")
    path.mkdir(parents=True)
    lock = ["numpy==2.4.6", "torch==2.13.0+cpu"]
    (path / MARKER).write_text(json.dumps({"framework": "fake", "flavour": "cpu", "key": path.name.rsplit("-", 1)[1],
                                           "python_version": "3.11.7", "packages": lock}))
    described = venv.existing(fake, "cpu").describe()
    assert described["python"] == str(path / "bin" / "python") and described["python_version"] == "3.11.7"
    assert described["packages"] == lock and described["backend"] == "venv"
