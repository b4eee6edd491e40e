"""CuPy on the GPU: elementwise, reduction, a RawKernel compiled by NVRTC, a cuBLAS matmul,
an FFT, cuRAND draws from a fixed seed.  Prints one line per result; run natively and through vmgpu."""

import cupy as cp

a = cp.arange(1 << 20, dtype=cp.float32)
print("elementwise", float((a * 2 + 1)[12345]))
print("reduction", float(a.sum()))
k = cp.RawKernel(
    r"""extern "C" __global__ void twice(const float *x, float *y, int n) {
        int i = blockDim.x * blockIdx.x + threadIdx.x; if (i < n) y[i] = 2.0f * x[i]; }""",
    "twice",
)
y = cp.empty_like(a)
k(((a.size + 255) // 256,), (256,), (a, y, cp.int32(a.size)))
print("rawkernel", float(y[777]), float(y.sum()))
m = cp.arange(256 * 256, dtype=cp.float32).reshape(256, 256) / 65536
print("cublas", f"{float((m @ m).sum()):.6e}")
f = cp.fft.fft(cp.sin(cp.arange(1024, dtype=cp.float32)))
print("fft", f"{float(cp.abs(f).max()):.6e}")
r = cp.random.RandomState(seed=1234)  # cuRAND's host API (a XORWOW generator)
print(
    "curand",
    f"{float(r.standard_normal(1 << 16, dtype=cp.float32).sum()):.6e}",
    f"{float(r.uniform(size=1000).mean()):.6e}",
)
