#!/usr/bin/env bash
# CUDA checks for a GPU host: the torch and jax runners on the GPU through the whole spine (smoke
# profile, then two default-profile runs), telemetry checked (power > 0, SM clock > 0, the energy
# counter and integrated power within 5%), every precision x compile mode and the fp32 pinning
# (scripts/gpu_pinning.py), the transformer suite in amp_bf16 compiled, generation (mode generate, GPT-2 small
# and transformer_tiny, torch eager and with its compiled decode step, jax), `dlbench check` on CUDA
# (float64 and amp_bf16, and --mode generate), MLPerf LoadGen's single_stream (and server, and the server
# on generation with TTFT/TPOT bounds) on CUDA, the convergence suite's digits tasks (digits_cnn,
# digits_fcn5) to 97% in amp_bf16, then results and the report.
#
# On a host with network access:   scripts/gpu-check.sh            (builds the cuda venv itself)
# On an offline host whose python3 already has a CUDA torch (our lent H200s):
#   here:   scripts/gpu-check.sh --fetch-wheels   (downloads the controller's missing wheels to .whl/)
#   there:  OUT=/some/dir scripts/gpu-check.sh --offline
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"

case "${1:-}" in
  --fetch-wheels)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d .whl pydantic pydantic-core annotated-types typing-inspection mlcommons-loadgen==6.0.17 \
      scikit-learn joblib threadpoolctl narwhals
    exit 0 ;;
  --offline)
    # The image's python3 holds torch (CUDA), typer, rich, jinja2, pyyaml, psutil, nvidia-ml-py.
    python3 -m pip install --no-index --no-deps --quiet .whl/*.whl
    export PYTHONPATH="$PWD/src"
    PY=python3
    DLBENCH=(python3 -m dlbench.cli)
    ENV=(--env current) ;;
  *)
    source bin/_bootstrap.sh
    PY="$DLBENCH_VENV/bin/python"
    DLBENCH=("$DLBENCH_VENV/bin/dlbench")
    ENV=(--env venv)
    "${DLBENCH[@]}" env create torch --device cuda
    "${DLBENCH[@]}" env create jax --device cuda ;;
esac

nvidia-smi | tee "$OUT/nvidia-smi.txt" || true
"${DLBENCH[@]}" info | tee "$OUT/info.txt" || true
status=0
# The smoke profile on CUDA with telemetry: torch and jax (the frameworks our GPU image carries).
for fw in torch jax; do
  for suite in cnn fcn rnn; do
    "${DLBENCH[@]}" run --suite "$suite" --framework "$fw" --profile smoke --device cuda "${ENV[@]}" \
       --store "$OUT/store" --timeout 600 2>&1 | tee -a "$OUT/run.log" || status=1
  done
done
# The default profile's GPU batch sizes on two networks, for real numbers (and telemetry long enough
# for NVML's power readings to mean something).
"${DLBENCH[@]}" run --suite cnn --framework torch,jax --benchmark resnet50-train --benchmark alexnet_r-train \
   --device cuda "${ENV[@]}" --store "$OUT/store" --timeout 600 2>&1 | tee -a "$OUT/run.log" || status=1
# Every precision x compile mode on the smallest CNN (issue 16): ok, or skipped with a reason.
"${DLBENCH[@]}" run --suite cnn --framework torch,jax --benchmark alexnet_r-train --profile smoke --device cuda \
   --precision all --compile all "${ENV[@]}" --store "$OUT/store" --timeout 600 2>&1 | tee "$OUT/axes.log" || status=1
# The transformer suite on CUDA in amp_bf16, compiled (issue 17): the GPU lengths and batches
# (GPT-2 small at 1,024 tokens, BERT-base at 512, ViT-B/16), each run's attention kernel recorded
# (flash / memory-efficient / cuDNN), its MFU against the profile; one repeat each to fit the lease.
"${DLBENCH[@]}" run --suite transformer --framework torch,jax --benchmark gpt2_small-train \
   --benchmark bert_base-train --benchmark vit_b16-train --precision amp_bf16 --compile compiled --repeats 1 \
   --device cuda "${ENV[@]}" --store "$OUT/store" --timeout 900 2>&1 | tee "$OUT/transformer.log" || status=1
# Generation (issue 20): the default profile's GPU sizes (GPT-2 small: a 512-token prompt, 128 new tokens,
# batch 1 and 16), time to first token and per output token per request; torch eager and with its
# torch.compile'd decode step, jax's jitted steps with flax cache variables; one repeat each.
for fw_compile in "torch all" "jax default"; do  # jax's only mode is jit (its eager is skipped)
  read -r fw compile <<< "$fw_compile"
  "${DLBENCH[@]}" run --suite transformer --framework "$fw" --benchmark gpt2_small-generate \
     --benchmark transformer_tiny-generate --mode generate --compile "$compile" --repeats 1 --device cuda \
     "${ENV[@]}" --store "$OUT/store" --timeout 900 2>&1 | tee -a "$OUT/generate.log" || status=1
done
"${DLBENCH[@]}" check --mode generate --framework torch,jax --device cuda --network transformer_tiny \
   --network gpt2_small "${ENV[@]}" --store "$OUT/store" 2>&1 | tee "$OUT/check-generate.log" || status=1
# Time to accuracy (issue 21): the digits task (digits_cnn) trained to 97% top-1 on CUDA in
# amp_bf16 through each framework's own input pipeline, one seed each (smoke); MLLOG files in $OUT/store/mllog.
"${DLBENCH[@]}" run --suite convergence --framework torch,jax --profile smoke --precision amp_bf16 --device cuda \
   "${ENV[@]}" --store "$OUT/store" --timeout 600 2>&1 | tee "$OUT/convergence.log" || status=1
# fp32 pinned: an 8192^2 float32 matmul well below the TF32 rate in every framework, flags read back.
"$PY" scripts/gpu_pinning.py 2>&1 | tee "$OUT/pinning.txt" || status=1
"${DLBENCH[@]}" check --framework torch,jax --device cuda --precision amp_bf16 "${ENV[@]}" --store "$OUT/store" \
   2>&1 | tee "$OUT/check-amp_bf16.log" || status=1
"${DLBENCH[@]}" check --framework torch,jax --device cuda "${ENV[@]}" --store "$OUT/store" 2>&1 | tee "$OUT/check.log" || status=1
# MLPerf LoadGen on CUDA: single_stream (90th-percentile latency of one sample) and the server's
# rate search, smoke profile, on two CNNs; each record LoadGen's VALID/INVALID with its reason.
"${DLBENCH[@]}" run --suite cnn --framework torch,jax --benchmark alexnet_r-infer --benchmark resnet50-infer \
   --mode infer --scenario single_stream,server --profile smoke --device cuda --no-check "${ENV[@]}" \
   --store "$OUT/store" --timeout 600 2>&1 | tee "$OUT/loadgen.log" || status=1
# LoadGen's server on generation (token latencies): each query one request served alone, the highest
# Poisson rate whose 99th-percentile time to first token and per output token meet the smoke bounds.
"${DLBENCH[@]}" run --suite transformer --framework torch,jax --benchmark transformer_tiny --benchmark gpt2_small \
   --mode generate --scenario server --profile smoke --device cuda --no-check "${ENV[@]}" \
   --store "$OUT/store" --timeout 600 2>&1 | tee "$OUT/loadgen-generate.log" || status=1
"${DLBENCH[@]}" results --store "$OUT/store" --format csv > "$OUT/results.csv"
"${DLBENCH[@]}" report --store "$OUT/store" --out "$OUT/site"
"$PY" scripts/gpu_check_records.py "$OUT/store" | tee "$OUT/telemetry-check.txt" || status=1
exit $status
