/* SPDX-License-Identifier: Apache-2.0 */
/* Devices from the host's snapshot (device.c). */
#ifndef VG_DEVICE_H
#define VG_DEVICE_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

/* CUDA_SUCCESS if the library is connected and d is one of the guest's devices. */
CUresult vg_device_valid(CUdevice d);

#endif
