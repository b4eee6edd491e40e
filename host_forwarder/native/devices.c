/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The guest's GPUs, checked at start-up: each --gpus index opened on the driver, with what a
 * guest is told of it (name, UUID, attributes, memory) and its quota (--mem).  The supervisor
 * never opens the driver itself (each worker it forks does): this is done in a child.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "process.h"

int vh_parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	uint64_t mul = 1;
	switch (*end) {
	case 'K': case 'k': mul = 1ull << 10; end++; break;
	case 'M': case 'm': mul = 1ull << 20; end++; break;
	case 'G': case 'g': mul = 1ull << 30; end++; break;
	case 'T': case 't': mul = 1ull << 40; end++; break;
	}
	if (*end == 'i' || *end == 'B')
		end++;
	if (*end == 'B')
		end++;
	if (*end || (mul > 1 && v > UINT64_MAX / mul))
		return -1;
	*out = v * mul;
	return 0;
}

static int open_devices(const char *gpus, const char *mems)
{
	const struct vh_backend *B = &BK;
	CUresult r = B->cuInit(0);
	if (r != CUDA_SUCCESS)
		return vh_die("cuInit failed: %s (%d)", vh_error_name(r), r);
	B->cuDriverGetVersion(&F.driver_version);
	int count = 0;
	B->cuDeviceGetCount(&count);
	char *list = strdup(gpus), *save = NULL;
	for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (F.ndev == VG_MAX_DEVICES)
			return vh_die("at most %d GPUs per guest", VG_MAX_DEVICES);
		char *end;
		long ord = strtol(tok, &end, 10);
		if (*end || ord < 0 || ord >= count)
			return vh_die("GPU '%s' is not a device index of this host (0..%d)", tok, count - 1);
		int i = F.ndev++;
		F.ordinal[i] = (int)ord;
		if ((r = B->cuDeviceGet(&F.dev[i], (int)ord)) != CUDA_SUCCESS)
			return vh_die("GPU %ld: %s", ord, vh_error_name(r));
		struct vg_dev_info *d = &F.info[i];
		B->cuDeviceGetName(d->name, sizeof d->name, F.dev[i]);
		B->cuDeviceGetUuid_v2((CUuuid *)d->uuid, F.dev[i]);
		size_t total = 0;
		B->cuDeviceTotalMem_v2(&total, F.dev[i]);
		d->nattrs = CU_DEVICE_ATTRIBUTE_MAX < VG_MAX_ATTRS ? CU_DEVICE_ATTRIBUTE_MAX : VG_MAX_ATTRS;
		for (int a = 1; a < d->nattrs; a++)
			if (B->cuDeviceGetAttribute(&d->attrs[a], a, F.dev[i]) != CUDA_SUCCESS)
				d->attrs[a] = 0;
		/* what vmgpu does not serve, guests are told as a GPU without it tells: no multicast
		 * objects (cuMulticast* are refused), no fabric handles; frameworks take their fallback
		 * (NCCL's NVLS, XLA's multicast all-reduce) */
		d->attrs[CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED] = 0;
		d->attrs[CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED] = 0;
		d->pci_domain = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID];
		d->pci_bus = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID];
		d->pci_device = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID];
		F.quota[i] = total;
		d->total_mem = total;
	}
	free(list);
	if (F.ndev == 0)
		return vh_die("no GPU given (--gpus)");
	if (mems) {
		char *ml = strdup(mems);
		int i = 0;
		for (char *tok = strtok_r(ml, ",", &save); tok; tok = strtok_r(NULL, ",", &save), i++) {
			uint64_t q;
			if (i >= F.ndev || vh_parse_size(tok, &q) || q == 0)
				return vh_die("--mem: '%s' is not a size for GPU slot %d", tok, i);
			if (q > F.info[i].total_mem)
				return vh_die("--mem: %s is more than GPU slot %d has (%llu bytes)", tok, i,
					      (unsigned long long)F.info[i].total_mem);
			F.quota[i] = F.info[i].total_mem = q;
		}
		free(ml);
		if (i != F.ndev)
			return vh_die("--mem: give one size per GPU (%d)", F.ndev);
	}
	return 0;
}

/* Check the GPUs and read what guests will be told, in a child: this process never
 * opens the driver, so that each worker it forks can. */
static int probe_in_child(const char *gpus, const char *mems)
{
	struct vh_fwd *shared = mmap(NULL, sizeof F, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED)
		return vh_die("cannot map shared memory: %s", strerror(errno));
	pid_t pid = fork();
	if (pid == 0) {
		char err[512];
		if (vh_backend_load(&BK, backend_name, err, sizeof err))
			_exit(vh_die("%s", err));
		if (open_devices(gpus, mems))
			_exit(1);
		*shared = F;
		_exit(0);
	}
	int status = 0;
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		munmap(shared, sizeof F);
		return 1;
	}
	F.ndev = shared->ndev;
	F.driver_version = shared->driver_version;
	memcpy(F.ordinal, shared->ordinal, sizeof F.ordinal);
	memcpy(F.quota, shared->quota, sizeof F.quota);
	memcpy(F.info, shared->info, sizeof F.info);
	munmap(shared, sizeof F);
	return 0;
}

int vh_devices_probe(const char *gpus, const char *mems, int allow_pageable)
{
	if (probe_in_child(gpus, mems))
		return 1;
	/* A GPU whose kernels can reach any pageable memory of the process that runs them (HMM or
	 * ATS) lets a guest's kernel read and write its worker: the quota, the scheduler pages, the
	 * driver's state.  Addresses given to kernels are the kernels' business, so there is no
	 * checking them: such a GPU is refused unless the operator accepts it. */
	for (int d = 0; d < F.ndev; d++) {
		if (F.info[d].nattrs <= CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS ||
		    !F.info[d].attrs[CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS])
			continue;
		if (!allow_pageable)
			return vh_die("GPU %d: its kernels can reach any pageable host memory of the process that "
				      "runs them (HMM/ATS), so a guest's kernel could read and write its worker; "
				      "refusing to serve it. Load nvidia-uvm with uvm_disable_hmm=1, or pass "
				      "--allow-pageable-access to accept that risk",
				      d);
		vh_log("warning: GPU %d: kernels reach pageable host memory (HMM/ATS) and --allow-pageable-access "
		       "is given: a guest's kernel can read and write its worker",
		       d);
	}
	return 0;
}
