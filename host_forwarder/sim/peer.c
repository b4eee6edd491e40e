/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Peer access between the simulated GPUs, and peer copies.  Every pair of distinct GPUs has a
 * direct path unless VMGPU_SIM_NO_PEER_PATH is set (as GPUs under different PCIe root complexes
 * without NVLink): then cuDeviceCanAccessPeer says 0, enabling access is
 * CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, and peer copies still work, as the real driver stages them
 * through host memory.  Access is enabled per (current context's device, peer device), with the
 * driver's already-enabled and not-enabled answers.  Peer access is modelled on primary contexts
 * (the forwarder uses no other).
 */
#include "sim.h"

static int peer_path(void)
{
	return getenv("VMGPU_SIM_NO_PEER_PATH") == NULL;
}

static int valid_device(CUdevice d)
{
	return d >= 0 && d < sim_devices();
}

static unsigned char enabled[8][8]; /* [current context's device][peer's device], under sim_mu */

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
	if (!can) return CUDA_ERROR_INVALID_VALUE;
	if (!valid_device(dev) || !valid_device(peer)) return CUDA_ERROR_INVALID_DEVICE;
	*can = dev != peer && peer_path();
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attr, CUdevice src, CUdevice dst)
{
	if (!value) return CUDA_ERROR_INVALID_VALUE;
	if (!valid_device(src) || !valid_device(dst) || src == dst) return CUDA_ERROR_INVALID_DEVICE;
	switch (attr) {
	case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = 0; break;
	case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
	case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
	case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: *value = peer_path(); break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

/* The current context's device and the peer's, or an error. */
static CUresult pair(CUcontext peer, int *cur, int *other)
{
	if (!sim_current) return CUDA_ERROR_INVALID_CONTEXT;
	*cur = sim_ctx_device(sim_current);
	*other = sim_ctx_device(peer);
	if (*cur < 0 || *other < 0) return CUDA_ERROR_INVALID_CONTEXT;
	return *cur == *other ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	int cur, other;
	if (flags) return CUDA_ERROR_INVALID_VALUE;
	CUresult r = pair(peer, &cur, &other);
	if (r != CUDA_SUCCESS) return r;
	if (!peer_path()) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
	pthread_mutex_lock(&sim_mu);
	r = enabled[cur][other] ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
	enabled[cur][other] = 1;
	pthread_mutex_unlock(&sim_mu);
	return r;
}

EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer)
{
	int cur, other;
	CUresult r = pair(peer, &cur, &other);
	if (r != CUDA_SUCCESS) return r;
	pthread_mutex_lock(&sim_mu);
	r = enabled[cur][other] ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
	enabled[cur][other] = 0;
	pthread_mutex_unlock(&sim_mu);
	return r;
}

/* Both contexts must be contexts; both ranges inside one allocation each (the simulated memory
 * does not know GPUs apart: the forwarder checks which GPU each range is on). */
static CUresult peer_copy(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n)
{
	if (sim_ctx_device(dst_ctx) < 0 || sim_ctx_device(src_ctx) < 0) return CUDA_ERROR_INVALID_CONTEXT;
	if (!n) return CUDA_SUCCESS;
	uint8_t *d = sim_resolve(dst, n), *s = sim_resolve(src, n);
	if (!d || !s) return CUDA_ERROR_INVALID_VALUE;
	memmove(d, s, n);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n)
{
	return peer_copy(dst, dst_ctx, src, src_ctx, n);
}

EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
				  CUstream s)
{
	(void)s;
	return peer_copy(dst, dst_ctx, src, src_ctx, n);
}
