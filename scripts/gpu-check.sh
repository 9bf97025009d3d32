#!/usr/bin/env bash
# CUDA checks for a GPU host: the torch runner on the GPU through the whole spine (smoke profile),
# NVML's view of the machine in the record, then results and the report.
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
      --platform any -d .whl pydantic pydantic-core annotated-types typing-inspection
    exit 0 ;;
  --offline)
    # The image's python3 holds torch (CUDA), typer, rich, jinja2, pyyaml, psutil, nvidia-ml-py.
    python3 -m pip install --no-index --no-deps --quiet .whl/*.whl
    export PYTHONPATH="$PWD/src"
    DLBENCH=(python3 -m dlbench.cli)
    ENV=(--env current) ;;
  *)
    source bin/_bootstrap.sh
    DLBENCH=("$DLBENCH_VENV/bin/dlbench")
    ENV=(--env venv)
    "${DLBENCH[@]}" env create torch --device cuda ;;
esac

nvidia-smi | tee "$OUT/nvidia-smi.txt" || true
status=0
for suite in cnn fcn rnn; do
  "${DLBENCH[@]}" run --suite "$suite" --framework torch --profile smoke --device cuda "${ENV[@]}" \
     --store "$OUT/store" --timeout 600 2>&1 | tee -a "$OUT/run.log" || status=1
done
# The default profile's GPU batch sizes on two networks, for real numbers.
"${DLBENCH[@]}" run --suite cnn --framework torch --benchmark resnet50-train --benchmark alexnet_r-train \
   --device cuda "${ENV[@]}" --store "$OUT/store" --timeout 600 2>&1 | tee -a "$OUT/run.log" || status=1
"${DLBENCH[@]}" results --store "$OUT/store" --format csv > "$OUT/results.csv"
"${DLBENCH[@]}" report --store "$OUT/store" --out "$OUT/site"
python3 - "$OUT/store" <<'PY'
import json, pathlib, sys
recs = [json.loads(p.read_text()) for p in pathlib.Path(sys.argv[1], "runs").glob("*.json")]
bad = [r for r in recs if r["status"] != "ok" or r["workload"]["device"] != "cuda"]
gpus = {g["name"] for r in recs for g in r["machine"].get("gpus", [])}
print(f"{len(recs)} records, {len(bad)} not ok on cuda; GPUs in fingerprints: {sorted(gpus)}")
for r in bad:
    print(" ", r["benchmark"], r["status"], r["reason"])
sys.exit(1 if bad or not gpus else 0)
PY
exit $status
