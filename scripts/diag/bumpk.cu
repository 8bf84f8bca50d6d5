// graphs.cu's `bump`, unmangled, for `nvcc -ptx` / `-cubin`.
extern "C" __global__ void bump(unsigned* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1; }
