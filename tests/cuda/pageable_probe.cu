/* Can a kernel reach ordinary (pageable, never registered) memory of the process that owns
 * its context?  With HMM/ATS it can: then a guest's kernel could read or write its worker.
 * Prints the driver's attributes and what a kernel read from a malloc'd host int. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

__global__ void peek(const int *p, int *out) { *out = *p; }

int main(void)
{
	int pageable = -1, host_tables = -1, *host = (int *)malloc(sizeof(int)), *out, seen = 0;
	*host = 0x5eed;
	cudaSetDevice(0);
	cuDeviceGetAttribute(&pageable, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0);
	cuDeviceGetAttribute(&host_tables, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 0);
	cudaMalloc(&out, sizeof(int));
	peek<<<1, 1>>>(host, out);
	cudaError_t e = cudaDeviceSynchronize();
	if (e == cudaSuccess)
		cudaMemcpy(&seen, out, sizeof(int), cudaMemcpyDeviceToHost);
	printf("pageable_memory_access %d uses_host_page_tables %d kernel_read %s %#x\n", pageable, host_tables,
	       cudaGetErrorName(e), seen);
	return 0;
}
