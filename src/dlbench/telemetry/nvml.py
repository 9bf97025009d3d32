"""GPU telemetry through NVML: what each device is, and what it does, one query at a time.

Every query can fail on its own. NVML may be missing altogether (no library, no driver, no
device); a query may not be supported on a GPU (older GPUs have no energy counter and no averaged
power); a GPU can fall off the bus mid-run. None of these stops sampling: a query that fails on a
device's first sample is recorded as unsupported with NVML's reason and not asked again, a later
failure leaves a gap (None) and is counted, and a lost GPU keeps the samples it gave and is not
asked again.

The binding is imported by name (`nvml_module`, "pynvml" by default), so that tests can put a
scripted module in its place that raises the real binding's errors.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

# Errors after which a device answers nothing any more (GpuNotFound only exists in newer bindings).
_LOST_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_GpuNotFound", "NVMLError_ResetRequired")


@dataclass(frozen=True)
class Query:
    """One NVML question about a device, and the columns its answer fills."""

    name: str  # as reported in `unsupported`: the NVML function, with its argument where there are several
    columns: tuple[str, ...]
    read: Callable[[Any], tuple]  # handle -> one value per column


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def load(module_name: str) -> tuple[ModuleType | None, str | None]:
    """Import the binding and initialise NVML: (module, None), or (None, why not)."""
    try:
        nvml = importlib.import_module(module_name)
    except ImportError as e:
        return None, f"{module_name} not importable: {e}"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return None, f"NVML: {e}"
    return nvml, None


def shutdown(nvml: ModuleType) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        pass  # nothing left to release that a failing shutdown would give back


def system_versions(nvml: ModuleType) -> tuple[dict, dict]:
    """({"driver", "cuda_driver"}, {query: reason} for those NVML could not answer)."""
    versions: dict = {"driver": None, "cuda_driver": None}
    unsupported = {}
    try:
        versions["driver"] = text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as e:
        unsupported["nvmlSystemGetDriverVersion"] = str(e)
    try:
        v = nvml.nvmlSystemGetCudaDriverVersion()
        versions["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
    except nvml.NVMLError as e:
        unsupported["nvmlSystemGetCudaDriverVersion"] = str(e)
    return versions, unsupported


def clock_event_bits(nvml: ModuleType) -> dict[str, int]:
    """Reason name -> bit, from the binding's own constants (nvmlClocksEventReason*, and the older
    nvmlClocksThrottleReason*, which has bits the newer family lacks, e.g. board_limit)."""
    bits: dict[str, int] = {}
    for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
        # sorted(): a deprecated alias (UserDefinedClocks) comes after the name it aliases and is dropped
        for attr in sorted(a for a in dir(nvml) if a.startswith(prefix)):
            value = getattr(nvml, attr)
            single_bit = isinstance(value, int) and value > 0 and value & (value - 1) == 0
            if single_bit and value not in bits.values():
                bits[re.sub(r"(?<!^)(?=[A-Z])", "_", attr[len(prefix):]).lower()] = value
    return bits


def _field_value(nvml: ModuleType, value) -> float:
    """A nvmlFieldValue_t's number, read from the union member its valueType names."""
    member = {
        "NVML_VALUE_TYPE_DOUBLE": "dVal", "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
        "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal", "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
        "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal", "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
        "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
    }
    by_type = {getattr(nvml, k): v for k, v in member.items() if hasattr(nvml, k)}
    return getattr(value.value, by_type[value.valueType])


