// graphs.cu's 100-tiny-kernel graph over several placements of its 4 KiB buffer: the same
// kernel, grid and launch, but the graph's end-to-end time depends on where the buffer lies
// (scripts/diag/kdiag.cu and cuda-mem-cli/examples/graphs_diag.rs found a raw graph at 89 us
// on a process's first cudaMalloc and at 97 us on a later one, with everything else equal).
//
// `placed [P]`: P consecutive 4 KiB cudaMalloc buffers after graphs.cu's own allocations (a
// pinned 4 KiB, a 4 KiB device buffer), one graph per buffer; 200 rounds after 20 warm-up,
// round r replaying the graph of buffer r % P; prints the median host and end-to-end time per buffer and over all rounds, then
// a sweep of offsets inside one 64 MiB allocation, and each buffer's data check.
#include <cstdio>
#include <vector>
#include <algorithm>
#include <chrono>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s failed: %s\n", #x, cudaGetErrorName(err_)); return 1; } } while (0)
__global__ void bump(unsigned* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1; }
using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
static int graph_on(cudaStream_t s, unsigned* e, int n, cudaGraphExec_t* x) {
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < 100; k++) bump<<<(n + 255) / 256, 256, 0, s>>>(e, n);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(x, g, 0)); CK(cudaGraphUpload(*x, s)); CK(cudaStreamSynchronize(s));
  return 0;
}
struct P { unsigned* e; cudaGraphExec_t x; std::vector<double> h, t; int runs; };
static int rounds_over(cudaStream_t s, std::vector<P>& ps, int rounds, int warm, std::vector<double>& all_h, std::vector<double>& all_t) {
  for (int r = 0; r < rounds + warm; r++) {
    P& p = ps[r % ps.size()];
    auto t0 = clk::now(); CK(cudaGraphLaunch(p.x, s)); auto t1 = clk::now(); CK(cudaStreamSynchronize(s)); auto t2 = clk::now();
    p.runs++;
    if (r >= warm) { p.h.push_back(us(t0, t1)); p.t.push_back(us(t0, t2)); all_h.push_back(us(t0, t1)); all_t.push_back(us(t0, t2)); }
  }
  return 0;
}
int main(int argc, char** argv) {
  const int n = 1024, np = argc > 1 ? atoi(argv[1]) : 8;
  unsigned *h, *d; CK(cudaMallocHost(&h, n * 4)); CK(cudaMalloc(&d, n * 4));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<P> ps(np);
  for (auto& p : ps) { CK(cudaMalloc(&p.e, n * 4)); CK(cudaMemset(p.e, 0, n * 4)); p.runs = 0; }
  for (auto& p : ps) if (graph_on(s, p.e, n, &p.x)) return 1;
  std::vector<double> ah, at;
  // Rounds spread over the placements as the bench spreads them (200 per placement here).
  if (rounds_over(s, ps, 200 * np, 20 * np, ah, at)) return 1;
  printf("100 tiny kernels, graph replay over %d consecutive 4 KiB cudaMalloc buffers\n", np);
  for (int i = 0; i < np; i++)
    printf("  buffer %d at %p (+%6zu in its 2 MiB): host %.2f us, end-to-end %.1f us\n", i, (void*)ps[i].e,
           (size_t)ps[i].e & ((2u << 20) - 1), med(ps[i].h), med(ps[i].t));
  printf("over all buffers: host %.2f us, end-to-end %.1f us\n", med(ah), med(at));
  // Offsets inside one 64 MiB allocation.
  unsigned* big; CK(cudaMalloc(&big, 64u << 20)); CK(cudaMemset(big, 0, 64u << 20));
  size_t offs[] = {0, 512, 1024, 2048, 4096, 8192, 65536, 1u << 20, 2u << 20, (2u << 20) + 4096, 32u << 20, (48u << 20) + 12288};
  std::vector<P> qs;
  for (size_t o : offs) { P q; q.e = big + o / 4; q.runs = 0; if (graph_on(s, q.e, n, &q.x)) return 1; qs.push_back(q); }
  std::vector<double> bh, bt;
  if (rounds_over(s, qs, 100 * (int)qs.size(), 10 * (int)qs.size(), bh, bt)) return 1;
  printf("offsets inside one 64 MiB cudaMalloc:\n");
  for (size_t i = 0; i < qs.size(); i++) printf("  +%9zu: end-to-end %.1f us\n", offs[i], med(qs[i].t));
  printf("over all offsets: end-to-end %.1f us\n", med(bt));
  bool ok = true;
  for (auto& p : ps) { std::vector<unsigned> out(n); CK(cudaMemcpy(out.data(), p.e, n * 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) ok &= out[i] == 100u * (unsigned)p.runs; }
  printf("data %s\n", ok ? "correct" : "WRONG");
  return ok ? 0 : 1;
}
