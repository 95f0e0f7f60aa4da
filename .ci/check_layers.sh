#!/usr/bin/env bash
# Layer checks the compiler cannot make on its own (docs/ARCHITECTURE.md,
# "Code layers"). Fails, listing every offence, when:
#   - a file under common/, spec/, worker/ or scheduler/ includes a gRPC
#     header (grpcpp/..., grpc/..., *.grpc.pb.h): those folders are
#     transport-free, and only services/ speaks gRPC;
#   - spec/ includes anything of worker/, scheduler/ or services/ (the spec
#     library is compute-free: common/ and proto messages only);
#   - worker/ or scheduler/ includes services/;
#   - with a build directory as argument: a binary that must not compute
#     (pipetrainctl, pipetrain-scheduler; see no_compute_binaries) links a BLAS or CUDA library or
#     holds symbols of the executor, the layers or a backend.
#
#   .ci/check_layers.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

failed=0
fail() {
  echo "check_layers: $*" >&2
  failed=1
}

# Tracked sources when this is a git checkout, else every source file.
sources() {
  local dir="$1"
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -- "$dir" | grep -E '\.(cc|h|cu|cuh)$' || true
  else
    find "$dir" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \
      -o -name '*.cuh' \) 2>/dev/null || true
  fi
}

# Prints "file:line: include" for includes of $2 (an extended regex over
# the included path) in the sources under $1.
includes_matching() {
  local dir="$1" pattern="$2"
  sources "$dir" | while read -r f; do
    grep -nHE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($pattern)" \
      "$f" || true
  done
}

grpc_headers='grpcpp/|grpc/|[^">]*\.grpc\.pb\.h'
for dir in common spec worker scheduler; do
  hits="$(includes_matching "$dir" "$grpc_headers")"
  if [[ -n "$hits" ]]; then
    fail "$dir/ must not include gRPC headers:"$'\n'"$hits"
  fi
done

hits="$(includes_matching spec 'worker/|scheduler/|services/')"
if [[ -n "$hits" ]]; then
  fail "spec/ is compute-free (common/ and proto messages only):"$'\n'"$hits"
fi
for dir in worker scheduler; do
  hits="$(includes_matching "$dir" 'services/')"
  if [[ -n "$hits" ]]; then
    fail "$dir/ must not include services/:"$'\n'"$hits"
  fi
done

# Binaries that must not link compute: the CLI, and the scheduler (jobs are
# evaluated by the workers' own pipeline).
no_compute_binaries=(ctl/pipetrainctl pipetrain-scheduler)
compute_libraries='libopenblas|libblas|libcudart|libcublas|libcuda\.'
compute_symbols='pipetrain::(StageExecutor|LocalTrainer|Model|Layer|Linear|Backend|CpuBackend|CudaBackend|Optimizer)::'
if [[ $# -ge 1 ]]; then
  build="$1"
  for bin in "${no_compute_binaries[@]}"; do
    path="$build/services/$bin"
    if [[ ! -x "$path" ]]; then
      fail "$path: not built"
      continue
    fi
    libs="$(ldd "$path" | grep -E "$compute_libraries" || true)"
    if [[ -n "$libs" ]]; then
      fail "$bin links compute libraries:"$'\n'"$libs"
    fi
    syms="$(nm -C "$path" | grep -E "$compute_symbols" | head -5 || true)"
    if [[ -n "$syms" ]]; then
      fail "$bin holds compute code, e.g.:"$'\n'"$syms"
    fi
  done
fi

if [[ $failed -ne 0 ]]; then
  exit 1
fi
echo "check_layers: ok"
