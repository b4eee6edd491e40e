// An unchanged CUDA runtime program: tiled SGEMM C = A * B (N x N), pinned host
// buffers, a stream and events; checked against a CPU reference.  Exit 0 = correct.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define T 16
__global__ void sgemm(const float *a, const float *b, float *c, int n) {
    __shared__ float sa[T][T], sb[T][T];
    int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
    float acc = 0.f;
    for (int k0 = 0; k0 < n; k0 += T) {
        sa[threadIdx.y][threadIdx.x] = (row < n && k0 + threadIdx.x < n) ? a[row * n + k0 + threadIdx.x] : 0.f;
        sb[threadIdx.y][threadIdx.x] = (col < n && k0 + threadIdx.y < n) ? b[(k0 + threadIdx.y) * n + col] : 0.f;
        __syncthreads();
        for (int k = 0; k < T; k++) acc += sa[threadIdx.y][k] * sb[k][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < n) c[row * n + col] = acc;
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); return 1; } } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 512;
    size_t bytes = (size_t)n * n * sizeof(float);
    float *a, *b, *c;
    CK(cudaMallocHost(&a, bytes)); CK(cudaMallocHost(&b, bytes)); CK(cudaMallocHost(&c, bytes));
    srand(7);
    for (int i = 0; i < n * n; i++) { a[i] = (float)(rand() % 17) / 8.f - 1.f; b[i] = (float)(rand() % 13) / 6.f - 1.f; }
    float *da, *db, *dc;
    CK(cudaMalloc(&da, bytes)); CK(cudaMalloc(&db, bytes)); CK(cudaMalloc(&dc, bytes));
    cudaStream_t s; cudaEvent_t e0, e1;
    CK(cudaStreamCreate(&s)); CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    CK(cudaMemcpyAsync(da, a, bytes, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(db, b, bytes, cudaMemcpyHostToDevice, s));
    dim3 grid((n + T - 1) / T, (n + T - 1) / T), block(T, T);
    CK(cudaEventRecord(e0, s));
    sgemm<<<grid, block, 0, s>>>(da, db, dc, n);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e1, s));
    CK(cudaMemcpyAsync(c, dc, bytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    float ms = 0; CK(cudaEventElapsedTime(&ms, e0, e1));
    double maxerr = 0, sum = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double ref = 0;
            for (int k = 0; k < n; k++) ref += (double)a[i * n + k] * b[k * n + j];
            maxerr = fmax(maxerr, fabs(ref - c[i * n + j]));
            sum += c[i * n + j];
        }
    CK(cudaFree(da)); CK(cudaFree(db)); CK(cudaFree(dc));
    CK(cudaFreeHost(a)); CK(cudaFreeHost(b)); CK(cudaFreeHost(c));
    printf("matmul n=%d checksum=%.3f maxerr=%.2e %s\n", n, sum, maxerr, maxerr < 1e-2 ? "ok" : "WRONG");
    return maxerr < 1e-2 ? 0 : 1;
}
