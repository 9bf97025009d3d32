"""What the checksum costs: Store.write and Store.read of schema 4 (canonical JSON + SHA-256 on
every write and read) against the same store operations without it (pydantic dump / parse and
validate only), side by side in one run, on a typical record (the v4 fixture, a smoke run with
telemetry) and a large one (3 repeats x 40,000 iterations, about 2.5 MB).

    .venv/bin/python benchmarks/store_integrity.py

Prints the ratios (with / without); times on this shared VM drift by tens of percent, so compare
within one run only.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from dlbench.store.record import Record, Repeat
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[1]


def plain_write(store: Store, record: Record) -> Path:
    """What Store.write did before checksums: pydantic's dump, temp file, fsync, link."""
    final = store.runs / f"{record.run_id}.json"
    tmp = store.incoming / f"{record.run_id}.plain.tmp"
    with open(tmp, "w") as f:
        f.write(record.model_dump_json(indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.link(tmp, final)
    tmp.unlink()
    return final


def plain_read(path: Path) -> Record:
    data = json.loads(path.read_bytes())
    data.pop("checksum", None)
    return Record.model_validate(data)


def timed(fn, rounds: int) -> float:
    times = []
    for i in range(rounds):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare(label: str, record: Record, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp))
        store.runs.mkdir()
        store.incoming.mkdir()
        ids = iter(range(10**9))

        def copy() -> Record:
            return record.model_copy(update={"run_id": f"20260101T000000Z-{next(ids):012x}"})

        # interleaved rounds, so that drift hits both sides alike
        w_with, w_plain, r_with, r_plain = [], [], [], []
        for _ in range(rounds):
            a, b = copy(), copy()
            w_with.append(timed(lambda _: store.write(a), 1))
            w_plain.append(timed(lambda _: plain_write(store, b), 1))
            path = store.runs / f"{a.run_id}.json"
            r_with.append(timed(lambda _: store.read(path), 1))
            r_plain.append(timed(lambda _: plain_read(path), 1))
        size = path.stat().st_size
        med = statistics.median
        print(f"{label} ({size / 1e6:.2f} MB): write {med(w_with) * 1e3:.1f} ms with checksum, "
              f"{med(w_plain) * 1e3:.1f} ms without (x{med(w_with) / med(w_plain):.2f}); "
              f"read {med(r_with) * 1e3:.1f} ms vs {med(r_plain) * 1e3:.1f} ms (x{med(r_with) / med(r_plain):.2f})")


def main() -> None:
    typical = Store(ROOT).read(ROOT / "tests" / "fixtures" / "records" / "v4.json")
    compare("typical record (v4 fixture)", typical, rounds=60)
    big = typical.model_copy(update={"repeats": [
        Repeat(index=r, status="ok", first_iter_s=0.5,
               iter_s=[0.1 + 1e-9 * (k * 7919 % 100_003) for k in range(40_000)]) for r in range(3)]})
    compare("large record (120,000 iterations)", big, rounds=8)


if __name__ == "__main__":
    main()
