#!/usr/bin/env bash
# promtool check config / check rules / test rules on the Prometheus files
# of the compose deployment, and every alert has a unit test, a severity and
# a summary.
# shellcheck source=deploy/tests/lib.sh
source "$(dirname "$0")/lib.sh" || exit 1
need promtool
need_python_yaml
P="$ROOT/deploy/prometheus"
# The config reads the scheduler's viewer token from /pki (the compose
# volume); check it with that path pointing at a stand-in file.
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo stand-in > "$TMP/prometheus.token"
sed "s#/pki/prometheus.token#$TMP/prometheus.token#" "$P/prometheus.yml" > "$TMP/prometheus.yml"
cp "$P/alerts.yml" "$TMP/"
run "promtool check config prometheus.yml" promtool check config "$TMP/prometheus.yml"
run "promtool check rules alerts.yml" promtool check rules "$P/alerts.yml"
run "promtool test rules (one test per alert)" \
  promtool test rules "$ROOT/deploy/tests/prometheus/alerts_test.yml"
run "every alert is tested and has severity, summary and description" "$PYTHON" - \
  "$P/alerts.yml" "$ROOT/deploy/tests/prometheus/alerts_test.yml" <<'PY'
import sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
tests = yaml.safe_load(open(sys.argv[2]))
tested = {}
for t in tests["tests"]:
    for a in t.get("alert_rule_test", []):
        tested.setdefault(a["alertname"], []).append(bool(a.get("exp_alerts")))
bad = []
alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
for r in alerts:
    name = r["alert"]
    if True not in tested.get(name, []):
        bad.append(f"{name}: no test in which it fires")
    if False not in tested.get(name, []):
        bad.append(f"{name}: no test in which it stays quiet")
    if r.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
        bad.append(f"{name}: no severity label")
    for a in ("summary", "description"):
        if not r.get("annotations", {}).get(a):
            bad.append(f"{name}: no {a} annotation")
want = {"PipetrainWorkerLost", "PipetrainJobStalled", "PipetrainBubbleAboveTheory",
        "PipetrainSchedulerDown"}
missing = want - {r["alert"] for r in alerts}
if missing:
    bad.append(f"missing alerts: {sorted(missing)}")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
finish
