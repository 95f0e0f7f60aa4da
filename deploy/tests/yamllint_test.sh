#!/usr/bin/env bash
# yamllint --strict on every YAML file of the repository (.yamllint leaves
# out build folders and the Helm templates, which are not plain YAML).
source "$(dirname "$0")/lib.sh"
need yamllint
cd "$ROOT" || exit 1
files="$(yamllint --list-files .)"
for want in deploy/docker-compose.yml deploy/prometheus/alerts.yml \
            helm/pipetrain/values.yaml helm/pipetrain/Chart.yaml; do
  run "yamllint covers $want" grep -qx "./$want" <<< "$files"
done
run "yamllint leaves out the Helm templates" \
  bash -c '! grep -q "helm/pipetrain/templates/" <<< "$1"' _ "$files"
run "yamllint --strict ." yamllint --strict --format parsable .
finish
