/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Initialisation, the system and the devices' fixed facts.  The devices are the guest's CUDA
 * devices, in the same order, with the same names, UUIDs and PCI addresses, read once at
 * nvmlInit from the guest's libcuda.so.1 (vmgpu's, which took them from the host at its own
 * start); total memory is the guest's quota.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vg_nvml_table.h"
#include "vn_nvml.h"

int vn_ndev;
struct nvmlDevice_st vn_dev[VG_MAX_DEVICES];

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int refs; /* nvmlInit calls not yet matched by nvmlShutdown */
static const struct vg_nvml_table *table;
static int cuda_version;

static void vn_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void vn_log(const char *fmt, ...)
{
	const char *e = getenv("VMGPU_NVML_LOG");
	if (e && !strcmp(e, "0"))
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "vmgpu-nvml: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

nvmlReturn_t vn_unserved(const char *name, int *logged)
{
	if (vn_ready() != NVML_SUCCESS)
		return NVML_ERROR_UNINITIALIZED; /* as the real library answers before nvmlInit */
	if (!__atomic_exchange_n(logged, 1, __ATOMIC_RELAXED))
		vn_log("%s is not supported in a vmgpu guest (NVML_ERROR_NOT_SUPPORTED)", name);
	return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t vn_copy_str(char *dst, unsigned length, const char *src)
{
	if (!dst)
		return NVML_ERROR_INVALID_ARGUMENT;
	size_t n = strlen(src);
	if (n >= length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(dst, src, n + 1);
	return NVML_SUCCESS;
}

nvmlReturn_t vn_ready(void)
{
	return __atomic_load_n(&refs, __ATOMIC_ACQUIRE) > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

struct nvmlDevice_st *vn_device(nvmlDevice_t h)
{
	for (int i = 0; i < vn_ndev; i++)
		if (h == &vn_dev[i])
			return h;
	return NULL;
}

nvmlReturn_t vn_live(const struct nvmlDevice_st *d, struct vg_nvml_live *out)
{
	CUresult r = table->live(d->index, out, sizeof *out);
	if (r == CUDA_SUCCESS)
		return NVML_SUCCESS;
	return r == CUDA_ERROR_DEVICE_UNAVAILABLE ? NVML_ERROR_GPU_IS_LOST : NVML_ERROR_UNKNOWN;
}

/* Read the devices from the guest's libcuda.so.1: NVML_SUCCESS, or why not (logged). */
static nvmlReturn_t load_devices(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		vn_log("no libcuda.so.1 (%s): is this a vmgpu guest?", dlerror());
		return NVML_ERROR_LIBRARY_NOT_FOUND;
	}
#define F(n) __typeof__(&n) p_##n = (__typeof__(&n))dlsym(h, #n)
	F(cuInit);
	F(cuDriverGetVersion);
	F(cuDeviceGetCount);
	F(cuDeviceGet);
	F(cuDeviceGetName);
	F(cuDeviceGetUuid_v2);
	F(cuDeviceGetAttribute);
	F(cuDeviceTotalMem_v2);
	F(cuGetExportTable);
#undef F
	static const CUuuid id = {VG_NVML_TABLE_UUID};
	const void *t = NULL;
	int n = 0;
	if (!p_cuInit || !p_cuGetExportTable || !p_cuDeviceGetCount || !p_cuDeviceGet || !p_cuDeviceGetName ||
	    !p_cuDeviceGetUuid_v2 || !p_cuDeviceGetAttribute || !p_cuDeviceTotalMem_v2 || !p_cuDriverGetVersion) {
		vn_log("libcuda.so.1 lacks the driver API");
		return NVML_ERROR_LIBRARY_NOT_FOUND;
	}
	if (p_cuInit(0) != CUDA_SUCCESS || p_cuGetExportTable(&t, &id) != CUDA_SUCCESS || !t ||
	    ((const struct vg_nvml_table *)t)->size < sizeof(struct vg_nvml_table)) {
		vn_log("no GPU through vmgpu here (libcuda.so.1 is not vmgpu's, or its host forwarder is not running)");
		return NVML_ERROR_DRIVER_NOT_LOADED;
	}
	p_cuDriverGetVersion(&cuda_version);
	if (p_cuDeviceGetCount(&n) != CUDA_SUCCESS)
		return NVML_ERROR_UNKNOWN;
	n = n < 0 ? 0 : n > VG_MAX_DEVICES ? VG_MAX_DEVICES : n;
	for (int i = 0; i < n; i++) {
		struct nvmlDevice_st *d = &vn_dev[i];
		CUdevice cd;
		CUuuid u;
		size_t total = 0;
		int dom = 0, bus = 0, dev = 0;
		memset(d, 0, sizeof *d);
		d->index = i;
		if (p_cuDeviceGet(&cd, i) != CUDA_SUCCESS || p_cuDeviceGetName(d->name, sizeof d->name, cd) != CUDA_SUCCESS ||
		    p_cuDeviceGetUuid_v2(&u, cd) != CUDA_SUCCESS || p_cuDeviceTotalMem_v2(&total, cd) != CUDA_SUCCESS)
			return NVML_ERROR_UNKNOWN;
		p_cuDeviceGetAttribute(&d->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cd);
		p_cuDeviceGetAttribute(&d->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cd);
		p_cuDeviceGetAttribute(&dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, cd);
		p_cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, cd);
		p_cuDeviceGetAttribute(&dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, cd);
		const unsigned char *b = (const unsigned char *)u.bytes;
		snprintf(d->uuid, sizeof d->uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
			 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
			 b[15]);
		d->domain = (unsigned)dom, d->bus = (unsigned)bus, d->device = (unsigned)dev;
		snprintf(d->bus_id, sizeof d->bus_id, "%08x:%02x:%02x.0", d->domain, d->bus, d->device);
		d->quota = total;
	}
	vn_ndev = n; /* only now: a start that failed half-way leaves nothing behind, and is tried again */
	table = t;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags)
{
	(void)flags;
	pthread_mutex_lock(&mu);
	nvmlReturn_t r = NVML_SUCCESS;
	if (refs == 0 && !table)
		r = load_devices();
	if (r == NVML_SUCCESS)
		__atomic_add_fetch(&refs, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t DECLDIR nvmlInit_v2(void)
{
	return nvmlInitWithFlags(0);
}

nvmlReturn_t DECLDIR nvmlInit(void)
{
	return nvmlInitWithFlags(0);
}

nvmlReturn_t DECLDIR nvmlShutdown(void)
{
	pthread_mutex_lock(&mu);
	nvmlReturn_t r = refs > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
	if (refs > 0)
		__atomic_sub_fetch(&refs, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&mu);
	return r;
}

const DECLDIR char *nvmlErrorString(nvmlReturn_t result)
{
	switch (result) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
	case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
	case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
	default: return "Unknown Error";
	}
}

/* ---- the system ------------------------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	struct vg_nvml_live l;
	if (vn_ndev > 0 && vn_live(&vn_dev[0], &l) == NVML_SUCCESS && (l.flags & VG_NVML_DRIVER))
		return vn_copy_str(version, length, l.driver_version);
	char v[32];
	snprintf(v, sizeof v, "%d.%d", cuda_version / 1000, cuda_version % 1000 / 10);
	return vn_copy_str(version, length, v);
}

nvmlReturn_t DECLDIR nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
	char v[64] = "";
	nvmlReturn_t r = nvmlSystemGetDriverVersion(v, sizeof v);
	if (r != NVML_SUCCESS)
		return r;
	char *last = strrchr(v, '.'); /* "580.159.04" -> "13.580.159" as NVML writes it: CUDA major first */
	if (last && strchr(v, '.') != last)
		*last = '\0';
	char out[96];
	snprintf(out, sizeof out, "%d.%s", cuda_version / 1000, v);
	return vn_copy_str(version, length, out);
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion(int *v)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	if (!v)
		return NVML_ERROR_INVALID_ARGUMENT;
	*v = cuda_version;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion_v2(int *v)
{
	return nvmlSystemGetCudaDriverVersion(v);
}

void vn_process_name(unsigned pid, char *out, size_t len)
{
	char path[64];
	out[0] = '\0';
	snprintf(path, sizeof path, "/proc/%u/comm", pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return;
	size_t n = fread(out, 1, len - 1, f);
	fclose(f);
	if (n > 0 && out[n - 1] == '\n')
		n--;
	out[n] = '\0';
	/* a process names itself (prctl, its file name): a control character in it, shown as it
	 * is, would forge a line of nvidia-smi's or a script's output; shown as '?', as ps does */
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)out[i] < 0x20 || out[i] == 0x7f)
			out[i] = '?';
}

nvmlReturn_t DECLDIR nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	if (!name || length == 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	char n[256];
	vn_process_name(pid, n, sizeof n);
	if (!n[0])
		return NVML_ERROR_NOT_FOUND;
	snprintf(name, length, "%s", n); /* NVML truncates a long name */
	return NVML_SUCCESS;
}

/* ---- the devices -------------------------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *count)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = (unsigned)vn_ndev;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount(unsigned int *count)
{
	return nvmlDeviceGetCount_v2(count);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	if (!device || index >= (unsigned)vn_ndev)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &vn_dev[index];
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
	return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	if (!uuid || !device)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (int i = 0; i < vn_ndev; i++)
		if (!strcmp(uuid, vn_dev[i].uuid)) {
			*device = &vn_dev[i];
			return NVML_SUCCESS;
		}
	return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	unsigned dom = 0, bus = 0, dev = 0, fn = 0;
	if (!pciBusId || !device)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (sscanf(pciBusId, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) {
		dom = 0; /* "bus:device.function" */
		if (sscanf(pciBusId, "%x:%x.%x", &bus, &dev, &fn) != 3)
			return NVML_ERROR_INVALID_ARGUMENT;
	}
	for (int i = 0; i < vn_ndev; i++)
		if (vn_dev[i].domain == dom && vn_dev[i].bus == bus && vn_dev[i].device == dev && fn == 0) {
			*device = &vn_dev[i];
			return NVML_SUCCESS;
		}
	return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
	return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* The checks every device query starts with. */
#define DEVICE(h, d, out)                                  \
	nvmlReturn_t r_ = vn_ready();                      \
	if (r_ != NVML_SUCCESS)                            \
		return r_;                                 \
	struct nvmlDevice_st *d = vn_device(h);            \
	if (!d || !(out))                                  \
		return NVML_ERROR_INVALID_ARGUMENT

nvmlReturn_t DECLDIR nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
	DEVICE(device, d, index);
	*index = (unsigned)d->index;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
	DEVICE(device, d, minorNumber);
	*minorNumber = (unsigned)d->index; /* the guest's /dev/nvidiaN would be numbered by its own GPUs */
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
	DEVICE(device, d, name);
	return vn_copy_str(name, length, d->name);
}

nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	DEVICE(device, d, uuid);
	return vn_copy_str(uuid, length, d->uuid);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
	DEVICE(device, d, major);
	if (!minor)
		return NVML_ERROR_INVALID_ARGUMENT;
	*major = d->cc_major;
	*minor = d->cc_minor;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	DEVICE(device, d, pci);
	struct vg_nvml_live l;
	memset(pci, 0, sizeof *pci);
	snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.0", d->domain, d->bus, d->device);
	snprintf(pci->busId, sizeof pci->busId, "%s", d->bus_id);
	pci->domain = d->domain, pci->bus = d->bus, pci->device = d->device;
	if (vn_live(d, &l) == NVML_SUCCESS && (l.flags & VG_NVML_PCI_IDS))
		pci->pciDeviceId = l.pci_device_id, pci->pciSubSystemId = l.pci_subsystem_id;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
	DEVICE(device, d, pci);
	if (pci->version != nvmlPciInfoExt_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	nvmlPciInfo_t p;
	nvmlReturn_t r = nvmlDeviceGetPciInfo_v3(device, &p);
	if (r != NVML_SUCCESS)
		return r;
	pci->domain = p.domain, pci->bus = p.bus, pci->device = p.device;
	pci->pciDeviceId = p.pciDeviceId, pci->pciSubSystemId = p.pciSubSystemId;
	pci->baseClass = 3, pci->subClass = 2; /* a 3D controller, as a data-center GPU is */
	snprintf(pci->busId, sizeof pci->busId, "%s", p.busId);
	return NVML_SUCCESS;
}

/* Facts of how the guest's GPU is set up: no MIG, no display, not virtualised from its point of view. */
nvmlReturn_t DECLDIR nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
	DEVICE(device, d, currentMode);
	if (!pendingMode)
		return NVML_ERROR_INVALID_ARGUMENT;
	*currentMode = *pendingMode = NVML_DEVICE_MIG_DISABLE;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
	DEVICE(device, d, count);
	*count = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
	DEVICE(device, d, isMigDevice);
	*isMigDevice = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t *isActive)
{
	DEVICE(device, d, isActive);
	*isActive = NVML_FEATURE_DISABLED;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *display)
{
	DEVICE(device, d, display);
	*display = NVML_FEATURE_DISABLED;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetVirtualizationMode(nvmlDevice_t device, nvmlGpuVirtualizationMode_t *mode)
{
	DEVICE(device, d, mode);
	*mode = NVML_GPU_VIRTUALIZATION_MODE_NONE;
	return NVML_SUCCESS;
}
