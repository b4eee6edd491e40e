/*
 * A driver-API program using every GPU it sees: per device, its UUID's last byte, PCI id,
 * total memory, and a round trip of data in that device's context.
 */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
	int n = 0, bad = 0;
	if (cuInit(0) || cuDeviceGetCount(&n)) {
		printf("init failed\n");
		return 1;
	}
	printf("devices %d\n", n);
	for (int d = 0; d < n; d++) {
		CUdevice dev;
		CUcontext ctx;
		CUuuid u;
		char pci[32];
		size_t total = 0, free_b = 0;
		CUdeviceptr p;
		int data[256], back[256];
		cuDeviceGet(&dev, d);
		cuDeviceGetUuid(&u, dev);
		cuDeviceGetPCIBusId(pci, sizeof pci, dev);
		cuDevicePrimaryCtxRetain(&ctx, dev);
		cuCtxSetCurrent(ctx);
		cuMemGetInfo(&free_b, &total);
		for (int i = 0; i < 256; i++)
			data[i] = d * 1000 + i;
		int ok = !cuMemAlloc(&p, sizeof data) && !cuMemcpyHtoD(p, data, sizeof data) &&
			 !cuMemcpyDtoH(back, p, sizeof back) && !memcmp(data, back, sizeof data) && !cuMemFree(p);
		bad += !ok;
		printf("device %d uuid_last=%d pci=%s total=%zu data=%s\n", d, (unsigned char)u.bytes[15], pci, total,
		       ok ? "ok" : "WRONG");
	}
	return bad ? 1 : 0;
}
