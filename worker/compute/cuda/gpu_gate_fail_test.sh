#!/usr/bin/env bash
# A GPU that is visible but that CUDA cannot start on must FAIL the `gpu`
# tests, not skip them (gpu_test_gate.h). Runs on any machine with a CUDA
# build: a fake nvidia-smi lists one GPU, and the toolkit's stub driver
# library stands in for libcuda.so.1, so cuInit answers
# CUDA_ERROR_STUB_LIBRARY as a broken or mismatched driver would.
#
#   gpu_gate_fail_test.sh STUB_LIBCUDA GPU_TEST_BINARY...
set -uo pipefail
stub_driver="$1"
shift
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
printf '#!/bin/sh\necho "GPU 0: Stand-in GPU (UUID: GPU-00000000-0000)"\n' \
  >"$dir/nvidia-smi"
chmod +x "$dir/nvidia-smi"
ln -s "$stub_driver" "$dir/libcuda.so.1"

for test_binary in "$@"; do
  name="$(basename "$test_binary")"
  output="$(PATH="$dir:$PATH" \
    LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$test_binary" 2>&1)"
  status=$?
  if [ "$status" -eq 0 ]; then
    echo "FAIL: $name passed (or skipped) on a GPU that CUDA cannot use"
    echo "$output"
    exit 1
  fi
  if ! grep -q "CUDA cannot use them: .*cudaErrorStubLibrary" <<<"$output"; then
    echo "FAIL: $name failed without naming the CUDA error"
    echo "$output"
    exit 1
  fi
  if grep -q "SKIPPED" <<<"$output"; then
    echo "FAIL: $name skipped tests on a visible GPU"
    echo "$output"
    exit 1
  fi
  echo "$name: $(grep -c '^\[  FAILED  \].*ms)$' <<<"$output") tests failed with:"
  grep -m1 "CUDA cannot use them" <<<"$output"
done
echo "OK: the gpu tests fail with the CUDA error"
