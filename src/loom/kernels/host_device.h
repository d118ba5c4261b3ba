#pragma once
// LOOM_HOST_DEVICE marks a function compiled for the host and, under nvcc, for the GPU as well:
// the chunked scan's element steps (kernels/ssd_chunks.h) run in CUDA threads on the GPU and in
// host loops in the tests that hold them to the CPU's scan.
#ifdef __CUDACC__
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif
