/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The simulated backend's NVML: the few calls of the host's libnvidia-ml.so.1 that tell how the
 * simulated GPUs are wired, by their real names and signatures, so that the forwarder reads them
 * from this library (host_nvml.c) exactly as it reads the host's NVML on a GPU host.  Nothing
 * else of NVML is here: the card's readings (temperature, power, ...) stay unavailable.
 *
 * The wiring, set by the environment:
 *   VMGPU_SIM_NVLINK=N     GPUs 2k and 2k+1 are joined by N NvLinks (links 0..N-1 of each), as
 *                          NVLink-bridged PCIe cards; a last odd GPU has none.
 *   VMGPU_SIM_NVSWITCH=N   every GPU's links 0..N-1 lead to NVSwitches, as on an HGX board (it
 *                          wins over VMGPU_SIM_NVLINK).
 *   neither                no NvLink: every link answers NVML_ERROR_NOT_SUPPORTED, as a PCIe card.
 * P2P over PCI between distinct GPUs is OK unless VMGPU_SIM_NO_PEER_PATH is set (as sim/peer.c).
 * A GPU's handle is a pointer into sim_nvml_dev[]; any other is NVML_ERROR_INVALID_ARGUMENT.
 */
#include <stdio.h>

#include "sim.h"

/* nvml.h's values, by their documented numbers (nvml.h is not needed to build the backend) */
enum {
	NV_SUCCESS = 0,
	NV_INVALID_ARGUMENT = 2,
	NV_NOT_SUPPORTED = 3,
	NV_NOT_FOUND = 6,
	NV_MAX_LINKS = 18,
	NV_P2P_OK = 0,
	NV_P2P_CHIPSET_NOT_SUPPORTED = 1,
	NV_P2P_NOT_SUPPORTED = 5,
	NV_P2P_UNKNOWN = 6,
	NV_CAPS_INDEX_NVLINK = 2,
	NV_CAPS_INDEX_UNKNOWN = 5,
	NV_LINK_CAP_COUNT = 6,
	NV_DEVICE_TYPE_GPU = 0,
	NV_DEVICE_TYPE_SWITCH = 2,
	NV_NVLINK_VERSION_4_0 = 6,
};

/* nvmlPciInfo_t */
struct sim_pci {
	char legacy[16];
	unsigned domain, bus, device, device_id, subsystem_id;
	char bus_id[32];
};

static char sim_nvml_dev[8];

static int knob(const char *name)
{
	const char *e = getenv(name);
	int n = e ? atoi(e) : 0;
	return n < 0 ? 0 : n > NV_MAX_LINKS ? NV_MAX_LINKS : n;
}

/* The GPU a handle names, or -1. */
static int gpu(const void *h)
{
	const char *p = h;
	return p >= sim_nvml_dev && p < sim_nvml_dev + sim_devices() ? (int)(p - sim_nvml_dev) : -1;
}

/* Whether link l of GPU d exists (NvLink present there), and what is at its far end: a switch,
 * or the GPU *peer. */
static int link_of(int d, unsigned l, int *to_switch, int *peer)
{
	int sw = knob("VMGPU_SIM_NVSWITCH"), pairs = knob("VMGPU_SIM_NVLINK");
	*to_switch = sw > 0;
	*peer = d ^ 1;
	if (sw)
		return l < (unsigned)sw;
	return pairs && l < (unsigned)pairs && *peer < sim_devices();
}

EXPORT int nvmlInit_v2(void)
{
	return NV_SUCCESS;
}

EXPORT int nvmlDeviceGetHandleByUUID(const char *uuid, void **h)
{
	if (!uuid || !h)
		return NV_INVALID_ARGUMENT;
	for (int d = 0; d < sim_devices(); d++) {
		CUuuid u;
		char s[64];
		cuDeviceGetUuid_v2(&u, d);
		const unsigned char *b = (const unsigned char *)u.bytes;
		snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
			 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
		if (!strcmp(s, uuid)) {
			*h = &sim_nvml_dev[d];
			return NV_SUCCESS;
		}
	}
	return NV_NOT_FOUND;
}

