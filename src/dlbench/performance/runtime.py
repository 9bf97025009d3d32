"""Predictions made by `dlbench run`: every run is predicted from this machine's latest profile before
it runs, and the prediction is kept in its record (store.record.Prediction)."""

from __future__ import annotations

from collections.abc import Mapping

from ..store.profiles import MachineProfile, ProfileError, ProfileStore
from ..store.store import Store
from .model import MODEL_VERSION, FrameworkFacts, PredictionError, predict
from .workload import decompose


class RunPredictor:
    """Called by the orchestrators with a run's resolved network, per-worker batch, mode, precision,
    framework and workers; returns the record's prediction. A run the profile cannot predict (no
    all-reduce fit for its workers, a layer the model does not know) gets `error` saying why.
    `frameworks`: each framework's FrameworkFacts, as its runner.toml states them (the caller reads
    them: RunnerInfo.model); a framework missing from it gets FrameworkFacts()'s defaults."""

    def __init__(self, profile: MachineProfile, threads: int | None = None, schedule: str | None = None,
                 frameworks: Mapping[str, FrameworkFacts] | None = None):
        self.profile = profile
        self.threads = threads
        self.schedule = schedule
        self.frameworks = dict(frameworks or {})

    def __call__(self, *, network: dict, batch: int, mode: str, precision: str, framework: str,
                 workers: int = 1) -> dict:
        try:
            work = decompose(network, batch, mode, precision)
            return predict(work, framework, self.profile, workers, self.schedule, threads=self.threads,
                           facts=self.frameworks.get(framework)).to_record()
        except (PredictionError, ValueError) as e:
            return {"model_version": MODEL_VERSION, "profile": self.profile.ref, "workers": workers, "error": str(e)}


def run_predictor(store: Store, machine_id: str, device: str, threads: int | None,
                  frameworks: Mapping[str, FrameworkFacts]) -> tuple[RunPredictor | None, str]:
    """(the predictor, what it predicts from) or (None, why nothing is predicted). `frameworks`: the
    runs' runners' facts, as for RunPredictor (required: a caller that forgot them would predict
    every compiled step as an eager one)."""
    try:
        profile = ProfileStore(store).latest_matching(machine_id, device, threads)
    except ProfileError as e:
        return None, f"the machine profile cannot be read ({e})"
    if profile is None:
        return None, (f"no machine profile of this machine for {device} in the store "
                      "(`dlbench calibrate` makes one)")
    return RunPredictor(profile, threads, frameworks=frameworks), f"machine profile {profile.ref} ({profile.threads} threads)"
