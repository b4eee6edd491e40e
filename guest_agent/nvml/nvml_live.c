/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What changes: the guest's memory and processes on a GPU, the share of its time the guest
 * used, and the card's readings.  Each call asks the host forwarder (VG_OP_NVML_QUERY), which
 * answers for this guest alone (memory from its charges, processes from its channel table); a
 * reading the host cannot give is NVML_ERROR_NOT_SUPPORTED, as on a card without it.
 */
#include <string.h>

#include "vn_nvml.h"

/* ---- memory --------------------------------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	LIVE(device, d, memory, l);
	unsigned long long used = l.used < l.quota ? l.used : l.quota;
	memory->total = l.quota;
	memory->used = used;
	memory->free = l.quota - used;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	if (memory && memory->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	LIVE(device, d, memory, l);
	unsigned long long used = l.used < l.quota ? l.used : l.quota;
	memory->total = l.quota;
	memory->reserved = 0; /* what the driver keeps is the host's, outside the guest's quota */
	memory->used = used;
	memory->free = l.quota - used;
	return NVML_SUCCESS;
}

/* ---- processes ---------------------------------------------------------------------------- */

/* The guest's processes holding memory on the GPU, in any of NVML's three layouts: fill up to
 * *count, set *count to how many there are; NVML_ERROR_INSUFFICIENT_SIZE if they do not fit. */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, size_t size, int layout)
{
	LIVE(device, d, count, l);
	unsigned cap = *count;
	*count = l.nprocs;
	if (l.nprocs > cap)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	if (l.nprocs && !infos)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (unsigned i = 0; i < l.nprocs; i++) {
		char *p = (char *)infos + i * size;
		if (layout == 1) {
			nvmlProcessInfo_v1_t v = {l.procs[i].pid, l.procs[i].bytes};
			memcpy(p, &v, sizeof v);
		} else {
			nvmlProcessInfo_t v = {l.procs[i].pid, l.procs[i].bytes, 0xFFFFFFFFu, 0xFFFFFFFFu};
			memcpy(p, &v, sizeof v);
		}
	}
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
							    nvmlProcessInfo_t *infos)
{
	return processes(device, infoCount, infos, sizeof *infos, 3);
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
							    nvmlProcessInfo_v2_t *infos)
{
	return processes(device, infoCount, infos, sizeof *infos, 2);
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
							 nvmlProcessInfo_v1_t *infos)
{
	return processes(device, infoCount, infos, sizeof *infos, 1);
}

/* No graphics and no MPS clients through vmgpu: every guest process is a compute process. */
static nvmlReturn_t none(nvmlDevice_t device, unsigned int *count)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	if (!vn_device(device) || !count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = 0;
	return NVML_SUCCESS;
}

#define NONE(name, type)                                                                  \
	nvmlReturn_t DECLDIR name(nvmlDevice_t device, unsigned int *infoCount, type *infos) \
	{                                                                                 \
		(void)infos;                                                              \
		return none(device, infoCount);                                           \
	}
NONE(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
NONE(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t)
NONE(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
NONE(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)
NONE(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t)
NONE(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t)

/* ---- the share of the GPU's time, and the card's readings ---------------------------------- */

#define READING(flag)                        \
	if (!(l.flags & (flag)))             \
		return NVML_ERROR_NOT_SUPPORTED

nvmlReturn_t DECLDIR nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
	LIVE(device, d, utilization, l);
	READING(VG_NVML_UTIL);
	utilization->gpu = l.util_gpu;
	utilization->memory = l.util_mem;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
					      unsigned int *temp)
{
	LIVE(device, d, temp, l);
	if (sensorType != NVML_TEMPERATURE_GPU)
		return NVML_ERROR_INVALID_ARGUMENT;
	READING(VG_NVML_TEMP);
	*temp = l.temp_c;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
	if (temperature && temperature->version != nvmlTemperature_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	LIVE(device, d, temperature, l);
	if (temperature->sensorType != NVML_TEMPERATURE_GPU)
		return NVML_ERROR_INVALID_ARGUMENT;
	READING(VG_NVML_TEMP);
	temperature->temperature = (int)l.temp_c;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
	LIVE(device, d, speed, l);
	READING(VG_NVML_FAN);
	*speed = l.fan_pct;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState)
{
	LIVE(device, d, pState, l);
	READING(VG_NVML_PSTATE);
	*pState = (nvmlPstates_t)l.pstate;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *pState)
{
	return nvmlDeviceGetPerformanceState(device, pState);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
	LIVE(device, d, power, l);
	READING(VG_NVML_POWER);
	*power = l.power_mw;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
	LIVE(device, d, limit, l);
	READING(VG_NVML_POWER_LIMIT);
	*limit = l.power_limit_mw;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
	return nvmlDeviceGetEnforcedPowerLimit(device, limit);
}

nvmlReturn_t DECLDIR nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
	LIVE(device, d, clock, l);
	if ((unsigned)type >= 4)
		return NVML_ERROR_INVALID_ARGUMENT;
	READING(VG_NVML_CLOCKS);
	*clock = l.clock_mhz[type];
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
	LIVE(device, d, clock, l);
	if ((unsigned)type >= 4)
		return NVML_ERROR_INVALID_ARGUMENT;
	READING(VG_NVML_MAX_CLOCKS);
	*clock = l.max_clock_mhz[type];
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
	LIVE(device, d, current, l);
	if (!pending)
		return NVML_ERROR_INVALID_ARGUMENT;
	READING(VG_NVML_ECC);
	*current = (nvmlEnableState_t)l.ecc_current;
	*pending = (nvmlEnableState_t)l.ecc_pending;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
	LIVE(device, d, mode, l);
	READING(VG_NVML_COMPUTE_MODE);
	*mode = (nvmlComputeMode_t)l.compute_mode;
	return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
	LIVE(device, d, mode, l);
	READING(VG_NVML_PERSISTENCE);
	*mode = (nvmlEnableState_t)l.persistence;
	return NVML_SUCCESS;
}
