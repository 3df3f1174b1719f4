// KVTIER_HD marks a function that host code and CUDA kernels share, so that both compute the same
// thing from one definition: __host__ __device__ under nvcc, a plain inline function elsewhere.
#pragma once

#ifdef __CUDACC__
#define KVTIER_HD __host__ __device__ __forceinline__
#else
#define KVTIER_HD inline
#endif
