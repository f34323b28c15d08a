// Asks: what does each CUDA runtime call that our launchers make on every call cost the host?
// (templates/base.py ring_launch and codegen/emit_cuda.py set attributes and ask for occupancy on
// every call, to keep no state between calls.) Times, per call, averaged over N back-to-back calls:
// cudaFuncSetAttribute (shared memory, cluster opt-in), cudaOccupancyMaxActiveClusters,
// cudaLaunchKernelEx with a cluster attribute, a <<<>>> launch, cudaGetLastError, cudaGetDevice.
//
//   nvcc -O2 -arch=sm_90 -o /tmp/launch_api_cost bench/lab/launch_api_cost.cu && /tmp/launch_api_cost
//
// Answer (H200 machine, 2026-12-04): cudaFuncSetAttribute 0.41 us, cudaOccupancyMaxActiveClusters
// 0.52, cudaLaunchKernelEx with clusters 3.88, a <<<>>> launch 3.58, cudaGetLastError 0.02; the ring
// launcher as emitted 4.33. The per-call attribute and occupancy calls cost about 1 us together:
// not worth the state (per device) that caching them would keep.
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

__global__ void __cluster_dims__(1, 1, 1) k_plain(float* p) { if (p && threadIdx.x == 0) p[blockIdx.x] = 1.f; }
__global__ void k_cluster(float* p) { extern __shared__ float s[]; if (p && threadIdx.x == 0) { s[0] = 1.f; p[blockIdx.x] = s[0]; } }

template <class F> static double per_call_us(int n, F f) {
  for (int i = 0; i < 100; ++i) f();
  cudaDeviceSynchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  auto t1 = std::chrono::steady_clock::now();
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}

int main() {
  const int n = 20000, smem = 100 * 1024, cl = 8;
  float* p = nullptr;
  cudaMalloc(&p, 1 << 20);
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cl; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cl); cfg.blockDim = dim3(256); cfg.dynamicSmemBytes = smem; cfg.stream = s;
  cfg.attrs = attr; cfg.numAttrs = 1;
  cudaFuncSetAttribute(k_cluster, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int fit = 0;
  cudaOccupancyMaxActiveClusters(&fit, k_cluster, &cfg);
  printf("clusters of %d that fit: %d\n", cl, fit);
  cfg.gridDim = dim3(fit * cl);
  struct { const char* name; double us; } rows[] = {
    {"cudaFuncSetAttribute (max dynamic smem)", per_call_us(n, [&] { cudaFuncSetAttribute(k_cluster, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); })},
    {"cudaFuncSetAttribute (non-portable cluster)", per_call_us(n, [&] { cudaFuncSetAttribute(k_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1); })},
    {"cudaOccupancyMaxActiveClusters", per_call_us(n, [&] { int f = 0; cudaOccupancyMaxActiveClusters(&f, k_cluster, &cfg); })},
    {"cudaLaunchKernelEx, clusters", per_call_us(n, [&] { cudaLaunchKernelEx(&cfg, k_cluster, p); })},
    {"<<<>>> launch, 132 blocks", per_call_us(n, [&] { k_plain<<<132, 256, 0, s>>>(p); })},
    {"cudaGetLastError", per_call_us(n, [&] { (void)cudaGetLastError(); })},
    {"cudaGetDevice", per_call_us(n, [&] { int d; cudaGetDevice(&d); })},
    {"ring launch as emitted (set + occupancy + launch)", per_call_us(n, [&] {
       cudaFuncSetAttribute(k_cluster, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
       int f = 0; cudaOccupancyMaxActiveClusters(&f, k_cluster, &cfg);
       cudaLaunchKernelEx(&cfg, k_cluster, p); })},
  };
  printf("%-52s %10s\n", "call", "us a call");
  for (auto& r : rows) printf("%-52s %10.3f\n", r.name, r.us);
  printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
