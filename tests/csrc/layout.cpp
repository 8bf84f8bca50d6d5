// Sizes and offsets of the runtime structs the safe crate passes by pointer, as the C++
// compiler lays them out, for comparison with bindgen's Rust structs.
#include <cuda_runtime_api.h>
#include <cstddef>

extern "C" size_t layout_value(int what) {
  switch (what) {
    case 0: return sizeof(cudaPointerAttributes);
    case 1: return offsetof(cudaPointerAttributes, devicePointer);
    case 2: return offsetof(cudaPointerAttributes, hostPointer);
    case 3: return sizeof(cudaDeviceProp);
    case 4: return offsetof(cudaDeviceProp, totalGlobalMem);
    case 5: return sizeof(dim3);
    case 6: return sizeof(cudaMemLocation);
    case 7: return sizeof(cudaError_t);
    case 8: return sizeof(cudaMemcpyKind);
    case 9: return offsetof(cudaDeviceProp, pciBusID);
    // `id` is a direct member up to CUDA 13.4 and a member of an anonymous union from 13.5:
    // the same offset either way, which cudaMemLocation::id() in Rust must find.
    case 10: return offsetof(cudaMemLocation, id);
    default: return (size_t)-1;
  }
}

// A device location built by the C++ compiler, for cudaMemLocation::id() to read back.
extern "C" cudaMemLocation layout_device_location(int id) {
  cudaMemLocation loc = {};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = id;
  return loc;
}
