/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The guest's libnvidia-ml.so.1: NVML showing the guest its own slice of each GPU.
 *
 * Every function the real library exports is here: the ones in nvml_api.toml written by hand
 * (nvml_system.c: initialisation, the devices and their fixed facts, taken once from the
 * guest's libcuda.so.1; nvml_live.c: memory, processes, utilization and the card's readings,
 * asked of the host forwarder at each call; nvml_smi.c: the table nvidia-smi asks for), the
 * rest generated (generated/nvml_unserved.c: NVML_ERROR_NOT_SUPPORTED, the name logged once).
 */
#ifndef VN_NVML_H
#define VN_NVML_H

#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>
#include <stddef.h>

#include "vg_wire.h"

/* The PCI address NCCL's topology takes for an NVSwitch it cannot see: what a guest is told of
 * the far end of a link to one of the host's switches (nvml_topology.c). */
#define VN_UNSEEN_SWITCH "fffffff:ffff:ff"

/* A GPU as the guest sees it: the CUDA device with the same ordinal. */
struct nvmlDevice_st {
	int index;
	char name[256];
	char uuid[96];       /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
	char bus_id[32];     /* "00000000:00:06.0" */
	unsigned domain, bus, device;
	int cc_major, cc_minor;
	unsigned long long quota;
};

extern int vn_ndev;
extern struct nvmlDevice_st vn_dev[VG_MAX_DEVICES];

/* NVML_SUCCESS if nvmlInit has been called (and not undone); NVML_ERROR_UNINITIALIZED otherwise. */
nvmlReturn_t vn_ready(void);
/* The device a handle names, or NULL (not one of ours: never dereferenced). */
struct nvmlDevice_st *vn_device(nvmlDevice_t h);
/* Ask the host what the guest's NVML shows of device d now. */
nvmlReturn_t vn_live(const struct nvmlDevice_st *d, struct vg_nvml_live *out);
/* The checks every live query starts with (nvmlInit called, `h` one of the guest's GPUs, `out`
 * given), then the host's answer in `l`; any failure returned from the calling function. */
#define LIVE(h, d, out, l)                                          \
	nvmlReturn_t r_ = vn_ready();                               \
	if (r_ != NVML_SUCCESS)                                     \
		return r_;                                          \
	struct nvmlDevice_st *d = vn_device(h);                     \
	if (!d || !(out))                                           \
		return NVML_ERROR_INVALID_ARGUMENT;                 \
	struct vg_nvml_live l;                                      \
	if ((r_ = vn_live(d, &l)) != NVML_SUCCESS)                  \
		return r_
/* A function not served: NVML_ERROR_NOT_SUPPORTED, its name logged once (VMGPU_NVML_LOG=0: silent). */
nvmlReturn_t vn_unserved(const char *name, int *logged);
/* Copy a string into a caller's buffer of `length` bytes: NVML_ERROR_INSUFFICIENT_SIZE if it does not fit. */
nvmlReturn_t vn_copy_str(char *dst, unsigned length, const char *src);
/* The guest's own name for a process (its /proc), "" where it cannot be read; control
 * characters in it are '?'. */
void vn_process_name(unsigned pid, char *out, size_t len);

#endif
