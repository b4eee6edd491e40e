// An unchanged CUDA runtime program: four streams with events between them, async
// memsets and copies through pinned memory, and a final cross-stream join.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void scale_add(float *x, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + b;
}
__global__ void sum_into(const float *x, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += x[i];
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); return 1; } } while (0)

int main() {
    const int S = 4, n = 1 << 20;
    cudaStream_t s[S]; cudaEvent_t done[S];
    float *d[S], *h, *acc;
    CK(cudaMallocHost(&h, n * sizeof(float)));
    CK(cudaMalloc(&acc, n * sizeof(float)));
    CK(cudaMemset(acc, 0, n * sizeof(float)));
    for (int k = 0; k < S; k++) {
        CK(cudaStreamCreateWithFlags(&s[k], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming));
        CK(cudaMalloc(&d[k], n * sizeof(float)));
        CK(cudaMemsetAsync(d[k], 0, n * sizeof(float), s[k]));           // x = 0
        scale_add<<<(n + 255) / 256, 256, 0, s[k]>>>(d[k], 1.f, (float)(k + 1), n);  // x = k+1
        scale_add<<<(n + 255) / 256, 256, 0, s[k]>>>(d[k], 2.f, 0.5f, n);            // x = 2(k+1)+0.5
        CK(cudaEventRecord(done[k], s[k]));
    }
    // stream 0 waits for all others, then sums everything into acc
    for (int k = 0; k < S; k++) {
        CK(cudaStreamWaitEvent(s[0], done[k], 0));
        sum_into<<<(n + 255) / 256, 256, 0, s[0]>>>(d[k], acc, n);
    }
    CK(cudaMemcpyAsync(h, acc, n * sizeof(float), cudaMemcpyDeviceToHost, s[0]));
    CK(cudaStreamSynchronize(s[0]));
    float want = 0;
    for (int k = 0; k < S; k++) want += 2.f * (k + 1) + 0.5f;
    int bad = 0;
    for (int i = 0; i < n; i++) if (h[i] != want) bad++;
    for (int k = 0; k < S; k++) { CK(cudaFree(d[k])); CK(cudaStreamDestroy(s[k])); CK(cudaEventDestroy(done[k])); }
    CK(cudaFree(acc)); CK(cudaFreeHost(h));
    printf("streams=%d n=%d value=%.1f wrong=%d %s\n", S, n, want, bad, bad ? "WRONG" : "ok");
    return bad ? 1 : 0;
}
