// A block freed while a kernel may still write it, then allocated again at once: the driver's
// cudaFree waits for that work, so the new owner's data must not be overwritten by it.  Through
// vmgpu the forwarder keeps the freed block for the next allocation of its size (alloc.c) and
// must wait the same way before handing it out.  Prints "value 222" when the wait happened.
#include <cstdio>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void late_write(int *p, long long cycles, int v)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles)
        ;
    p[0] = v;
}

int main()
{
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    int bad = 0;
    for (int round = 0; round < 5; round++) {
        int *a, *b, v = 222, got = 0;
        CK(cudaMalloc(&a, 4 << 20));
        late_write<<<1, 1, 0, s1>>>(a, 200000000ll, 111); // about 0.1 s
        CK(cudaFree(a));
        CK(cudaMalloc(&b, 4 << 20));
        CK(cudaMemcpyAsync(b, &v, sizeof v, cudaMemcpyHostToDevice, s2));
        CK(cudaStreamSynchronize(s2));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(&got, b, sizeof got, cudaMemcpyDeviceToHost));
        bad += got != 222;
        CK(cudaFree(b));
    }
    printf("overwritten %d of 5\n", bad);
    return 0;
}
