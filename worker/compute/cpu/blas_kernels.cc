#include "worker/compute/cpu/blas_kernels.h"

#include "worker/compute/cpu/packed_gemm.h"

extern "C" char* openblas_get_corename(void);

namespace pipetrain {

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

std::string DescribeCpuKernels(bool packs) {
  const char* packed = !packs ? "off"
                       : packed_gemm::BestIsa() == packed_gemm::Isa::kAvx512
                           ? "avx512"
                           : "avx2";
  return "openblas " + BlasCoreName() + ", packed " + packed;
}

}  // namespace pipetrain
