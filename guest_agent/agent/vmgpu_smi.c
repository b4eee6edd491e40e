/* SPDX-License-Identifier: Apache-2.0 */
/* vmgpu-smi: what this guest has of the GPU, as the guest sees it: per GPU its quota, used
 * and free memory (through the guest libcuda.so.1, so through the host forwarder), and the
 * guest processes using it (from the region's channel table).
 *
 *   vmgpu-smi [--json]
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "ivshmem.h"

static const char *state_name(uint32_t s)
{
	switch (s) {
	case VMGPU_CHAN_CLAIMING: return "starting";
	case VMGPU_CHAN_ACTIVE: return "running";
	case VMGPU_CHAN_CLOSING: return "exiting";
	default: return "?";
	}
}

int main(int argc, char **argv)
{
	int json = argc > 1 && !strcmp(argv[1], "--json");
	if (argc > 1 && !json) {
		fprintf(argc > 1 && !strcmp(argv[1], "--help") ? stdout : stderr, "usage: vmgpu-smi [--json]\n");
		return strcmp(argv[1], "--help") ? 2 : 0;
	}
	CUresult r = cuInit(0);
	int n = 0;
	if (r == CUDA_SUCCESS)
		r = cuDeviceGetCount(&n);
	if (r != CUDA_SUCCESS) {
		const char *s = "?";
		cuGetErrorName(r, &s);
		fprintf(stderr, "vmgpu-smi: no GPU through vmgpu (%s); is the guest agent running?\n", s);
		return 1;
	}
	if (json)
		printf("{\"gpus\": [");
	else
		printf("%-4s %-32s %12s %12s %12s\n", "gpu", "name", "quota MiB", "used MiB", "free MiB");
	for (int i = 0; i < n; i++) {
		CUdevice d;
		CUcontext c;
		char name[128] = "";
		size_t total = 0, free_b = 0;
		cuDeviceGet(&d, i);
		cuDeviceGetName(name, sizeof name, d);
		cuDeviceTotalMem(&total, d);
		if (cuDevicePrimaryCtxRetain(&c, d) == CUDA_SUCCESS && cuCtxSetCurrent(c) == CUDA_SUCCESS)
			cuMemGetInfo(&free_b, &total);
		size_t used = total - free_b;
		if (json)
			printf("%s{\"index\": %d, \"name\": \"%s\", \"quota_bytes\": %zu, \"used_bytes\": %zu}", i ? ", " : "",
			       i, name, total, used);
		else
			printf("%-4d %-32s %12zu %12zu %12zu\n", i, name, total >> 20, used >> 20, free_b >> 20);
	}

	char path[512];
	vg_region_path(path, sizeof path);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	void *base = MAP_FAILED;
	if (fd >= 0 && fstat(fd, &st) == 0)
		base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (fd >= 0)
		close(fd);
	struct vmgpu_guest *g = NULL;
	if (base == MAP_FAILED || vmgpu_guest_attach(base, (uint64_t)st.st_size, NULL, &g) != 0) {
		if (json)
			printf("], \"processes\": null}\n");
		else
			printf("(cannot read the processes: region %s: %s)\n", path,
			       base == MAP_FAILED ? "unreadable" : vmgpu_shm_errmsg());
		return 0;
	}
	const struct vmgpu_layout L = *vmgpu_guest_layout(g);
	vmgpu_guest_detach(g);
	printf(json ? "], \"processes\": [" : "\n%-8s %-16s %-9s %s\n", "pid", "command", "state", "pinned MiB");
	int first = 1;
	for (uint32_t i = 0; i < L.nchannels; i++) {
		struct vmgpu_chan_info ci;
		if (vmgpu_region_chan_info(base, (uint64_t)st.st_size, &L, i, &ci) != 0 || ci.state == VMGPU_CHAN_FREE ||
		    ci.state == VMGPU_CHAN_DEAD)
			continue;
		uint64_t pinned = (uint64_t)ci.heap_blocks * L.heap_block_size;
		if (json)
			printf("%s{\"pid\": %u, \"command\": \"%s\", \"state\": \"%s\", \"pinned_bytes\": %llu, \"self\": %s}",
			       first ? "" : ", ", ci.owner_pid, ci.owner_comm, state_name(ci.state),
			       (unsigned long long)pinned, ci.owner_pid == (uint32_t)getpid() ? "true" : "false");
		else
			printf("%-8u %-16s %-9s %llu%s\n", ci.owner_pid, ci.owner_comm, state_name(ci.state),
			       (unsigned long long)(pinned >> 20), ci.owner_pid == (uint32_t)getpid() ? "  (vmgpu-smi)" : "");
		first = 0;
	}
	if (json)
		printf("]}\n");
	return 0;
}
