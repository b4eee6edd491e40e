/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The table nvidia-smi asks of NVML before anything else (nvmlInternalGetExportTable, table
 * c4fe3e6c-c98f-6c4e-a327-ee696e12f7c4): without it nvidia-smi stops with "Mismatch in versions
 * between nvidia-smi and NVML".  Its layout is not published; what is here was observed on the
 * GPU host (driver 580.159.04, tools/nvml_trace/probe_tables.sh): 270 slots, of which nvidia-smi
 * calls
 *   26   with each line it prints: (log format, stream name "stdout"/"stderr", text, ...); it
 *        prints the line itself, so this only logs it where NVML's debug log is on: nothing here
 *   81   for a device's short PCI address: (index, buffer, length, ...) -> "0000:00:06.0"
 *   213  for a device's compute processes: (device, unsigned *count in/out, entries, ...);
 *        an entry is 4128 bytes: pid (u32) at 0, memory used (u64) at 8, two ids at 16 and 24
 *        (-1 and 0 when there is no MIG), the process name at 32
 *   214, 215  the same for graphics and other processes (none through vmgpu).
 * Every other slot answers NVML_ERROR_NOT_SUPPORTED, which nvidia-smi shows as "N/A".
 */
#include <stdio.h>
#include <string.h>

#include "vn_nvml.h"

#define SMI_SLOTS 270
#define SMI_ENTRY 4128

static const unsigned char smi_uuid[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
					   0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};

static nvmlReturn_t smi_not_supported(void)
{
	return NVML_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t smi_log_line(void)
{
	return NVML_SUCCESS;
}

static nvmlReturn_t smi_bus_id(unsigned index, char *buf, unsigned len)
{
	nvmlReturn_t r = vn_ready();
	if (r != NVML_SUCCESS)
		return r;
	if (index >= (unsigned)vn_ndev || !buf)
		return NVML_ERROR_INVALID_ARGUMENT;
	char s[32];
	snprintf(s, sizeof s, "%04x:%02x:%02x.0", vn_dev[index].domain & 0xffff, vn_dev[index].bus, vn_dev[index].device);
	return vn_copy_str(buf, len, s);
}

static nvmlReturn_t smi_compute_processes(nvmlDevice_t device, unsigned *count, unsigned char *entries)
{
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned cap = *count, n = VG_NVML_MAX_PROCS;
	nvmlProcessInfo_t p[VG_NVML_MAX_PROCS];
	nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses_v3(device, &n, p);
	if (r != NVML_SUCCESS)
		return r;
	*count = n;
	if (n > cap || (n && !entries))
		return NVML_ERROR_INSUFFICIENT_SIZE;
	for (unsigned i = 0; i < n && i < cap; i++) {
		unsigned char *e = entries + (size_t)i * SMI_ENTRY;
		unsigned long long no_gi = ~0ull, no_ci = 0;
		memset(e, 0, SMI_ENTRY);
		memcpy(e, &p[i].pid, 4);
		memcpy(e + 8, &p[i].usedGpuMemory, 8);
		memcpy(e + 16, &no_gi, 8);
		memcpy(e + 24, &no_ci, 8);
		vn_process_name(p[i].pid, (char *)e + 32, SMI_ENTRY - 32);
		if (!e[32])
			e[32] = '-';
	}
	*count = n;
	return NVML_SUCCESS;
}

static nvmlReturn_t smi_no_processes(nvmlDevice_t device, unsigned *count)
{
	if (!vn_device(device) || !count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = 0;
	return NVML_SUCCESS;
}

static const void *smi_table[SMI_SLOTS];

nvmlReturn_t nvmlInternalGetExportTable(const void **table, const unsigned char *uuid);
nvmlReturn_t nvmlInternalGetExportTable(const void **table, const unsigned char *uuid)
{
	if (!table || !uuid)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (memcmp(uuid, smi_uuid, sizeof smi_uuid)) {
		*table = NULL;
		return NVML_ERROR_NOT_SUPPORTED;
	}
	if (!smi_table[0]) { /* filled once; racing fillers write the same values */
		for (int i = 1; i < SMI_SLOTS; i++)
			smi_table[i] = (const void *)smi_not_supported;
		smi_table[26] = (const void *)smi_log_line;
		smi_table[81] = (const void *)smi_bus_id;
		smi_table[213] = (const void *)smi_compute_processes;
		smi_table[214] = (const void *)smi_no_processes;
		smi_table[215] = (const void *)smi_no_processes;
		__atomic_store_n(&smi_table[0], (const void *)(uintptr_t)(SMI_SLOTS * sizeof(void *)), __ATOMIC_RELEASE);
	}
	*table = smi_table;
	return NVML_SUCCESS;
}
