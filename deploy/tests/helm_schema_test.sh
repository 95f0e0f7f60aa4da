#!/usr/bin/env bash
# The Helm chart against the Kubernetes API's schemas, offline:
#  - every render (default values, each examples/*.yaml, persistence off,
#    all monitoring on) validated strictly by kube/validate.mjs (schemas of
#    kubernetes-models and @kubernetes-models/prometheus-operator, unknown
#    fields, nulls and duplicate keys rejected, the API server's own rules);
#  - kube/selftest.mjs plants mistakes in a copy of the GPU render and
#    requires each to be caught;
#  - values.schema.json makes helm lint/template reject bad values.
# helm and node come from deploy/setup.sh; where either is truly absent the
# test is skipped (exit 77) and says so. The schema packages missing, with
# node present, is a failure.
# shellcheck source=deploy/tests/lib.sh
source "$(dirname "$0")/lib.sh" || exit 1
NODE="${PIPETRAIN_NODE:-node}"
KUBE="$ROOT/deploy/tests/kube"
CHART="$ROOT/helm/pipetrain"
for tool in "$HELM" "$NODE"; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool not found; deploy/setup.sh installs helm and nodejs"
    exit 77
  fi
done
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

# render NAME HELM_ARGS...: helm template into $OUT/NAME.yaml.
render() {
  local name="$1"
  shift
  if "$HELM" template pipetrain "$CHART" --namespace ml "$@" \
       > "$OUT/$name.yaml" 2> "$OUT/$name.err"; then
    RENDERS+=("$OUT/$name.yaml")
  else
    echo "FAIL  helm template ($name)"
    sed 's/^/      /' "$OUT/$name.err"
    FAILED=$((FAILED + 1))
  fi
}

RENDERS=()
render default
for example in "$CHART"/examples/*.yaml; do
  render "$(basename "$example" .yaml)" -f "$example"
done
render ephemeral --set scheduler.persistence.enabled=false
render monitoring --set serviceMonitor.enabled=true,prometheusRule.enabled=true \
  --set grafanaDashboard.enabled=true,podDisruptionBudget.enabled=true

# One node process for every render: each file is reported on its own line.
if "$NODE" "$KUBE/validate.mjs" "${RENDERS[@]}" > "$OUT/validate.log" 2>&1; then
  echo "ok    ${#RENDERS[@]} renders valid against the Kubernetes schemas"
else
  echo "FAIL  renders against the Kubernetes schemas"
  FAILED=$((FAILED + 1))
fi
sed 's/^/      /' "$OUT/validate.log"

if [ -f "$OUT/values-gpu.yaml" ]; then
  if "$NODE" "$KUBE/selftest.mjs" "$OUT/values-gpu.yaml" > "$OUT/selftest.log" 2>&1; then
    echo "ok    planted mistakes in the GPU render are caught"
  else
    echo "FAIL  planted mistakes in the GPU render"
    FAILED=$((FAILED + 1))
  fi
  sed 's/^/      /' "$OUT/selftest.log"
else
  echo "FAIL  no GPU render for the planted mistakes"
  FAILED=$((FAILED + 1))
fi

# rejected DESCRIPTION PATTERN HELM_ARGS...: helm must fail, naming PATTERN.
rejected() {
  local what="$1" pattern="$2"
  shift 2
  local out
  if out="$("$HELM" "$@" 2>&1)"; then
    echo "FAIL  values.schema.json accepts $what"
    echo "      \$ helm $*"
    FAILED=$((FAILED + 1))
  elif grep -qF -- "$pattern" <<< "$out"; then
    echo "ok    values.schema.json rejects $what"
  else
    echo "FAIL  $what: helm failed without naming $pattern"
    printf '%s\n' "$out" | sed 's/^/      /'
    FAILED=$((FAILED + 1))
  fi
}

GPU_VALUES="$CHART/examples/values-gpu.yaml"
rejected "worker.grpcPort=70000 (helm lint)" "at '/worker/grpcPort': maximum" \
  lint --strict "$CHART" --set worker.grpcPort=70000
rejected "worker.grpcPort=70000 (helm template)" "at '/worker/grpcPort': maximum" \
  template pipetrain "$CHART" --set worker.grpcPort=70000
rejected "a GPU request different from its limit" "'nvidia.com/gpu' does not match" \
  template pipetrain "$CHART" -f "$GPU_VALUES" --set 'worker.resources.requests.nvidia\.com/gpu=2'
rejected "a GPU limit beside gpu.count" "'nvidia.com/gpu' does not match" \
  template pipetrain "$CHART" -f "$GPU_VALUES" --set 'worker.resources.limits.nvidia\.com/gpu=2'
rejected "a fractional GPU count" "at '/worker/gpu/count': got number, want integer" \
  template pipetrain "$CHART" -f "$GPU_VALUES" --set-json worker.gpu.count=0.5
rejected "a negative replica count" "at '/worker/replicas': minimum" \
  template pipetrain "$CHART" --set worker.replicas=-1
rejected "a probe typo" "periodSecond" \
  template pipetrain "$CHART" --set worker.startupProbe.periodSecond=2
rejected "an unknown device" "/worker/device" \
  template pipetrain "$CHART" --set worker.device=gpu
rejected "a quantity that is not one" "/scheduler/resources/limits/memory" \
  template pipetrain "$CHART" --set scheduler.resources.limits.memory=1GB
finish
