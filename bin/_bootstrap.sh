# Sourced by bin/dlbench and bin/test: make sure the controller's own venv (.venv) exists and has
# dlbench (editable) and its test tools installed. Framework environments are separate and are
# built by dlbench itself (`dlbench env create`, or on first use by `dlbench run`).
set -euo pipefail
DLBENCH_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DLBENCH_VENV="${DLBENCH_VENV:-$DLBENCH_REPO/.venv}"
_stamp="$DLBENCH_VENV/.dlbench-installed"
if [ ! -x "$DLBENCH_VENV/bin/dlbench" ] || [ ! -f "$_stamp" ] || [ "$DLBENCH_REPO/pyproject.toml" -nt "$_stamp" ]; then
  PYTHON="${PYTHON:-python3}"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "dlbench needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
  echo "dlbench: setting up $DLBENCH_VENV (first run only)" >&2
  "$PYTHON" -m venv "$DLBENCH_VENV"
  "$DLBENCH_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$DLBENCH_REPO[test]" 2>&1 \
    | grep -v '^WARNING: Location' >&2 || true
  "$DLBENCH_VENV/bin/python" -c 'import dlbench' || { echo "dlbench: installing the controller failed" >&2; exit 1; }
  touch "$_stamp"
fi
