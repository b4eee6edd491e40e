// An unchanged CUDA runtime program: vector add, checked on the host. Exit 0 = correct.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void vadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); return 1; } } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : (1 << 20);
    size_t bytes = (size_t)n * sizeof(float);
    float *a = (float *)malloc(bytes), *b = (float *)malloc(bytes), *c = (float *)malloc(bytes);
    for (int i = 0; i < n; i++) { a[i] = (float)i; b[i] = 2.0f * (float)i; }
    float *da, *db, *dc;
    CK(cudaMalloc(&da, bytes)); CK(cudaMalloc(&db, bytes)); CK(cudaMalloc(&dc, bytes));
    CK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
    vadd<<<(n + 255) / 256, 256>>>(da, db, dc, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        if (c[i] != 3.0f * (float)i) { fprintf(stderr, "mismatch at %d: %f\n", i, c[i]); return 1; }
    CK(cudaFree(da)); CK(cudaFree(db)); CK(cudaFree(dc));
    printf("vecadd ok n=%d\n", n);
    return 0;
}
