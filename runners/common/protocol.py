"""The worker protocol, once for both harnesses (harness.py, distributed_harness.py). Standard library only.

A worker reads a request (JSON) whose `protocol` must be PROTOCOL_VERSION, and answers with JSON
files that the controller reads while the worker may still be running: each is written to a
temporary file and renamed into place, so a reader sees the whole file or none. A failure becomes a
result with status "failed" and a reason that `classify` makes from the exception.
"""

from __future__ import annotations

import json
import os

PROTOCOL_VERSION = 1  # of the request/result files: src/dlbench/execution/launcher.py and jobs.py say the same


class Skip(Exception):
    """Raised by a runner when the benchmark or job cannot run here (not an error): status "skipped"."""


def write_atomically(path: str, payload: dict) -> None:
    """`payload` as JSON at `path`: written beside it, flushed to disk, then renamed into place."""
    tmp = f"{path}.partial"
    with open(tmp, "w") as f:
        json.dump(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def classify(exc: BaseException) -> str:
    """The reason a result gives for an exception: "Type: message", prefixed "out of memory: " when
    it is one (the controller and the report tell those apart)."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or "out of memory" in text.lower() or "OutOfMemory" in text:
        return f"out of memory: {text}"
    return text


def read_request(path: str) -> tuple[dict | None, str | None]:
    """(request, None), or (None, why) when the request speaks another protocol version."""
    with open(path) as f:
        request = json.load(f)
    if request.get("protocol") != PROTOCOL_VERSION:
        return None, f"protocol {request.get('protocol')} not understood (worker speaks {PROTOCOL_VERSION})"
    return request, None
