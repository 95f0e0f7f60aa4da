#!/usr/bin/env bash
# helm lint --strict and helm template of helm/pipetrain with its default
# values, the GPU values, the mixed cloud/edge values and persistence off;
# check_helm.py then checks the rendered manifests (GPU limits, gRPC probes,
# headless Service, PVC, flags the binaries really have, monitoring).
#   helm_test.sh BIN_DIR
# shellcheck source=deploy/tests/lib.sh
source "$(dirname "$0")/lib.sh" || exit 1
BIN_DIR="${1:?usage: helm_test.sh BIN_DIR}"
need "$HELM"
need_python_yaml
CHART="$ROOT/helm/pipetrain"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

run "chart copy of the alert rules is deploy/prometheus/alerts.yml" \
  cmp "$ROOT/deploy/prometheus/alerts.yml" "$CHART/files/alerts.yml"
run "chart copy of the dashboard is deploy/grafana/dashboards/pipetrain.json" \
  cmp "$ROOT/deploy/grafana/dashboards/pipetrain.json" "$CHART/files/pipetrain.json"

declare -A VALUES=(
  [default]=""
  [gpu]="-f $CHART/examples/values-gpu.yaml"
  [cloud-edge]="-f $CHART/examples/values-cloud-edge.yaml"
  [ephemeral]="--set scheduler.persistence.enabled=false"
)
for scenario in default gpu cloud-edge ephemeral; do
  # shellcheck disable=SC2086
  run "helm lint --strict ($scenario)" "$HELM" lint --strict "$CHART" ${VALUES[$scenario]}
  # shellcheck disable=SC2086
  if "$HELM" template pipetrain "$CHART" --namespace ml ${VALUES[$scenario]} \
       > "$OUT/$scenario.yaml" 2> "$OUT/$scenario.err"; then
    echo "ok    helm template ($scenario)"
    run "rendered manifests ($scenario)" \
      "$PYTHON" "$ROOT/deploy/tests/check_helm.py" "$scenario" "$OUT/$scenario.yaml" "$ROOT" "$BIN_DIR"
  else
    echo "FAIL  helm template ($scenario)"
    sed 's/^/      /' "$OUT/$scenario.err"
    FAILED=$((FAILED + 1))
  fi
done
finish
