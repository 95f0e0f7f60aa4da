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
run "docker-compose config -q" docker-compose -f "$F" config -q
run "docker-compose --profile gpu config -q" docker-compose -f "$F" --profile gpu config -q
run "docker-compose --profile tools config -q" docker-compose -f "$F" --profile tools config -q
run "compose services, health checks, GPU reservations, scrape config" \
  "$PYTHON" "$ROOT/deploy/tests/check_compose.py" "$F" "$BIN_DIR"
finish
