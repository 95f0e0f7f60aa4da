#include "worker/compute/cpu/blas_kernels.h"

#include <string_view>

#include "worker/compute/cpu/packed_gemm.h"

extern "C" char* openblas_get_corename(void);

namespace pipetrain {

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

bool BlasRunsPreAvx2Kernels() {
  // OpenBLAS's x86-64 cores (its DYNAMIC_ARCH list) whose kernels stop
  // short of AVX2 + FMA.
  static constexpr std::string_view kCores[] = {
      "Prescott", "Core2",       "Penryn",       "Dunnington", "Nehalem",
      "Atom",     "Opteron",     "Opteron_SSE3", "Barcelona",  "Nano",
      "Bobcat",   "Sandybridge", "Bulldozer",    "Piledriver"};
  static const bool pre_avx2 = [] {
    const std::string name = BlasCoreName();
    for (std::string_view core : kCores) {
      if (name == core) return true;
    }
    return false;
  }();
  return pre_avx2;
}

std::string DescribeCpuKernels(bool packs) {
  const char* packed = !packs ? "off"
                       : packed_gemm::BestIsa() == packed_gemm::Isa::kAvx512
                           ? "avx512"
                           : "avx2";
  return "openblas " + BlasCoreName() + ", packed " + packed;
}

}  // namespace pipetrain
