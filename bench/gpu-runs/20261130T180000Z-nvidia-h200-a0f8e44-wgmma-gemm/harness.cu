// Standalone check of gemm_bf16_sm90 (wgmma) against gemm_bf16 (mma.sync) and a float64 reference.
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <cmath>
#include <random>
extern "C" __global__ void gemm_bf16(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int, int, int, int, int, int);
extern "C" __global__ void gemm_bf16_f32out(float*, const __nv_bfloat16*, const __nv_bfloat16*, int, int, int, int, int, int);
extern "C" __global__ void gemm_bf16_sm90(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int, int, int, int, int, int);
extern "C" __global__ void gemm_bf16_sm90_f32out(float*, const __nv_bfloat16*, const __nv_bfloat16*, int, int, int, int, int, int);
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
static float bf(uint16_t b) { uint32_t u = uint32_t(b) << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t tobf(float f) { __nv_bfloat16 h = __float2bfloat16_rn(f); uint16_t b; memcpy(&b, &h, 2); return b; }
int main(int argc, char** argv) {
  int sm90_smem = 4 * 48 * 1024 + 1024, old_smem = 4 * (128 + 256) * 32 * 2;
  CK(cudaFuncSetAttribute(gemm_bf16_sm90, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90_smem));
  CK(cudaFuncSetAttribute(gemm_bf16_sm90_f32out, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90_smem));
  CK(cudaFuncSetAttribute(gemm_bf16, cudaFuncAttributeMaxDynamicSharedMemorySize, old_smem));
  CK(cudaFuncSetAttribute(gemm_bf16_f32out, cudaFuncAttributeMaxDynamicSharedMemorySize, old_smem));
  struct Shape { int m, n, k; bool time; };
  std::vector<Shape> shapes = {{1,8,8,false},{37,40,24,false},{129,264,1000,false},{300,6144,2560,false},{7,19456,2560,false},
                               {64,2560,9728,false},{4096,6144,2560,true},{4096,2560,4096,true},{4096,19456,2560,true},{4096,2560,9728,true},
                               {8192,6144,2560,true},{8192,2560,4096,true},{8192,19456,2560,true},{8192,2560,9728,true}};
  std::mt19937_64 rng(12345);
  int fails = 0;
  for (auto s : shapes) {
    size_t na = size_t(s.m) * s.k, nw = size_t(s.n) * s.k, nc = size_t(s.m) * s.n;
    std::vector<uint16_t> a(na), w(nw);
    std::uniform_real_distribution<float> ua(-2, 2), uw(-0.1f, 0.1f);
    for (auto& x : a) x = tobf(ua(rng));
    for (auto& x : w) x = tobf(uw(rng));
    __nv_bfloat16 *da, *dw, *c1, *c2; float *f1, *f2;
    CK(cudaMalloc(&da, na * 2)); CK(cudaMalloc(&dw, nw * 2)); CK(cudaMalloc(&c1, nc * 2)); CK(cudaMalloc(&c2, nc * 2));
    CK(cudaMalloc(&f1, nc * 4)); CK(cudaMalloc(&f2, nc * 4));
    CK(cudaMemcpy(da, a.data(), na * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dw, w.data(), nw * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(c1, 0, nc * 2)); CK(cudaMemset(c2, 0xff, nc * 2)); CK(cudaMemset(f1, 0, nc * 4)); CK(cudaMemset(f2, 0xff, nc * 4));
    int tiles = ((s.m + 127) / 128) * ((s.n + 255) / 256);
    gemm_bf16<<<tiles, 256, old_smem>>>(c1, da, dw, s.m, s.n, s.k, s.k, s.k, s.n);
    gemm_bf16_f32out<<<tiles, 256, old_smem>>>(f1, da, dw, s.m, s.n, s.k, s.k, s.k, s.n);
    gemm_bf16_sm90<<<tiles, 256, sm90_smem>>>(c2, da, dw, s.m, s.n, s.k, s.k, s.k, s.n);
    gemm_bf16_sm90_f32out<<<tiles, 256, sm90_smem>>>(f2, da, dw, s.m, s.n, s.k, s.k, s.k, s.n);
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    std::vector<uint16_t> h1(nc), h2(nc); std::vector<float> g1(nc), g2(nc);
    CK(cudaMemcpy(h1.data(), c1, nc * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(h2.data(), c2, nc * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g1.data(), f1, nc * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(g2.data(), f2, nc * 4, cudaMemcpyDeviceToHost));
    size_t diff16 = 0, diff32 = 0; double maxd32 = 0;
    for (size_t i = 0; i < nc; ++i) {
      diff16 += h1[i] != h2[i];
      uint32_t u1, u2; memcpy(&u1, &g1[i], 4); memcpy(&u2, &g2[i], 4);
      if (u1 != u2) { diff32++; maxd32 = std::max(maxd32, (double)fabs(g1[i] - g2[i])); }
    }
    // float64 reference on sampled elements (all when small)
    std::uniform_int_distribution<int> ur(0, s.m - 1), uc(0, s.n - 1);
    size_t pts = nc <= 200000 ? nc : 4000; double worst = 0; int bad = 0;
    for (size_t p = 0; p < pts; ++p) {
      int r, c; if (pts == nc) { r = p / s.n; c = p % s.n; } else { r = ur(rng); c = uc(rng); }
      double sum = 0, mag = 0;
      for (int k = 0; k < s.k; ++k) { double x = double(bf(a[size_t(r) * s.k + k])) * bf(w[size_t(c) * s.k + k]); sum += x; mag += fabs(x); }
      double tol = mag * pow(2.0, -16);
      double e = fabs(g2[size_t(r) * s.n + c] - sum) / (tol > 0 ? tol : 1e-30);
      worst = std::max(worst, e); if (e > 1.0) bad++;
    }
    double ms_old = 0, ms_new = 0;
    if (s.time) {
      cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
      for (int round = 0; round < 2; ++round) {
        for (int which = 0; which < 2; ++which) {
          for (int i = 0; i < 3; ++i) { if (which == 0) gemm_bf16<<<tiles, 256, old_smem>>>(c1, da, dw, s.m, s.n, s.k, s.k, s.k, s.n); else gemm_bf16_sm90<<<tiles, 256, sm90_smem>>>(c2, da, dw, s.m, s.n, s.k, s.k, s.k, s.n); }
          cudaEventRecord(e0);
          for (int i = 0; i < 20; ++i) { if (which == 0) gemm_bf16<<<tiles, 256, old_smem>>>(c1, da, dw, s.m, s.n, s.k, s.k, s.k, s.n); else gemm_bf16_sm90<<<tiles, 256, sm90_smem>>>(c2, da, dw, s.m, s.n, s.k, s.k, s.k, s.n); }
          cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); float ms; cudaEventElapsedTime(&ms, e0, e1);
          if (round == 1) { if (which == 0) ms_old = ms / 20; else ms_new = ms / 20; }
        }
      }
      CK(cudaGetLastError());
    }
    double fl = 2.0 * s.m * s.n * s.k;
    printf("%5d x %5d x %5d: bf16 differ %zu/%zu, f32 differ %zu (max %.3g); wgmma vs f64: worst err/tol %.3f, %d over", s.m, s.n, s.k, diff16, nc, diff32, maxd32, worst, bad);
    if (s.time) printf("; mma.sync %.3f ms %.0f TFLOP/s, wgmma %.3f ms %.0f TFLOP/s", ms_old, fl / ms_old / 1e9, ms_new, fl / ms_new / 1e9);
    printf("\n");
    fails += bad > 0;
    cudaFree(da); cudaFree(dw); cudaFree(c1); cudaFree(c2); cudaFree(f1); cudaFree(f2);
  }
  printf(fails ? "FAILED\n" : "reference OK\n");
  return fails != 0;
}
