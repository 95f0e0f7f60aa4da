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

# The libraries the binaries load, each once: "NAME PATH" (PATH "not" when
# the loader cannot find it).
libs="$(ldd "$@" | awk '$2 == "=>" {print $1, $3}' | sort -u)"

# dpkg records the path the package ships; with a merged /usr the loader
# may report /lib/... for /usr/lib/... (or the other way round). Every
# candidate path goes to one dpkg-query call (one call per library takes
# minutes on a loaded machine).
candidates() {  # path
  local real
  real="$(readlink -f "$1")"
  printf '%s\n' "$1" "$real" "/usr$1" "/usr$real" "${1#/usr}" "${real#/usr}"
}
declare -A owner_of=()
mapfile -t all_candidates < <(while read -r name path; do
  [ "$path" = "not" ] || candidates "$path"
done <<<"$libs" | sort -u)
# "libfoo1:amd64: /usr/lib/..." (or "pkg1, pkg2: path" for diversions).
while IFS= read -r line; do
  case "$line" in diversion*) continue ;; esac
  pkg="${line%%: /*}"
  pkg="${pkg%%,*}"
  pkg="${pkg%%:*}"
  owner_of["/${line#*: /}"]="$pkg"
done < <(dpkg-query -S "${all_candidates[@]}" 2>/dev/null || true)

status=0
declare -A packages=()
while read -r name path; do
  [ -n "$name" ] || continue
  case "$name" in
    libcuda.so* | libnvidia-*) continue ;;
  esac
  if [ "$path" = "not" ]; then
    echo "runtime-packages: $name not found" >&2
    status=1
    continue
  fi
  case "$(readlink -f "$path")" in
    /usr/local/cuda*) continue ;;
  esac
  pkg=""
  while read -r candidate; do
    pkg="${owner_of[$candidate]:-}"
    [ -z "$pkg" ] || break
  done < <(candidates "$path")
  if [ -z "$pkg" ]; then
    echo "runtime-packages: no package holds $path" >&2
    status=1
    continue
  fi
  packages["$pkg"]=1
done <<<"$libs"

if [ "$status" -ne 0 ]; then
  exit "$status"
fi
printf '%s\n' "${!packages[@]}" | sort
