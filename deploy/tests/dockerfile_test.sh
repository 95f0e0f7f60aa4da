#!/usr/bin/env bash
# Static checks of deploy/docker/Dockerfile and a CMake configure with the
# image's options (no Docker engine needed).
#   dockerfile_test.sh BUILD_DIR
# shellcheck source=deploy/tests/lib.sh
source "$(dirname "$0")/lib.sh" || exit 1
BUILD_DIR="${1:?usage: dockerfile_test.sh BUILD_DIR}"
need cmake ninja ldd dpkg-query
need_python_yaml
run "Dockerfile stages, user, copies, packages, CMake options" \
  "$PYTHON" "$ROOT/deploy/tests/check_dockerfile.py" "$ROOT" "$BUILD_DIR"
finish
