/* What bindgen reads: the CUDA runtime API of the toolkit the build script found. */
#include <cuda_runtime_api.h>

/* cudaProfilerStart / cudaProfilerStop live in every libcudart (shared and static), but their
 * header, cuda_profiler_api.h, ships with the full toolkit only: the runtime wheels on PyPI
 * lack it. Where it is present it is read; otherwise the two functions are declared here
 * exactly as that header declares them (unchanged since CUDA 4.0). */
#if defined(__has_include)
#if __has_include(<cuda_profiler_api.h>)
#include <cuda_profiler_api.h>
#define CUDA_MEM_SYS_HAS_PROFILER_API_H 1
#endif
#endif
#ifndef CUDA_MEM_SYS_HAS_PROFILER_API_H
extern __host__ cudaError_t CUDARTAPI cudaProfilerStart(void);
extern __host__ cudaError_t CUDARTAPI cudaProfilerStop(void);
#endif
