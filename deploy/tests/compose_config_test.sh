#!/usr/bin/env bash
# docker-compose config -q on deploy/docker-compose.yml for each profile,
# then check_compose.py on the resolved file.
#   compose_config_test.sh BIN_DIR
# shellcheck source=deploy/tests/lib.sh
source "$(dirname "$0")/lib.sh" || exit 1
BIN_DIR="${1:?usage: compose_config_test.sh BIN_DIR}"
need docker-compose
need_python_yaml
F="$ROOT/deploy/docker-compose.yml"
# The file insists on a Grafana admin password from the environment.
export GRAFANA_ADMIN_PASSWORD=resolve-only
run "docker-compose config -q" docker-compose -f "$F" config -q
run "docker-compose --profile gpu config -q" docker-compose -f "$F" --profile gpu config -q
run "docker-compose --profile tools config -q" docker-compose -f "$F" --profile tools config -q
# The offline override (docker-compose.offline.yml): Prometheus built here
# from Debian's package, Grafana out of the default services.
O="$ROOT/deploy/docker-compose.offline.yml"
run "docker-compose -f docker-compose.offline.yml config -q" \
  docker-compose -f "$F" -f "$O" config -q
offline_check() {
  local services prom
  services="$(docker-compose -f "$F" -f "$O" config --services | sort | tr '\n' ' ')"
  [ "$services" = "ctl gpu-worker-1 gpu-worker-2 grafana pki prometheus scheduler worker-1 worker-2 " ] ||
    { echo "services: $services"; return 1; }
  docker-compose -f "$F" -f "$O" config | "$PYTHON" -c '
import os, sys, yaml
s = yaml.safe_load(sys.stdin)["services"]
prom, graf = s["prometheus"], s["grafana"]
assert "grafana" in graf.get("profiles", []), "grafana is not behind a profile"
assert not prom["image"].startswith("prom/"), prom["image"]
ctx = prom["build"]["context"]
assert os.path.isfile(os.path.join(ctx, "Dockerfile")), ctx
assert "prometheus" in open(os.path.join(ctx, "Dockerfile")).read()
'
}
run "offline override: Prometheus from Debian's package, Grafana behind a profile" \
  offline_check
run "compose services, health checks, GPU reservations, scrape config" \
  "$PYTHON" "$ROOT/deploy/tests/check_compose.py" "$F" "$BIN_DIR"
finish