def _field_query(nvml: ModuleType, constant: str, column: str) -> Query:
    field_id = getattr(nvml, constant, None)

    def read(handle):
        if field_id is None:
            raise nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # an older binding without the field
        (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
        if value.nvmlReturn != nvml.NVML_SUCCESS:  # each field answers on its own
            raise nvml.NVMLError(value.nvmlReturn)
        return (_field_value(nvml, value) / 1000,)  # mW -> W

    return Query(constant, (column,), read)


def _clock_events_query(nvml: ModuleType) -> Query:
    """Active clock-event (throttle) reasons as a bitmask. The function was renamed from
    ...ClocksThrottleReasons to ...ClocksEventReasons; an older binding has only the old name, and
    an older driver may lack the new symbol (FunctionNotFound) under a newer binding."""
    event = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    throttle = getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    use_throttle = event is None

    def read(handle):
        nonlocal use_throttle
        if not use_throttle:
            try:
                return (int(event(handle)),)
            except nvml.NVMLError_FunctionNotFound:
                if throttle is None:
                    raise
                use_throttle = True
        return (int(throttle(handle)),)

    return Query("nvmlDeviceGetCurrentClocksEventReasons", ("clock_events",), read)


def static_queries(nvml: ModuleType) -> list[Query]:
    n = nvml

    def ecc_mode(h):
        current, pending = n.nvmlDeviceGetEccMode(h)
        return ({"current": bool(current), "pending": bool(pending)},)

    return [
        Query("nvmlDeviceGetName", ("name",), lambda h: (text(n.nvmlDeviceGetName(h)),)),
        Query("nvmlDeviceGetUUID", ("uuid",), lambda h: (text(n.nvmlDeviceGetUUID(h)),)),
        Query("nvmlDeviceGetEnforcedPowerLimit", ("power_limit_w",),
              lambda h: (n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,)),
        Query("nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM)", ("max_sm_clock_mhz",),
              lambda h: (n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM),)),
        Query("nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)", ("max_mem_clock_mhz",),
              lambda h: (n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM),)),
        Query("nvmlDeviceGetMemoryInfo", ("memory_total_bytes",), lambda h: (int(n.nvmlDeviceGetMemoryInfo(h).total),)),
        Query("nvmlDeviceGetEccMode", ("ecc_mode",), ecc_mode),
        Query("nvmlDeviceGetPersistenceMode", ("persistence_mode",),
              lambda h: (bool(n.nvmlDeviceGetPersistenceMode(h)),)),
    ]


def sampled_queries(nvml: ModuleType) -> list[Query]:
    """Asked at every sample, in this order: power first, closest to the sample's timestamp."""
    n = nvml

    def utilisation(h):
        u = n.nvmlDeviceGetUtilizationRates(h)
        return u.gpu, u.memory

    return [
        # On Ampere and newer (except GA100) GetPowerUsage is itself a 1 s average; the instant field,
        # where the driver has it, is what the trapezoidal fallback integrates.
        Query("nvmlDeviceGetPowerUsage", ("power_w",), lambda h: (n.nvmlDeviceGetPowerUsage(h) / 1000,)),
        _field_query(n, "NVML_FI_DEV_POWER_INSTANT", "power_instant_w"),
        _field_query(n, "NVML_FI_DEV_POWER_AVERAGE", "power_avg_w"),
        Query("nvmlDeviceGetTotalEnergyConsumption", ("energy_mj",),
              lambda h: (n.nvmlDeviceGetTotalEnergyConsumption(h),)),
        Query("nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", ("sm_clock_mhz",),
              lambda h: (n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),)),
        Query("nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)", ("mem_clock_mhz",),
              lambda h: (n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),)),
        Query("nvmlDeviceGetClockInfo(NVML_CLOCK_GRAPHICS)", ("graphics_clock_mhz",),
              lambda h: (n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_GRAPHICS),)),
        Query("nvmlDeviceGetTemperature", ("temp_c",),
              lambda h: (n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),)),
        Query("nvmlDeviceGetUtilizationRates", ("gpu_util_pct", "mem_util_pct"), utilisation),
        Query("nvmlDeviceGetMemoryInfo", ("mem_used_bytes",), lambda h: (int(n.nvmlDeviceGetMemoryInfo(h).used),)),
        Query("nvmlDeviceGetPerformanceState", ("pstate",), lambda h: (n.nvmlDeviceGetPerformanceState(h),)),
        Query("nvmlDeviceGetFanSpeed", ("fan_pct",), lambda h: (n.nvmlDeviceGetFanSpeed(h),)),
        _clock_events_query(n),
    ]


