/* SPDX-License-Identifier: Apache-2.0 */
/*
 * How the guest's GPUs reach each other: P2P status between two of them (a GPU with itself
 * included, which NCCL asks), each GPU's NvLinks (state, version, capabilities, what is at the far
 * end) and the NvLink fields of nvmlDeviceGetFieldValues that NCCL's topology detection reads.
 * The host forwarder reads them from the host's NVML for the guest's own GPUs (VG_OP_NVML_QUERY,
 * nvml_query.c there) and answers with the host NVML's own return codes.  A handle that is not
 * one of the guest's GPUs is NVML_ERROR_INVALID_ARGUMENT, as the real library answers a bad
 * handle; a host without NVML makes all of these NVML_ERROR_NOT_SUPPORTED.
 */
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include "vn_nvml.h"

/* The checks every query starts with, then the host's answer in `l`; without the wiring from the
 * host (no NVML there), NOT_SUPPORTED. */
#define TOPOLOGY(h, d, out, l)                                      \
	LIVE(h, d, out, l);                                         \
	if (!l.has_topology)                                        \
		return NVML_ERROR_NOT_SUPPORTED

nvmlReturn_t DECLDIR nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, nvmlGpuP2PCapsIndex_t p2pIndex,
					    nvmlGpuP2PStatus_t *p2pStatus)
{
	struct nvmlDevice_st *peer = vn_device(device2);
	if (vn_ready() == NVML_SUCCESS && (!peer || (unsigned)p2pIndex >= VG_NVML_P2P_CAPS))
		return NVML_ERROR_INVALID_ARGUMENT;
	TOPOLOGY(device1, d, p2pStatus, l);
	const struct vg_nvml_p2p *p = &l.p2p[peer->index][p2pIndex];
	if (p->ret != NVML_SUCCESS)
		return (nvmlReturn_t)p->ret;
	*p2pStatus = (nvmlGpuP2PStatus_t)p->status;
	return NVML_SUCCESS;
}

/* Link `link` of the host's answer, or why not. */
static nvmlReturn_t link_of(const struct vg_nvml_live *l, unsigned link, const struct vg_nvml_link **k)
{
	if (link >= VG_NVML_MAX_LINKS)
		return NVML_ERROR_INVALID_ARGUMENT;
	*k = &l->links[link];
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
	TOPOLOGY(device, d, isActive, l);
	const struct vg_nvml_link *k;
	if ((r_ = link_of(&l, link, &k)) != NVML_SUCCESS)
		return r_;
	if (k->state_ret != NVML_SUCCESS)
		return (nvmlReturn_t)k->state_ret;
	*isActive = k->state ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
	TOPOLOGY(device, d, version, l);
	const struct vg_nvml_link *k;
	if ((r_ = link_of(&l, link, &k)) != NVML_SUCCESS)
		return r_;
	if (k->version_ret != NVML_SUCCESS)
		return (nvmlReturn_t)k->version_ret;
	*version = k->version;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
						   nvmlNvLinkCapability_t capability, unsigned int *capResult)
{
	TOPOLOGY(device, d, capResult, l);
	const struct vg_nvml_link *k;
	if ((r_ = link_of(&l, link, &k)) != NVML_SUCCESS)
		return r_;
	if ((unsigned)capability >= NVML_NVLINK_CAP_COUNT)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!(k->caps_known & (1u << capability)))
		return k->state_ret != NVML_SUCCESS ? (nvmlReturn_t)k->state_ret : NVML_ERROR_NOT_SUPPORTED;
	*capResult = (k->caps >> capability) & 1u;
	return NVML_SUCCESS;
}

/* What is at the far end of an active link, as the guest may know it: NVML_SUCCESS with the
 * remote named, or the answer.  The host names it only as one of the guest's GPUs or a switch;
 * anything else (a GPU outside the guest, a CPU) is NVML_ERROR_NOT_SUPPORTED, as NVML answers for
 * a link whose far end the driver cannot name.  NOT_SUPPORTED rather than a zeroed address:
 * NCCL skips a link whose far end it is not told, but takes a zeroed one for an NVSwitch that a
 * VM cannot see, which would count a link to someone else's GPU as a path to every GPU. */
