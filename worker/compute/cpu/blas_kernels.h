// Which kernels a CPU backend runs: OpenBLAS's (chosen by OpenBLAS when it
// loads, or by OPENBLAS_CORETYPE) and the packed GEMM's (packed_gemm.h).
// Workers that differ in them differ in speed; the backend's description
// names both, and the planner profiles each kind of worker apart.
#ifndef PIPETRAIN_WORKER_COMPUTE_CPU_BLAS_KERNELS_H_
#define PIPETRAIN_WORKER_COMPUTE_CPU_BLAS_KERNELS_H_

#include <string>

namespace pipetrain {

// The name of the kernels OpenBLAS runs in this process ("Haswell",
// "Cooperlake", ...).
std::string BlasCoreName();

// Whether OpenBLAS runs kernels without AVX2 and FMA (an SSE or AVX core
// such as "Prescott" or "Sandybridge"): what OpenBLAS 0.3.21, Debian 12's,
// falls back to on CPUs newer than it knows (an Intel Xeon of family 6,
// model 207 with AVX-512 ran "Prescott" at 24-31 GFLOP/s on one thread,
// bench_compute, where the packed kernel ran 96-126).
bool BlasRunsPreAvx2Kernels();

// "openblas <core>, packed <kernel>": the packed GEMM's kernel ("avx512",
// "avx2"), or "off" when `packs` is false.
std::string DescribeCpuKernels(bool packs);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COMPUTE_CPU_BLAS_KERNELS_H_
