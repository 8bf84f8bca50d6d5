// C++ reference of the two shapes of the well-known `cudaAllocMapped` helper, as C++ CUDA code
// ships it (jetson-utils cudaMappedMemory.h), including its leaks on the error paths. Each
// returns 0 on success, -1 when it refuses before calling CUDA, or the cudaError_t that failed,
// so the differential test can compare outcomes and codes with the Rust API.
#include <cuda_runtime_api.h>
#include <cstring>

extern "C" int ref_alloc_mapped_pair(size_t size, void** cpu, void** gpu) {
  if (!cpu || !gpu || size == 0) return -1;
  cudaError_t e = cudaHostAlloc(cpu, size, cudaHostAllocMapped);
  if (e != cudaSuccess) return (int)e;
  e = cudaHostGetDevicePointer(gpu, *cpu, 0);
  if (e != cudaSuccess) return (int)e;  // the original leaks *cpu here
  memset(*cpu, 0, size);
  return 0;
}

extern "C" int ref_alloc_mapped_single(size_t size, void** ptr) {
  void* cpu = nullptr;
  void* gpu = nullptr;
  if (!ptr || size == 0) return -1;
  int r = ref_alloc_mapped_pair(size, &cpu, &gpu);
  if (r != 0) return r;
  if (cpu != gpu) return -2;  // the original leaks cpu here
  *ptr = gpu;
  return 0;
}

extern "C" int ref_free_host(void* p) { return (int)cudaFreeHost(p); }

// Clears the runtime's last error, as the Rust side does after a failure, so that later tests
// start clean.
extern "C" int ref_get_last_error(void) { return (int)cudaGetLastError(); }
