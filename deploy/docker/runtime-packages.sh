#!/usr/bin/env bash
# Prints the Debian/Ubuntu packages (one a line) that hold the shared
# libraries the given binaries load, so the runtime image installs exactly
# those (dpkg names differ between distributions and releases, e.g. Ubuntu
# 24.04's "t64" libraries, so they are looked up, not hard-coded).
#
# Libraries the runtime base image brings itself are left out: the CUDA
# toolkit's (under /usr/local/cuda*, in nvidia/cuda runtime images) and the
# driver's (libcuda, libnvidia-*, mounted by the NVIDIA container runtime).
# Fails when a library cannot be found or belongs to no package.
#
#   deploy/docker/runtime-packages.sh build/services/pipetrain-worker ...
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: $0 BINARY..." >&2
  exit 2
fi

status=0
declare -A packages=()
while read -r name arrow path _; do
  [ "$arrow" = "=>" ] || continue
  case "$name" in
    libcuda.so* | libnvidia-*) continue ;;
  esac
  if [ "$path" = "not" ]; then
    echo "runtime-packages: $name not found" >&2
    status=1
    continue
  fi
  real="$(readlink -f "$path")"
  case "$real" in
    /usr/local/cuda*) continue ;;
  esac
  # dpkg records the path the package ships; with a merged /usr the loader
  # may report /lib/... for /usr/lib/... (or the other way round).
  owner=""
  for candidate in "$path" "$real" "/usr${path}" "/usr${real}" "${path#/usr}" "${real#/usr}"; do
    if owner="$(dpkg-query -S "$candidate" 2>/dev/null | head -n 1)" && [ -n "$owner" ]; then
      break
    fi
    owner=""
  done
  if [ -z "$owner" ]; then
    echo "runtime-packages: no package holds $path" >&2
    status=1
    continue
  fi
  # "libfoo1:amd64: /usr/lib/..." (or "pkg1, pkg2: path" for diversions).
  pkg="${owner%%: *}"
  pkg="${pkg%%,*}"
  pkg="${pkg%%:*}"
  packages["$pkg"]=1
done < <(ldd "$@" | grep '=>')

if [ "$status" -ne 0 ]; then
  exit "$status"
fi
printf '%s\n' "${!packages[@]}" | sort