EXPORT int nvmlDeviceGetP2PStatus(void *h1, void *h2, int index, int *status)
{
	int a = gpu(h1), b = gpu(h2), sw, peer;
	if (a < 0 || b < 0 || !status || index < 0 || index > NV_CAPS_INDEX_UNKNOWN)
		return NV_INVALID_ARGUMENT;
	if (index == NV_CAPS_INDEX_UNKNOWN)
		*status = NV_P2P_UNKNOWN;
	else if (a == b)
		*status = NV_P2P_OK; /* a GPU reaches its own memory */
	else if (index == NV_CAPS_INDEX_NVLINK)
		*status = link_of(a, 0, &sw, &peer) && (sw || peer == b) ? NV_P2P_OK : NV_P2P_NOT_SUPPORTED;
	else
		*status = getenv("VMGPU_SIM_NO_PEER_PATH") ? NV_P2P_CHIPSET_NOT_SUPPORTED : NV_P2P_OK;
	return NV_SUCCESS;
}

/* The checks every link query starts with: NV_SUCCESS with the link's far end, or the answer. */
static int link_query(void *h, unsigned l, const void *out, int *to_switch, int *peer)
{
	int d = gpu(h);
	if (d < 0 || !out || l >= NV_MAX_LINKS)
		return NV_INVALID_ARGUMENT;
	return link_of(d, l, to_switch, peer) ? NV_SUCCESS : NV_NOT_SUPPORTED;
}

EXPORT int nvmlDeviceGetNvLinkState(void *h, unsigned l, int *active)
{
	int sw, peer, r = link_query(h, l, active, &sw, &peer);
	if (r == NV_SUCCESS)
		*active = 1;
	return r;
}

EXPORT int nvmlDeviceGetNvLinkVersion(void *h, unsigned l, unsigned *version)
{
	int sw, peer, r = link_query(h, l, version, &sw, &peer);
	if (r == NV_SUCCESS)
		*version = NV_NVLINK_VERSION_4_0;
	return r;
}

/* P2P and P2P atomics over the link, and the link valid; no system memory, no SLI. */
EXPORT int nvmlDeviceGetNvLinkCapability(void *h, unsigned l, int cap, unsigned *result)
{
	int sw, peer, r = link_query(h, l, result, &sw, &peer);
	if (r != NV_SUCCESS)
		return r;
	if (cap < 0 || cap >= NV_LINK_CAP_COUNT)
		return NV_INVALID_ARGUMENT;
	*result = cap == 0 || cap == 2 || cap == 5;
	return NV_SUCCESS;
}

EXPORT int nvmlDeviceGetNvLinkRemoteDeviceType(void *h, unsigned l, int *type)
{
	int sw, peer, r = link_query(h, l, type, &sw, &peer);
	if (r == NV_SUCCESS)
		*type = sw ? NV_DEVICE_TYPE_SWITCH : NV_DEVICE_TYPE_GPU;
	return r;
}

/* A peer GPU by its PCI address (bus 0x42 + ordinal, as cuDeviceGetAttribute says); a switch at
 * bus 0x80 + link / 6. */
EXPORT int nvmlDeviceGetNvLinkRemotePciInfo_v2(void *h, unsigned l, struct sim_pci *pci)
{
	int sw, peer, r = link_query(h, l, pci, &sw, &peer);
	if (r != NV_SUCCESS)
		return r;
	memset(pci, 0, sizeof *pci);
	pci->bus = sw ? 0x80 + l / 6 : 0x42 + (unsigned)peer;
	pci->device_id = sw ? 0x22a310de : 0x233510de;
	snprintf(pci->bus_id, sizeof pci->bus_id, "00000000:%02x:00.0", pci->bus);
	snprintf(pci->legacy, sizeof pci->legacy, "0000:%02x:00.0", pci->bus);
	return NV_SUCCESS;
}
