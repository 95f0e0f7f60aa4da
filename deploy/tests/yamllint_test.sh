#!/usr/bin/env bash
# yamllint --strict on every YAML file of the repository (.yamllint leaves
# out build folders and the Helm templates, which are not plain YAML).
# shellcheck source=deploy/tests/lib.sh
source "$(dirname "$0")/lib.sh" || exit 1
need yamllint
cd "$ROOT" || exit 1
files="$(yamllint --list-files .)"
for want in deploy/docker-compose.yml deploy/prometheus/alerts.yml \
            helm/pipetrain/values.yaml helm/pipetrain/Chart.yaml; do
  run "yamllint covers $want" grep -qx "./$want" <<< "$files"
done
if grep -q "helm/pipetrain/templates/" <<< "$files"; then
  echo "FAIL  yamllint leaves out the Helm templates"
  FAILED=$((FAILED + 1))
else
  echo "ok    yamllint leaves out the Helm templates"
fi
run "yamllint --strict ." yamllint --strict --format parsable .
finish
