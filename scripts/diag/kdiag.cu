// Where does the 100-tiny-kernel graph's end-to-end time go? graphs.cu's `bump` (nvcc, sm_90
// SASS) against the same kernel from other images, each captured into its own 100-kernel graph
// on one non-blocking stream, replayed interleaved (as `cuda-mem bench` does) and then alone
// (as graphs.cu does). Usage: kdiag probes.ptx bump75.ptx probes90.cubin bump90.cubin
#include <cstdio>
#include <vector>
#include <string>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <cuda.h>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorName(e_)); return 1; } } while (0)
#define DK(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { const char* s_; cuGetErrorName(e_, &s_); printf("%s: %s\n", #x, s_); return 1; } } while (0)
__global__ void bump(unsigned* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1; }
using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
static std::string slurp(const char* p) { std::ifstream f(p, std::ios::binary); std::stringstream s; s << f.rdbuf(); return s.str(); }
struct V { std::string name; int kind; CUfunction f; cudaKernel_t k; cudaGraphExec_t x; std::vector<double> h, e, ah, ae; };
static int launch(V& v, cudaStream_t s, unsigned* p, int n) {
  int grid = (n + 255) / 256;
  void* args[] = { &p, &n };
  if (v.kind == 0) { bump<<<grid, 256, 0, s>>>(p, n); CK(cudaGetLastError()); }
  else if (v.kind == 1) DK(cuLaunchKernel(v.f, grid, 1, 1, 256, 1, 1, 0, (CUstream)s, args, nullptr));
  else CK(cudaLaunchKernel((const void*)v.k, dim3(grid), dim3(256), args, 0, s));
  return 0;
}
static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
int main(int argc, char** argv) {
  if (argc < 5) { printf("usage: kdiag probes.ptx bump75.ptx probes90.cubin bump90.cubin\n"); return 2; }
  const int n = 1024, rounds = 200, warm = 20;
  CK(cudaFree(0));
  unsigned* e; CK(cudaMalloc(&e, n * 4)); CK(cudaMemset(e, 0, n * 4));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<V> vs;
  vs.push_back({"nvcc sm_90 (graphs.cu)", 0, nullptr, nullptr, nullptr});
  std::string imgs[4] = { slurp(argv[1]), slurp(argv[2]), slurp(argv[3]), slurp(argv[4]) };
  const char* names[4] = { "probes PTX, cuModuleLoadData", "nvcc compute_75 PTX, cuModuleLoadData", "probes PTX ptxas sm_90 cubin", "nvcc sm_90 cubin" };
  const char* fn[4] = { "cm_bump", "bump", "cm_bump", "bump" };
  for (int i = 0; i < 4; i++) {
    CUmodule m; DK(cuModuleLoadData(&m, imgs[i].c_str()));
    CUfunction f; DK(cuModuleGetFunction(&f, m, fn[i]));
    vs.push_back({names[i], 1, f, nullptr, nullptr});
  }
  for (int i = 0; i < 2; i++) {
    cudaLibrary_t lib; CK(cudaLibraryLoadData(&lib, imgs[i].c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    cudaKernel_t k; CK(cudaLibraryGetKernel(&k, lib, fn[i]));
    vs.push_back({std::string(i ? "nvcc compute_75 PTX" : "probes PTX") + ", cudaLibraryLoadData (cuda-mem's path)", 2, nullptr, k, nullptr});
  }
  for (auto& v : vs) {
    int regs = -1, bin = -1;
    if (v.kind == 0) { cudaFuncAttributes a; CK(cudaFuncGetAttributes(&a, (const void*)bump)); regs = a.numRegs; bin = a.binaryVersion; }
    else if (v.kind == 1) { DK(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, v.f)); DK(cuFuncGetAttribute(&bin, CU_FUNC_ATTRIBUTE_BINARY_VERSION, v.f)); }
    else { cudaFuncAttributes a; CK(cudaFuncGetAttributes(&a, (const void*)v.k)); regs = a.numRegs; bin = a.binaryVersion; }
    for (int r = 0; r < 3; r++) { for (int k = 0; k < 100; k++) if (launch(v, s, e, n)) return 1; }
    CK(cudaStreamSynchronize(s));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < 100; k++) if (launch(v, s, e, n)) return 1;
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&v.x, g, 0)); CK(cudaGraphUpload(v.x, s)); CK(cudaStreamSynchronize(s));
    printf("%-55s regs %d, binary %d\n", v.name.c_str(), regs, bin);
  }
  // Interleaved, the order rotating (as cuda-mem bench runs its sides).
  for (int r = 0; r < rounds + warm; r++)
    for (size_t j = 0; j < vs.size(); j++) {
      V& v = vs[(r + j) % vs.size()];
      auto t0 = clk::now(); CK(cudaGraphLaunch(v.x, s)); auto t1 = clk::now(); CK(cudaStreamSynchronize(s)); auto t2 = clk::now();
      if (r >= warm) { v.h.push_back(us(t0, t1)); v.e.push_back(us(t0, t2)); }
    }
  // Alone, one after another (as graphs.cu runs), twice through the list.
  for (int pass = 0; pass < 2; pass++)
    for (auto& v : vs)
      for (int r = 0; r < rounds / 2 + warm; r++) {
        auto t0 = clk::now(); CK(cudaGraphLaunch(v.x, s)); auto t1 = clk::now(); CK(cudaStreamSynchronize(s)); auto t2 = clk::now();
        if (r >= warm) { v.ah.push_back(us(t0, t1)); v.ae.push_back(us(t0, t2)); }
      }
  printf("%-55s %9s %9s %9s %9s\n", "100-kernel graph replay, median us", "il host", "il end", "alone h", "alone e");
  for (auto& v : vs) printf("%-55s %9.2f %9.1f %9.2f %9.1f\n", v.name.c_str(), med(v.h), med(v.e), med(v.ah), med(v.ae));
  std::vector<unsigned> out(n); CK(cudaMemcpy(out.data(), e, n * 4, cudaMemcpyDeviceToHost));
  printf("data: every word %u (expected a multiple of 100)\n", out[0]);
  return 0;
}
