// PT_HOST_DEVICE marks functions compiled for both the CPU and CUDA backends,
// so the CPU tests exercise exactly the math the GPU runs.
#ifndef PIPETRAIN_WORKER_COMPUTE_HOST_DEVICE_H_
#define PIPETRAIN_WORKER_COMPUTE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define PT_HOST_DEVICE __host__ __device__
#else
#define PT_HOST_DEVICE
#endif

#endif  // PIPETRAIN_WORKER_COMPUTE_HOST_DEVICE_H_
