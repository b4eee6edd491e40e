// A module whose one global takes 64 MiB of device memory: loading it must count against the quota.
__device__ char big[64 << 20];
extern "C" __global__ void touch() { big[threadIdx.x * 4096] = 1; }
