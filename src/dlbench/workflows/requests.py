"""What the workflows are asked: typed requests, one per workflow, built by the command line from its
options or by a notebook directly, and the one error a request that cannot run as asked raises. A
field left at its default asks for nothing (the suite's, the profile's or the runner's own choice),
so an option a suite kind does not honour is refused only when it is set (suite_kinds.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path


class RequestError(ValueError):
    """A request that cannot run as asked (one message naming what and why); nothing was run or
    written. The command line prints it and exits 2."""


@dataclass(frozen=True)
class RunRequest:
    """`dlbench run`: a suite (a name, a path to a suite file, or 'all') on some frameworks.

    The list fields take names, comma lists and 'all' as the command line does. For example
    `RunRequest(suite="fcn", framework=["torch"], profile="smoke", precision=["fp32,amp_bf16"])`.
    What each field is for: suite_kinds.RUN_OPTIONS; which suite kinds honour it: SUITE_KIND_TABLE."""

    suite: str
    framework: list[str] = field(default_factory=lambda: ["all"])
    benchmark: list[str] | None = None
    mode: list[str] | None = None
    profile: str = "default"
    device: str = "auto"
    env: str = "venv"
    threads: int | None = None
    repeats: int | None = None
    max_repeats: int | None = None
    target_ci: float | None = None
    store: Path | None = None
    timeout: float = 1800.0
    sample_interval: float = 100.0
    no_telemetry: bool = False
    workers: int | None = None
    scaling: str | None = None
    hosts: str | None = None
    precision: list[str] | None = None
    compile: list[str] | None = None
    compile_mode: str = "default"
    scenario: list[str] | None = None
    no_check: bool = False
    contention_threshold: float = 10.0
    replace_contended: int = 3
    quiet_wait: float = 0.0
    data: Path | None = None
    link: str | None = None
    compression: list[str] | None = None
    oversubscribe: bool = False

    def given(self) -> dict[str, object]:
        """The fields set away from their defaults: what this request asks for beyond the defaults."""
        out = {}
        for f in dataclasses.fields(self):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING or value != default:
                out[f.name] = value
        return out
