// An unchanged CUDA runtime program: the device properties a program sees, one per line.
#include <cstdio>
#include <cuda_runtime.h>

int main() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { printf("no devices\n"); return 1; }
    printf("devices %d\n", n);
    for (int d = 0; d < n; d++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, d) != cudaSuccess) return 1;
        size_t free_b = 0, total_b = 0;
        cudaSetDevice(d);
        cudaMemGetInfo(&free_b, &total_b);
        printf("name %s\n", p.name);
        printf("uuid");
        for (int i = 0; i < 16; i++) printf("%02x", (unsigned char)p.uuid.bytes[i]);
        printf("\ncc %d.%d\nsms %d\nwarp %d\nmaxthreads %d\nsmem_block %zu\nsmem_optin %zu\nregs %d\n",
               p.major, p.minor, p.multiProcessorCount, p.warpSize, p.maxThreadsPerBlock, p.sharedMemPerBlock,
               p.sharedMemPerBlockOptin, p.regsPerBlock);
        printf("l2 %d\nbuswidth %d\npci %04x:%02x:%02x\nmanaged %d\nconcurrent %d\nasync_engines %d\n",
               p.l2CacheSize, p.memoryBusWidth, p.pciDomainID, p.pciBusID, p.pciDeviceID, p.managedMemory,
               p.concurrentKernels, p.asyncEngineCount);
        printf("total_mem %zu\nmeminfo_total %zu\n", p.totalGlobalMem, total_b);
    }
    return 0;
}
