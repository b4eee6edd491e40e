/* SPDX-License-Identifier: Apache-2.0 */
/*
 * This process's connection to its host forwarder (connection.c): the region
 * mapped at cuInit, the claimed channel, the host's device snapshot, and the
 * sticky "lost" state once the host is gone.
 */
#ifndef VG_CONNECTION_H
#define VG_CONNECTION_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

#include "vg_wire.h"
#include "vmgpu/shm.h"

/* The documented, sticky result once the host forwarder is gone or broke the protocol. */
#define VG_ERROR_LOST CUDA_ERROR_DEVICE_UNAVAILABLE

/* Waits on the channel: a dead host is noticed by its heartbeat, not by this. */
#define VG_WAIT_FOREVER_NS (24ull * 3600 * 1000000000ull)

struct vg_connection {
	int ready;
	CUresult init_result;
	struct vmgpu_guest *guest;
	struct vmgpu_gchan *chan;
	struct vg_hello_rep hello;                /* the host's snapshot at cuInit */
	struct vg_dev_info dev[VG_MAX_DEVICES];   /* quota as total memory, attributes, PCI ids */
	uint64_t bulk_size;
	uint8_t *send_buf, *reply_buf;           /* one request and one reply, built and read in place */
	uint32_t send_cap, reply_cap;
};
extern struct vg_connection vg_conn;

CUresult vg_connect(void);     /* idempotent; cuInit */
CUresult vg_check_ready(void); /* CUDA_SUCCESS, or why no call can be made */
/* The host is gone or broke the protocol: say so once; every call returns VG_ERROR_LOST from now on. */
CUresult vg_lose(const char *what, int e);

void vg_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
CUresult vg_unsupported(const char *name, int *once);

extern const int vg_probed_driver_version;

#endif