static nvmlReturn_t remote_of(nvmlDevice_t device, unsigned link, const struct vg_nvml_link **k,
			      struct vg_nvml_live *l)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	struct nvmlDevice_st *d = vn_device(device);
	if (!d)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((r = vn_live(d, l)) != NVML_SUCCESS)
		return r;
	if (!l->has_topology)
		return NVML_ERROR_NOT_SUPPORTED;
	if ((r = link_of(l, link, k)) != NVML_SUCCESS)
		return r;
	if ((*k)->state_ret != NVML_SUCCESS)
		return (nvmlReturn_t)(*k)->state_ret;
	if ((*k)->remote_ret != NVML_SUCCESS)
		return (nvmlReturn_t)(*k)->remote_ret;
	if ((*k)->remote == VG_NVML_REMOTE_GUEST_GPU && (*k)->remote_dev < vn_ndev)
		return NVML_SUCCESS;
	return (*k)->remote == VG_NVML_REMOTE_SWITCH ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
	struct vg_nvml_live l;
	const struct vg_nvml_link *k;
	if (!pci)
		return vn_ready() != NVML_SUCCESS ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t r = remote_of(device, link, &k, &l);
	if (r != NVML_SUCCESS)
		return r;
	if (k->remote == VG_NVML_REMOTE_GUEST_GPU)
		return nvmlDeviceGetPciInfo_v3(&vn_dev[k->remote_dev], pci); /* as the guest knows that GPU */
	/* A switch: the host's switches are not devices of the guest, and their addresses are the
	 * host's.  The guest is given the address NCCL's topology takes for an NVSwitch it cannot
	 * see (as in a VM): with an empty one NCCL looked the switch up in the guest's sysfs, found
	 * no class there, and gave up ("Attribute tclass of node nvlink not found"). */
	memset(pci, 0, sizeof *pci);
	snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", VN_UNSEEN_SWITCH);
	snprintf(pci->busId, sizeof pci->busId, "%s", VN_UNSEEN_SWITCH);
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
	return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
							 nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
	struct vg_nvml_live l;
	const struct vg_nvml_link *k;
	if (!pNvLinkDeviceType)
		return vn_ready() != NVML_SUCCESS ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t r = remote_of(device, link, &k, &l);
	if (r != NVML_SUCCESS)
		return r;
	*pNvLinkDeviceType = k->remote == VG_NVML_REMOTE_SWITCH ? NVML_NVLINK_DEVICE_TYPE_SWITCH
								 : NVML_NVLINK_DEVICE_TYPE_GPU;
	return NVML_SUCCESS;
}

/* One field NCCL's topology detection reads, from the host's answer: NVML_SUCCESS or why not. */
static nvmlReturn_t field(const struct vg_nvml_live *l, nvmlFieldValue_t *v)
{
	const struct vg_nvml_link *k;
	nvmlReturn_t r;
	unsigned n = 0;
	v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
	switch (v->fieldId) {
	case NVML_FI_DEV_NVLINK_LINK_COUNT: /* the links present: those whose state the host can read */
		for (unsigned i = 0; i < VG_NVML_MAX_LINKS; i++)
			n += l->links[i].state_ret == NVML_SUCCESS;
		v->value.uiVal = n;
		return n ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
	case NVML_FI_DEV_NVLINK_GET_STATE:
		if ((r = link_of(l, v->scopeId, &k)) != NVML_SUCCESS || (r = (nvmlReturn_t)k->state_ret) != NVML_SUCCESS)
			return r;
		v->value.uiVal = k->state ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
		return NVML_SUCCESS;
	case NVML_FI_DEV_NVLINK_GET_VERSION:
		if ((r = link_of(l, v->scopeId, &k)) != NVML_SUCCESS ||
		    (r = (nvmlReturn_t)k->version_ret) != NVML_SUCCESS)
			return r;
		v->value.uiVal = k->version;
		return NVML_SUCCESS;
	default:
		return NVML_ERROR_NOT_SUPPORTED;
	}
}

nvmlReturn_t DECLDIR nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
	nvmlReturn_t r_ = vn_ready();
	if (r_ != NVML_SUCCESS)
		return r_;
	struct nvmlDevice_st *d = vn_device(device);
	if (!d || valuesCount < 0 || (valuesCount && !values))
		return NVML_ERROR_INVALID_ARGUMENT;
	struct vg_nvml_live l;
	nvmlReturn_t live = vn_live(d, &l);
	if (live == NVML_SUCCESS && !l.has_topology)
		live = NVML_ERROR_NOT_SUPPORTED;
	struct timeval tv;
	gettimeofday(&tv, NULL);
	for (int i = 0; i < valuesCount; i++) {
		nvmlFieldValue_t *v = &values[i];
		v->timestamp = (long long)tv.tv_sec * 1000000ll + tv.tv_usec;
		v->latencyUsec = 0;
		v->nvmlReturn = live != NVML_SUCCESS ? live : field(&l, v);
	}
	return NVML_SUCCESS;
}
