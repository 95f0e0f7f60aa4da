#!/usr/bin/env bash
# The Grafana dashboard's structure (promql_check.py dashboard) and every
# PromQL expression in it parsed by promtool (as recording rules).
# shellcheck source=deploy/tests/lib.sh
source "$(dirname "$0")/lib.sh" || exit 1
need promtool
need_python_yaml
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
D="$ROOT/deploy/grafana/dashboards/pipetrain.json"
run "dashboard structure, datasource variable, required panels" \
  "$PYTHON" "$ROOT/deploy/tests/promql_check.py" dashboard "$D" "$OUT/dashboard_rules.yml"
run "promtool parses every dashboard query" promtool check rules "$OUT/dashboard_rules.yml"
run "Grafana provisioning points at the dashboard folder and Prometheus" "$PYTHON" - \
  "$ROOT/deploy/grafana/provisioning" "$ROOT/deploy/docker-compose.yml" <<'PY'
import sys, yaml
prov, compose = sys.argv[1], yaml.safe_load(open(sys.argv[2]))
ds = yaml.safe_load(open(f"{prov}/datasources/prometheus.yml"))["datasources"]
dash = yaml.safe_load(open(f"{prov}/dashboards/pipetrain.yml"))["providers"]
bad = []
if not any(d["type"] == "prometheus" and d["url"] == "http://prometheus:9090" and d.get("isDefault")
           for d in ds):
    bad.append("no default Prometheus data source at http://prometheus:9090")
volumes = compose["services"]["grafana"]["volumes"]
paths = {v.split(":")[1] for v in volumes}
for p in dash:
    if p["options"]["path"] not in paths:
        bad.append(f"provider path {p['options']['path']} is not mounted in grafana")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
finish
