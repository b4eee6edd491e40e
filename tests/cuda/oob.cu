// An unchanged CUDA runtime program whose kernel writes far outside its allocation.
// Prints the error the runtime reports; exits 0 if it reported one.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void wild(int *p) { p[threadIdx.x * (1 << 28)] = 1; }

int main() {
    int *d;
    if (cudaMalloc(&d, 64) != cudaSuccess) return 2;
    wild<<<1, 32>>>(d);
    cudaError_t launch = cudaGetLastError();
    cudaError_t sync = cudaDeviceSynchronize();
    cudaError_t after = cudaMalloc(&d, 64);
    printf("launch=%d sync=%d (%s) after=%d\n", (int)launch, (int)sync, cudaGetErrorName(sync), (int)after);
    return sync != cudaSuccess ? 0 : 1;
}
