/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Event sets.  The host's events (Xid errors, clock changes) belong to the card, not to a
 * guest, so a guest's set never receives one: a set can be made, waited on (it times out) and
 * freed; registering a device for events answers NOT_SUPPORTED and no event type is offered,
 * as on a GPU without them.  nvidia-smi makes and frees a set before it shows anything.
 */
#include <stdlib.h>
#include <time.h>

#include "vn_nvml.h"

struct nvmlEventSet_st {
	unsigned magic;
};
#define EVENT_SET_MAGIC 0x76657473u /* "vets" */

nvmlReturn_t DECLDIR nvmlEventSetCreate(nvmlEventSet_t *set)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	if (!set)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct nvmlEventSet_st *s = malloc(sizeof *s);
	if (!s)
		return NVML_ERROR_MEMORY;
	s->magic = EVENT_SET_MAGIC;
	*set = s;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlEventSetFree(nvmlEventSet_t set)
{
	if (!set || set->magic != EVENT_SET_MAGIC)
		return NVML_ERROR_INVALID_ARGUMENT;
	set->magic = 0;
	free(set);
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	if (!vn_device(device) || !eventTypes)
		return NVML_ERROR_INVALID_ARGUMENT;
	*eventTypes = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	if (!vn_device(device) || !set || set->magic != EVENT_SET_MAGIC)
		return NVML_ERROR_INVALID_ARGUMENT;
	return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t DECLDIR nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	if (!set || set->magic != EVENT_SET_MAGIC || !data)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct timespec t = {timeoutms / 1000, (long)(timeoutms % 1000) * 1000000L};
	nanosleep(&t, NULL);
	return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t DECLDIR nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	return nvmlEventSetWait_v2(set, data, timeoutms);
}
