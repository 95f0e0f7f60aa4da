# shellcheck shell=bash
# Shared helpers of the deploy tests (sourced). Every tool a test needs must
# be there: deploy/setup.sh installs them, so a missing one is a failure,
# never a skip.
set -uo pipefail

FAILED=0
ROOT="${PIPETRAIN_SOURCE_DIR:?set PIPETRAIN_SOURCE_DIR to the repository root}"
PYTHON=/usr/bin/python3
export HELM="$ROOT/.tools/bin/helm"

need() {
  local tool
  for tool in "$@"; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "$tool" ]; then
      echo "FAIL: $tool is missing (run deploy/setup.sh as root)"
      exit 1
    fi
  done
}

need_python_yaml() {
  need "$PYTHON"
  if ! "$PYTHON" -c "import yaml" 2>/dev/null; then
    echo "FAIL: $PYTHON has no yaml module (python3-yaml; run deploy/setup.sh)"
    exit 1
  fi
}

# run DESCRIPTION COMMAND...: runs a check, prints its output when it fails.
run() {
  local what="$1"
  shift
  local out
  if out="$("$@" 2>&1)"; then
    echo "ok    $what"
  else
    echo "FAIL  $what"
    echo "      \$ $*"
    printf '%s\n' "$out" | sed 's/^/      /'
    FAILED=$((FAILED + 1))
  fi
}

finish() {
  if [ "$FAILED" -ne 0 ]; then
    echo "$FAILED check(s) failed"
    exit 1
  fi
  echo "all checks passed"
}
