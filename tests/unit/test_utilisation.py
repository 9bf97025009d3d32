"""Model FLOPs, model TFLOP/s, MFU and tokens/s in the results rows, `dlbench.load` and the report
(store/utilisation.py): exact figures from records whose every iteration took 10 ms, MFU from a
fake machine profile with known float32 and bfloat16 ceilings, and the reasons where there is none.
No framework."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from store_records import T0, record_from_times
from test_site_compile import Tables
from typer.testing import CliRunner

import dlbench
from dlbench.cli import app
from dlbench.reporting import site
from dlbench.store.index import read_rows
from dlbench.store.profiles import MachineProfile, MatmulCeiling, ProfileStore
from dlbench.store.record import Record
from dlbench.store.store import Store

MACHINE = "m" * 16
FLOPS_PER_SAMPLE = 1_000_000
BATCH = 16
TOKENS = {"name": "lstm_toy", "input": {"kind": "tokens", "sequence_length": 32, "vocabulary": 100}}
IMAGES = {"name": "cnn_toy", "input": {"kind": "image", "shape": [3, 8, 8]}}


def run(mode: str = "train", precision: str = "fp32", definition: dict | None = None, framework: str = "torch",
        hours: int = 0) -> Record:
    """Every iteration 10 ms: the median is 0.01 s, samples/s = 16 / 0.01 = 1600."""
    r = record_from_times([[0.01] * 5, [0.01] * 5], started=T0 + timedelta(hours=hours), framework=framework,
                          benchmark=f"toy-{mode}", machine="hostA", machine_id=MACHINE, batch_size=BATCH)
    network = r.network.model_copy(update={"name": "toy", "flops_per_sample": FLOPS_PER_SAMPLE,
                                           "definition": definition or IMAGES})
    workload = r.workload.model_copy(update={"mode": mode, "precision": precision})
    return r.model_copy(update={"network": network, "workload": workload})


def profile(threads: int = 2) -> MachineProfile:
    """float32 peak 0.1 TFLOP/s, bfloat16 0.2 TFLOP/s, no float16 ceiling."""
    return MachineProfile(machine_id=MACHINE, created_at=datetime(2026, 12, 1, tzinfo=timezone.utc), dlbench={},
                          machine={"hostname": "hostA"}, device="cpu", threads=threads,
                          matmul_peak={"float32": MatmulCeiling(flops_per_s=1e11, framework="torch", kernel="k32"),
                                       "bfloat16": MatmulCeiling(flops_per_s=2e11, framework="jax", kernel="k16")})


def store_of(tmp_path, records: list[Record], with_profile: bool) -> Store:
    st = Store(tmp_path / "store")
    for r in records:
        st.write(r)
    if with_profile:
        ProfileStore(st).write(profile())
    return st


def rows_by(st: Store) -> dict[tuple, dict]:
    return {(r["mode"], r["precision"], r["network"], r["framework"]): r for r in read_rows(st).rows}


def test_training_and_inference_rows_have_exact_model_flops_and_mfu(tmp_path):
    st = store_of(tmp_path, [run("train"), run("infer"), run("train", "amp_bf16")], with_profile=True)
    rows = rows_by(st)
    train, infer, bf16 = rows[("train", "fp32", "toy", "torch")], rows[("infer", "fp32", "toy", "torch")], \
        rows[("train", "amp_bf16", "toy", "torch")]
    # training: forward + backward = 3 x the forward FLOPs
    assert train["model_flops_per_iter"] == FLOPS_PER_SAMPLE * BATCH * 3 == 48_000_000
    assert infer["model_flops_per_iter"] == FLOPS_PER_SAMPLE * BATCH == 16_000_000
    assert train["model_tflops"] == pytest.approx(48e6 / 0.01 / 1e12)  # 0.0048 TFLOP/s
    assert infer["model_tflops"] == pytest.approx(16e6 / 0.01 / 1e12)
    # over the float32 ceiling (0.1 TFLOP/s) for fp32, the bfloat16 one (0.2) for amp_bf16
    assert train["mfu"] == pytest.approx(0.048) and train["mfu_reason"] is None
    assert infer["mfu"] == pytest.approx(0.016)
    assert bf16["mfu"] == pytest.approx(0.024) and bf16["mfu_reason"] is None
    assert train["tokens_per_s"] is None  # an image network


def test_no_mfu_without_a_profile_for_tf32_and_without_a_ceiling_in_the_dtype(tmp_path):
    st = store_of(tmp_path, [run("train"), run("train", "tf32"), run("train", "amp_fp16")], with_profile=False)
    rows = rows_by(st)
    plain = rows[("train", "fp32", "toy", "torch")]
    assert plain["mfu"] is None and "no profile" in plain["mfu_reason"]
    assert plain["model_tflops"] == pytest.approx(0.0048)  # the model FLOP/s need no profile

    ProfileStore(st).write(profile())  # calibrated after the runs were indexed: applies to them now
    rows = rows_by(st)
    assert rows[("train", "fp32", "toy", "torch")]["mfu"] == pytest.approx(0.048)
    tf32 = rows[("train", "tf32", "toy", "torch")]
    assert tf32["mfu"] is None and tf32["mfu_reason"].startswith("tf32: no TF32 ceiling is measured")
    fp16 = rows[("train", "amp_fp16", "toy", "torch")]
    assert fp16["mfu"] is None and "has no float16 matmul ceiling" in fp16["mfu_reason"]


def test_tokens_per_s_for_a_token_network_only(tmp_path):
    st = store_of(tmp_path, [run(definition=TOKENS, framework="torch"), run(definition=IMAGES, framework="jax")],
                  with_profile=True)
    rows = rows_by(st)
    assert rows[("train", "fp32", "toy", "torch")]["tokens_per_s"] == pytest.approx(1600 * 32)
    assert rows[("train", "fp32", "toy", "jax")]["tokens_per_s"] is None


def test_load_and_results_carry_the_columns(tmp_path):
    st = store_of(tmp_path, [run(definition=TOKENS), run("train", "tf32", hours=1)], with_profile=True)
    frame = dlbench.load(st.root).sort_values("started_at")
    assert str(frame["model_flops_per_iter"].dtype) == "Int64" and str(frame["mfu"].dtype) == "float64"
    assert str(frame["mfu_reason"].dtype) == "string"
    assert list(frame["model_flops_per_iter"]) == [48_000_000, 48_000_000]
    assert frame["mfu"].iloc[0] == pytest.approx(0.048) and frame["mfu"].isna().iloc[1]
    assert frame["tokens_per_s"].iloc[0] == pytest.approx(51_200) and frame["tokens_per_s"].isna().iloc[1]
    out = CliRunner().invoke(app, ["results", "--store", str(st.root), "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = sorted(json.loads(out.stdout), key=lambda r: r["started_at"])
    assert rows[0]["mfu"] == pytest.approx(0.048) and rows[0]["model_tflops"] == pytest.approx(0.0048)
    assert rows[1]["mfu"] is None and rows[1]["mfu_reason"].startswith("tf32:")


def test_the_report_shows_mfu_and_tokens_per_s(tmp_path):
    records = [run(definition=TOKENS, framework="torch"), run("train", "tf32", framework="jax", hours=1)]
    st = store_of(tmp_path, records, with_profile=True)
    site.build_site(st.root, tmp_path / "out", workers=1, now=datetime(2026, 11, 20, 12, tzinfo=timezone.utc))
    out = tmp_path / "out"
    torch_page = (out / f"runs/{records[0].run_id}.html").read_text()
    assert "4.80%" in torch_page and "51,200" in torch_page and "tokens/s" in torch_page
    assert "0.004800 TFLOP/s" in torch_page and "float32 matmul peak 0.1 TFLOP/s (torch)" in torch_page
    jax_page = (out / f"runs/{records[1].run_id}.html").read_text()
    assert "tf32: no TF32 ceiling is measured" in jax_page

    (bench,) = [p for p in (out / "benchmarks").glob("*.html")]
    rows = Tables(bench.read_text()).table("latest")
    header = [c["text"] for c in rows[0]["cells"]]
    tokens_at, mfu_at = header.index("tokens/s"), header.index("MFU")
    cells = {r["cells"][0]["text"]: r["cells"] for r in rows[1:]}
    assert cells["torch"][tokens_at]["text"] == "51,200" and cells["torch"][mfu_at]["text"] == "4.80%"
    assert cells["jax"][tokens_at]["text"] == "–" and cells["jax"][mfu_at]["text"] == "–"
    assert any(t.startswith("tf32: no TF32 ceiling") for t in cells["jax"][mfu_at]["titles"])


def test_a_new_profile_re_renders_the_run_pages(tmp_path):
    st = store_of(tmp_path, [run()], with_profile=False)
    site.build_site(st.root, tmp_path / "out", workers=1)
    (page,) = (tmp_path / "out" / "runs").glob("*.html")
    assert "no profile" in page.read_text()
    ProfileStore(st).write(profile())
    site.build_site(st.root, tmp_path / "out", workers=1)
    assert "4.80%" in page.read_text()
