#!/usr/bin/env bash
# Runs every libFuzzer target of a `make fuzz` build for a while, from its
# seed corpus, and fails on the first crash, leak, timeout, out-of-memory or
# sanitizer report (libFuzzer exits non-zero; the reproducer is written to
# BUILD/fuzz-artifacts/).
#
#   fuzz/run.sh BUILD [SECONDS]        each target for SECONDS (default 60)
#   FUZZ_RUNS=N fuzz/run.sh BUILD      each target for N executions instead
#   FUZZ_TARGETS="a b" fuzz/run.sh ... only these targets
#
# New inputs go to BUILD/fuzz-corpus/<target>, never into the committed
# seeds (fuzz/corpus/<name>: the target's name without _fuzzer). Per-target
# libFuzzer flags are in fuzz/<target>.options, one -flag=value a line.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:?usage: fuzz/run.sh BUILD [SECONDS]}"
SECONDS_EACH="${2:-60}"
TARGETS="${FUZZ_TARGETS:-frame_decoder_fuzzer spec_json_fuzzer rest_router_fuzzer safetensors_fuzzer npy_fuzzer}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# The code under test logs every job and worker change; at INFO that is
# most of a run's time.
export PIPETRAIN_LOG_LEVEL="${PIPETRAIN_LOG_LEVEL:-ERROR}"

mkdir -p "$BUILD/fuzz-artifacts"
for target in $TARGETS; do
  work="$BUILD/fuzz-corpus/$target"
  mkdir -p "$work"
  limit=(-max_total_time="$SECONDS_EACH")
  if [ -n "${FUZZ_RUNS:-}" ]; then limit=(-runs="$FUZZ_RUNS"); fi
  options=()
  if [ -f "fuzz/$target.options" ]; then
    mapfile -t options < <(grep -v '^#' "fuzz/$target.options" | grep .)
  fi
  log="$BUILD/fuzz-artifacts/$target.log"
  echo "fuzz: $target (${FUZZ_RUNS:+$FUZZ_RUNS runs}${FUZZ_RUNS:-$SECONDS_EACH s})"
  status=0
  "$BUILD/fuzz/$target" "${limit[@]}" -error_exitcode=77 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$BUILD/fuzz-artifacts/$target-" "${options[@]}" \
    "$work" "fuzz/corpus/${target%_fuzzer}" >"$log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log"
    echo "fuzz: $target FAILED (exit $status); log: $log" >&2
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" |
    sed "s/^/fuzz: $target: /"
done
