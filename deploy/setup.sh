#!/usr/bin/env bash
# Installs every Debian package pipetrain needs to build, test and run its
# examples. Idempotent: packages already installed are skipped, and nothing
# is downloaded when everything is present. Runs as root (or through sudo).
#
# CUDA is optional and not installed here: when nvcc is found (PATH or
# /usr/local/cuda/bin), the CUDA backend is built as well.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libabsl-dev
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc
  libopenblas-dev
  libgtest-dev libgmock-dev
  zlib1g-dev
  libcivetweb-dev prometheus libsqlite3-dev
  dataset-fashion-mnist
  fortunes-min
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "setup: missing packages: ${missing[*]}" >&2
    echo "setup: run this script as root to install them" >&2
    exit 1
  fi
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
