/* SPDX-License-Identifier: Apache-2.0 */
/*
 * VMM handles shared between the processes of one guest as file descriptors (NCCL's cuMem path:
 * cuMemExportToShareableHandle in one process, the descriptor passed over a Unix socket, then
 * cuMemImportFromShareableHandle in another).  The guest never holds the driver's descriptor (it
 * stays on the host, host_forwarder/native/ipc.c): an export answers an opaque handle of 64 bytes,
 * which this library puts in a file of the process's own, a sealed memfd, and gives the program
 * that file's descriptor.  An import reads the handle back from the descriptor it is given and
 * asks the host, which opens it only for a process of the same guest.  Anything could be in a
 * file a program names: the host checks what it reads, and a file of the wrong size opens nothing.
 * Fabric handles are refused, as on a GPU without them.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "call.h"
#include "connection.h"
#include "vg_guest_protos.h"

#define SHARE_BYTES 64 /* the host's opaque handle */

/* The handle types this library can be asked for: a descriptor, or what it refuses as the driver
 * on a GPU without it does. */
static CUresult type_check(CUmemAllocationHandleType type)
{
	if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_SUCCESS;
	return type == CU_MEM_HANDLE_TYPE_FABRIC ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
}

/* A sealed memfd holding the handle: the program may pass it on, but nobody can change it. */
static int share_file(const unsigned char *h)
{
	int fd = memfd_create("vmgpu-vmm-handle", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -1;
	if (pwrite(fd, h, SHARE_BYTES, 0) != SHARE_BYTES ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

CUresult handwritten_cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
						  CUmemAllocationHandleType handleType, unsigned long long flags,
						  unsigned fl)
{
	CUresult r = type_check(handleType);
	if (r != CUDA_SUCCESS)
		return r;
	if (!shareableHandle || flags)
		return CUDA_ERROR_INVALID_VALUE;
	struct vg_call c;
	if ((r = vg_begin(&c, VG_OP_cuMemExportToShareableHandle, fl)) != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, handle);
	vg_put_u64(&c, (uint64_t)handleType);
	vg_put_u64(&c, flags);
	unsigned char h[SHARE_BYTES];
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		vg_get(&c, h, sizeof h);
		if (c.bad)
			r = CUDA_ERROR_UNKNOWN;
	}
	if ((r = vg_end(&c, r)) != CUDA_SUCCESS)
		return r;
	int fd = share_file(h);
	if (fd < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	memcpy(shareableHandle, &fd, sizeof fd);
	return CUDA_SUCCESS;
}

CUresult handwritten_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
						    CUmemAllocationHandleType shHandleType, unsigned fl)
{
	CUresult r = type_check(shHandleType);
	if (r != CUDA_SUCCESS)
		return r;
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	/* the descriptor travels as the pointer's value, as the driver takes it */
	int fd = (int)(intptr_t)osHandle;
	unsigned char h[SHARE_BYTES + 1];
	if (fd < 0 || pread(fd, h, sizeof h, 0) != SHARE_BYTES)
		return CUDA_ERROR_INVALID_VALUE; /* not a handle this library made */
	struct vg_call c;
	if ((r = vg_begin(&c, VG_OP_cuMemImportFromShareableHandle, fl)) != CUDA_SUCCESS)
		return r;
	vg_put_u64(&c, (uint64_t)shHandleType);
	vg_put(&c, h, SHARE_BYTES);
	r = vg_call_sync(&c);
	if (r == CUDA_SUCCESS) {
		uint64_t v = vg_get_u64(&c);
		if (c.bad)
			r = CUDA_ERROR_UNKNOWN;
		else
			*handle = v;
	}
	return vg_end(&c, r);
}

/*
 * Multicast objects (cuMulticast*) are not offered to guests: a guest is told
 * CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED 0 (host_forwarder/native/devices.c), and every call
 * answers as the driver does on a GPU without multicast, CUDA_ERROR_NOT_SUPPORTED, after the
 * argument checks that come first.  Nothing crosses to the host.  Frameworks that probe (XLA asks
 * cuMulticastGetGranularity at start; NCCL's NVLS) take their fallback.
 */
/* Ready first (CUDA_ERROR_NOT_INITIALIZED before cuInit, the lost-host error after a loss), then the
 * call's argument checks (bad: CUDA_ERROR_INVALID_VALUE), then the refusal. */
static CUresult multicast_refused(const char *call, int bad)
{
	static int said;
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	if (bad)
		return CUDA_ERROR_INVALID_VALUE;
	if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
		vg_log("%s: multicast objects are not offered to guests (as on a GPU without multicast): "
		       "CUDA_ERROR_NOT_SUPPORTED",
		       call);
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult handwritten_cuMulticastGetGranularity(size_t *granularity, const CUmulticastObjectProp *prop,
					       CUmulticastGranularity_flags option, unsigned fl)
{
	(void)fl;
	return multicast_refused("cuMulticastGetGranularity",
				 !granularity || !prop ||
					 (option != CU_MULTICAST_GRANULARITY_MINIMUM &&
					  option != CU_MULTICAST_GRANULARITY_RECOMMENDED));
}

CUresult handwritten_cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop,
				       unsigned fl)
{
	(void)fl;
	return multicast_refused("cuMulticastCreate", !mcHandle || !prop);
}

/* No multicast object can exist here, so every handle these are given names none. */
CUresult handwritten_cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev, unsigned fl)
{
	(void)mcHandle, (void)dev, (void)fl;
	return multicast_refused("cuMulticastAddDevice", 0);
}

CUresult handwritten_cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
					CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
					unsigned long long flags, unsigned fl)
{
	(void)mcHandle, (void)mcOffset, (void)memHandle, (void)memOffset, (void)size, (void)flags, (void)fl;
	return multicast_refused("cuMulticastBindMem", 0);
}

CUresult handwritten_cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUdeviceptr memptr,
					 size_t size, unsigned long long flags, unsigned fl)
{
	(void)mcHandle, (void)mcOffset, (void)memptr, (void)size, (void)flags, (void)fl;
	return multicast_refused("cuMulticastBindAddr", 0);
}

CUresult handwritten_cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
				       size_t size, unsigned fl)
{
	(void)mcHandle, (void)dev, (void)mcOffset, (void)size, (void)fl;
	return multicast_refused("cuMulticastUnbind", 0);
}
