# Answers: what does the device machine have that the evaluator relies on (nvcc, torch and its CUDA,
# ncu, compute-sanitizer, nsys), and how long does nvcc take to build a shared library there?
# Run it with bash:  bash bench/lab/probe_env.sh
set -u
echo "== versions"; nvcc --version | tail -1; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
which ncu compute-sanitizer nsys 2>&1 | sed 's/^/  /'
d=$(mktemp -d)
cat > $d/k.cu <<'CU'
#include <cuda_runtime.h>
__global__ void k(float* x, int n){ int i = blockIdx.x*blockDim.x+threadIdx.x; if(i<n) x[i]=2*x[i]; }
extern "C" int launch(float* x, int n, void* s){ k<<<(n+255)/256,256,0,(cudaStream_t)s>>>(x,n); return (int)cudaGetLastError(); }
CU
echo "== nvcc shared-library build times (s)"
for i in 1 2 3; do s=$(date +%s.%N); nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC -o $d/k$i.so $d/k.cu; e=$(date +%s.%N); echo "  $(echo "$e - $s" | bc)"; done
echo "== nvcc -cudart shared"; s=$(date +%s.%N); nvcc -O3 -arch=sm_90 -cudart shared -shared -Xcompiler -fPIC -o $d/k4.so $d/k.cu; e=$(date +%s.%N); echo "  $(echo "$e - $s" | bc)"
ldd $d/k1.so | sed 's/^/  /'
