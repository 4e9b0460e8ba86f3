// Probe: does the narrow GEMV's tile imbalance across SMs cost time? Time gemv_narrow_bf16 for
// shapes whose tile count is a multiple of the SM count and for the Qwen3-4B ones in between.
#include "../../kernels/gemv/gemv.cu"
#include <cstdio>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  struct S { int n, k, blocks; };
  std::vector<S> shapes;
  // Same bytes, two layouts: the Qwen3-4B shape (blocks = min(tiles, 2 SMs)) and one with 2 tiles
  // per SM and K stretched to carry the same bytes (every warp the same share, fewer round trips).
  for (auto t : std::vector<S>{{6144, 2560, 264}, {4224, 3712, 264}, {2560, 4096, 160}, {4224, 2496, 264},
                               {2560, 9728, 160}, {4224, 5888, 264}, {2112, 4096, 132}, {2112, 9728, 132}})
    shapes.push_back(t);
  size_t maxw = 0; for (auto s : shapes) maxw = std::max(maxw, size_t(s.n) * s.k);
  __nv_bfloat16 *w, *x, *y; CK(cudaMalloc(&w, maxw * 2 * 20)); CK(cudaMalloc(&x, 8 * 16384 * 2)); CK(cudaMalloc(&y, 8 * 65536 * 2));
  CK(cudaMemset(w, 0x3c, maxw * 2 * 20)); CK(cudaMemset(x, 0x3c, 8 * 16384 * 2));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  printf("SMs %d\n", sms);
  for (int m : {1, 8}) for (auto s : shapes) {
    GemvParams p{}; p.w = w; p.x = x; p.out = y; p.n = s.n; p.k = s.k; p.m = m; p.ld_x = s.k; p.ld_out = s.n; p.epilogue = 0;
    cudaStream_t st; cudaStreamCreate(&st);
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 20; ++i) { GemvParams q = p; q.w = w + size_t(i) * s.n * s.k; gemv_narrow_bf16<<<s.blocks, 256, 0, st>>>(q); }  // every launch its own weights: nothing stays in L2
    CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; ++i) cudaGraphLaunch(ge, st);
    float best = 1e9;
    for (int r = 0; r < 5; ++r) {
      cudaEventRecord(e0, st); for (int i = 0; i < 5; ++i) cudaGraphLaunch(ge, st); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1));
      float ms; cudaEventElapsedTime(&ms, e0, e1); best = std::min(best, ms / 100);
    }
    double us = best * 1e3, bytes = double(s.n) * s.k * 2;
    printf("m %d n %6d (tiles %4d) k %5d blocks %4d: %7.2f us  %6.0f GB/s  tiles/SM %.2f\n", m, s.n, s.n / 16, s.k, s.blocks, us, bytes / us / 1e3, double(s.n / 16) / sms);
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g); cudaStreamDestroy(st);
  }
  return 0;
}
