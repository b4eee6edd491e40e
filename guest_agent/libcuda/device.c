/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Devices, answered in the guest from the host's snapshot taken at cuInit (the
 * hello reply): count, names, UUIDs, PCI ids, attributes, and the guest's quota
 * as each device's total memory.  Nothing here crosses to the host.
 */
#include <stdio.h>
#include <string.h>

#include "connection.h"
#include "device.h"
#include "vg_guest_protos.h"

/* ---- initialisation and version -------------------------------------------------- */

CUresult handwritten_cuInit(unsigned int Flags, unsigned f)
{
	(void)f;
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	return vg_connect();
}

CUresult handwritten_cuDriverGetVersion(int *v, unsigned f)
{
	(void)f;
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = vg_conn.ready ? vg_conn.hello.driver_version : vg_probed_driver_version;
	return CUDA_SUCCESS;
}

/* ---- devices ---------------------------------------------------------------------- */

CUresult vg_device_valid(CUdevice d)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	return d >= 0 && (uint32_t)d < vg_conn.hello.ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult handwritten_cuDeviceGet(CUdevice *d, int ordinal, unsigned f)
{
	(void)f;
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_device_valid(ordinal);
	if (r == CUDA_SUCCESS)
		*d = ordinal;
	return r;
}

CUresult handwritten_cuDeviceGetCount(int *n, unsigned f)
{
	(void)f;
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_check_ready();
	if (r == CUDA_SUCCESS)
		*n = (int)vg_conn.hello.ndev;
	return r;
}

CUresult handwritten_cuDeviceGetName(char *name, int len, CUdevice d, unsigned f)
{
	(void)f;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_device_valid(d);
	if (r == CUDA_SUCCESS)
		snprintf(name, (size_t)len, "%.*s", (int)sizeof vg_conn.dev[d].name, vg_conn.dev[d].name);
	return r;
}

CUresult handwritten_cuDeviceGetUuid_v2(CUuuid *u, CUdevice d, unsigned f)
{
	(void)f;
	if (!u)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_device_valid(d);
	if (r == CUDA_SUCCESS)
		memcpy(u->bytes, vg_conn.dev[d].uuid, 16);
	return r;
}

CUresult handwritten_cuDeviceGetUuid(CUuuid *u, CUdevice d, unsigned f)
{
	return handwritten_cuDeviceGetUuid_v2(u, d, f);
}

CUresult handwritten_cuDeviceGetLuid(char *luid, unsigned int *mask, CUdevice d, unsigned f)
{
	(void)luid;
	(void)mask;
	(void)f;
	CUresult r = vg_device_valid(d);
	return r == CUDA_SUCCESS ? CUDA_ERROR_NOT_SUPPORTED : r; /* Windows only */
}

CUresult handwritten_cuDeviceTotalMem_v2(size_t *b, CUdevice d, unsigned f)
{
	(void)f;
	if (!b)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_device_valid(d);
	if (r == CUDA_SUCCESS)
		*b = vg_conn.dev[d].total_mem; /* the guest's quota, not the card */
	return r;
}

CUresult handwritten_cuDeviceTotalMem(unsigned int *b, CUdevice d, unsigned f)
{
	size_t v;
	if (!b)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = handwritten_cuDeviceTotalMem_v2(&v, d, f);
	if (r == CUDA_SUCCESS)
		*b = v > UINT32_MAX ? UINT32_MAX : (unsigned int)v;
	return r;
}

CUresult handwritten_cuDeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice d, unsigned f)
{
	(void)f;
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_device_valid(d);
	if (r != CUDA_SUCCESS)
		return r;
	if ((int)a <= 0 || (int)a >= vg_conn.dev[d].nattrs)
		return CUDA_ERROR_INVALID_VALUE;
	*pi = vg_conn.dev[d].attrs[a];
	return CUDA_SUCCESS;
}

CUresult handwritten_cuDeviceComputeCapability(int *major, int *minor, CUdevice d, unsigned f)
{
	(void)f;
	if (!major || !minor)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_device_valid(d);
	if (r == CUDA_SUCCESS) {
		*major = vg_conn.dev[d].attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
		*minor = vg_conn.dev[d].attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
	}
	return r;
}

CUresult handwritten_cuDeviceGetPCIBusId(char *id, int len, CUdevice d, unsigned f)
{
	(void)f;
	if (!id || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = vg_device_valid(d);
	if (r == CUDA_SUCCESS)
		snprintf(id, (size_t)len, "%08x:%02x:%02x.0", (unsigned)vg_conn.dev[d].pci_domain,
			 (unsigned)vg_conn.dev[d].pci_bus, (unsigned)vg_conn.dev[d].pci_device);
	return r;
}