class GpuDevice:
    """One GPU: its static description, and one value per column at every sample (None in a gap)."""

    def __init__(self, nvml: ModuleType, index: int, versions: dict):
        self._nvml = nvml
        self._lost_errors = tuple(getattr(nvml, name) for name in _LOST_ERRORS if hasattr(nvml, name))
        self.static: dict = {"index": index, **versions}
        self.unsupported: dict[str, str] = {}
        self.errors: dict[str, dict] = {}
        self.lost: dict | None = None
        self.series: dict[str, list] = {}
        self._queries = sampled_queries(nvml)
        self._probed = False  # a query that fails on the first sample is unsupported, not a gap
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as e:  # t_ns None: never reachable
            self.lost = {"t_ns": None, "reason": f"nvmlDeviceGetHandleByIndex({index}): {e}"}
            return
        for query in static_queries(nvml):
            try:
                self.static.update(zip(query.columns, query.read(self._handle)))
            except self._lost_errors as e:
                self.lost = {"t_ns": None, "reason": f"{query.name}: {e}"}
                return
            except nvml.NVMLError as e:
                self.static.update(dict.fromkeys(query.columns))
                self.unsupported[query.name] = str(e)
        for query in self._queries:
            self.series.update({c: [] for c in query.columns})

    def sample(self, t_ns: int, rows_before: int) -> None:
        """Append one value to every column (None in a gap). `rows_before` is the number of samples
        taken before this one, so that a lost device's columns stay as long as everyone else's."""
        if self.lost is not None:
            self._pad(rows_before + 1)
            return
        row: dict = {}
        for query in list(self._queries):
            try:
                row.update(zip(query.columns, query.read(self._handle)))
            except self._lost_errors as e:
                self.lost = {"t_ns": t_ns, "reason": f"{query.name}: {e}"}
                self._pad(rows_before + 1)
                return
            except self._nvml.NVMLError as e:
                if not self._probed:
                    self.unsupported[query.name] = str(e)
                    self._queries.remove(query)
                    for column in query.columns:
                        del self.series[column]
                    continue
                seen = self.errors.setdefault(query.name, {"count": 0, "last": None})
                seen["count"] += 1
                seen["last"] = str(e)
        self._probed = True
        for column, values in self.series.items():
            values.append(row.get(column))

    def _pad(self, rows: int) -> None:
        for values in self.series.values():
            values.extend([None] * (rows - len(values)))

    def probe(self) -> dict[str, str | None]:
        """Each sampled query asked once: name -> None when it answers, else NVML's reason."""
        answers: dict[str, str | None] = {}
        for query in self._queries:
            try:
                query.read(self._handle)
                answers[query.name] = None
            except self._nvml.NVMLError as e:
                answers[query.name] = str(e)
        return answers


class GpuTelemetry:
    """The GPUs a run uses, sampled together; `reason` says why there are none."""

    def __init__(self, module_name: str, indices: tuple[int, ...] | None):
        self.requested = None if indices is None else list(indices)
        self.devices: list[GpuDevice] = []
        self.bits: dict[str, int] = {}
        self.reason: str | None = None
        self._nvml: ModuleType | None = None
        if indices == ():
            self.reason = "no GPU requested"
            return
        self._nvml, self.reason = load(module_name)
        if self._nvml is None:
            return
        nvml = self._nvml
        versions, system_unsupported = system_versions(nvml)
        if indices is None:
            try:
                indices = tuple(range(nvml.nvmlDeviceGetCount()))
            except nvml.NVMLError as e:
                self.reason = f"NVML: nvmlDeviceGetCount: {e}"
                return
            if not indices:
                self.reason = "NVML sees no GPU"
                return
        self.bits = clock_event_bits(nvml)
        self.devices = [GpuDevice(nvml, i, versions) for i in indices]
        for device in self.devices:
            device.unsupported.update(system_unsupported)

    @property
    def available(self) -> bool:
        return bool(self.devices)

    def sample(self, t_ns: int, rows_before: int) -> None:
        for device in self.devices:
            device.sample(t_ns, rows_before)

    def result(self) -> dict:
        return {
            "requested": self.requested,
            "available": self.available,
            "reason": self.reason,
            "clock_event_bits": self.bits,
            "static": [d.static for d in self.devices],
            "unsupported": [d.unsupported for d in self.devices],
            "errors": [d.errors for d in self.devices],
            "lost": [d.lost for d in self.devices],
            "series": [d.series for d in self.devices],
        }

    def close(self) -> None:
        if self._nvml is not None:
            shutdown(self._nvml)
            self._nvml = None
