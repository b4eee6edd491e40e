/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmgpu-smi: what this guest has of the GPU, as the guest sees it, through the guest's NVML
 * (vmgpu's libnvidia-ml.so.1, so through the host forwarder): per GPU its quota, used and free
 * memory, and the guest processes holding memory on it.  The options people script against
 * nvidia-smi with work the same way:
 *
 *   vmgpu-smi [--json]
 *   vmgpu-smi -L
 *   vmgpu-smi --query-gpu=FIELD,... [--format=csv[,noheader][,nounits]]
 *   vmgpu-smi --query-compute-apps=FIELD,... [--format=csv[,noheader][,nounits]]
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROCS 64

struct gpu {
	unsigned index;
	nvmlDevice_t h;
	char name[96], uuid[96];
	nvmlPciInfo_t pci;
	nvmlMemory_t mem;
	nvmlProcessInfo_t procs[MAX_PROCS];
	unsigned nprocs;
};

static int noheader, nounits;

/* A value as nvidia-smi prints it: "[N/A]" where NVML does not have it. */
static void put(const char *sep, int ok, const char *unit, const char *fmt, double v)
{
	printf("%s", sep);
	if (!ok) {
		printf("[N/A]");
		return;
	}
	printf(fmt, v);
	if (!nounits && unit)
		printf(" %s", unit);
}

/* Text as csv has it: in double quotes (a quote doubled) where it holds a comma or a quote, so
 * that a name with a comma stays one column. */
static void put_text(const char *sep, const char *s)
{
	printf("%s", sep);
	if (!strpbrk(s, ",\"")) {
		printf("%s", s);
		return;
	}
	putchar('"');
	for (; *s; s++)
		printf(*s == '"' ? "\"\"" : "%c", *s);
	putchar('"');
}

static int gpu_field(const struct gpu *g, const char *f, const char *sep)
{
	unsigned u = 0, clock = 0;
	nvmlUtilization_t util;
	if (!strcmp(f, "index"))
		printf("%s%u", sep, g->index);
	else if (!strcmp(f, "name") || !strcmp(f, "gpu_name"))
		put_text(sep, g->name);
	else if (!strcmp(f, "uuid") || !strcmp(f, "gpu_uuid"))
		put_text(sep, g->uuid);
	else if (!strcmp(f, "pci.bus_id") || !strcmp(f, "gpu_bus_id"))
		put_text(sep, g->pci.busId);
	else if (!strcmp(f, "memory.total"))
		put(sep, 1, "MiB", "%.0f", (double)(g->mem.total >> 20));
	else if (!strcmp(f, "memory.used"))
		put(sep, 1, "MiB", "%.0f", (double)(g->mem.used >> 20));
	else if (!strcmp(f, "memory.free"))
		put(sep, 1, "MiB", "%.0f", (double)(g->mem.free >> 20));
	else if (!strcmp(f, "utilization.gpu") || !strcmp(f, "utilization.memory")) {
		int ok = nvmlDeviceGetUtilizationRates(g->h, &util) == NVML_SUCCESS;
		put(sep, ok, "%", "%.0f", ok ? (double)(f[12] == 'g' ? util.gpu : util.memory) : 0);
	} else if (!strcmp(f, "temperature.gpu")) {
		int ok = nvmlDeviceGetTemperature(g->h, NVML_TEMPERATURE_GPU, &u) == NVML_SUCCESS;
		put(sep, ok, NULL, "%.0f", u);
	} else if (!strcmp(f, "power.draw") || !strcmp(f, "power.limit")) {
		int ok = (f[6] == 'd' ? nvmlDeviceGetPowerUsage(g->h, &u) : nvmlDeviceGetEnforcedPowerLimit(g->h, &u)) ==
			 NVML_SUCCESS;
		put(sep, ok, "W", "%.2f", u / 1000.0);
	} else if (!strcmp(f, "clocks.sm") || !strcmp(f, "clocks.mem") || !strcmp(f, "clocks.gr")) {
		nvmlClockType_t t = f[7] == 's' ? NVML_CLOCK_SM : f[7] == 'm' ? NVML_CLOCK_MEM : NVML_CLOCK_GRAPHICS;
		int ok = nvmlDeviceGetClockInfo(g->h, t, &clock) == NVML_SUCCESS;
		put(sep, ok, "MHz", "%.0f", clock);
	} else if (!strcmp(f, "pstate")) {
		nvmlPstates_t p;
		if (nvmlDeviceGetPerformanceState(g->h, &p) == NVML_SUCCESS)
			printf("%sP%d", sep, (int)p);
		else
			printf("%s[N/A]", sep);
	} else if (!strcmp(f, "compute_mode")) {
		nvmlComputeMode_t m;
		static const char *const modes[] = {"Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process"};
		int ok = nvmlDeviceGetComputeMode(g->h, &m) == NVML_SUCCESS && (unsigned)m < 4;
		printf("%s%s", sep, ok ? modes[m] : "[N/A]");
	} else if (!strcmp(f, "driver_version")) {
		char v[96] = "";
		put_text(sep, nvmlSystemGetDriverVersion(v, sizeof v) == NVML_SUCCESS ? v : "[N/A]");
	} else
		return -1;
	return 0;
}

/* The fields a query may name (process fields only in --query-compute-apps), with their units. */
static const struct field {
	const char *name, *unit;
	int process;
} fields_known[] = {
	{"index", NULL, 0}, {"name", NULL, 0}, {"gpu_name", NULL, 0}, {"uuid", NULL, 0}, {"gpu_uuid", NULL, 0},
	{"pci.bus_id", NULL, 0}, {"gpu_bus_id", NULL, 0}, {"memory.total", "MiB", 0}, {"memory.used", "MiB", 0},
	{"memory.free", "MiB", 0}, {"utilization.gpu", "%", 0}, {"utilization.memory", "%", 0},
	{"temperature.gpu", NULL, 0}, {"power.draw", "W", 0}, {"power.limit", "W", 0}, {"clocks.sm", "MHz", 0},
	{"clocks.mem", "MHz", 0}, {"clocks.gr", "MHz", 0}, {"pstate", NULL, 0}, {"compute_mode", NULL, 0},
	{"driver_version", NULL, 0}, {"pid", NULL, 1}, {"process_name", NULL, 1}, {"used_memory", "MiB", 1},
	{"used_gpu_memory", "MiB", 1},
};

static const struct field *field_of(const char *f, int apps)
{
	for (size_t i = 0; i < sizeof fields_known / sizeof fields_known[0]; i++)
		if (!strcmp(f, fields_known[i].name) && (apps || !fields_known[i].process))
			return &fields_known[i];
	return NULL;
}

static void header(char *fields, int apps)
{
	if (noheader)
		return;
	const char *sep = "";
	for (char *f = strtok(fields, ","); f; f = strtok(NULL, ","), sep = ", ") {
		const char *unit = field_of(f, apps)->unit;
		printf(unit && !nounits ? "%s%s [%s]" : "%s%s", sep, !strcmp(f, "used_memory") ? "used_gpu_memory" : f,
		       unit);
	}
	printf("\n");
}

static int app_field(const struct gpu *g, const nvmlProcessInfo_t *p, const char *f, const char *sep)
{
	if (!strcmp(f, "pid"))
		printf("%s%u", sep, p->pid);
	else if (!strcmp(f, "process_name") || !strcmp(f, "name")) {
		char n[256] = "";
		put_text(sep, nvmlSystemGetProcessName(p->pid, n, sizeof n) == NVML_SUCCESS ? n : "[N/A]");
	} else if (!strcmp(f, "used_memory") || !strcmp(f, "used_gpu_memory"))
		put(sep, 1, "MiB", "%.0f", (double)(p->usedGpuMemory >> 20));
	else
		return gpu_field(g, f, sep);
	return 0;
}

/* --query-gpu / --query-compute-apps: one csv line per GPU (per process); 2, before anything is
 * printed, on a field that is empty or unknown. */
static int query(struct gpu *gpus, unsigned n, const char *fields, int apps)
{
	for (const char *f = fields;; f++) {
		size_t len = strcspn(f, ",");
		char one[64];
		snprintf(one, sizeof one, "%.*s", (int)len, f);
		if (!len || len >= sizeof one || !field_of(one, apps)) {
			fprintf(stderr, "vmgpu-smi: field \"%.*s\" is not a valid field to query\n", (int)len, f);
			return 2;
		}
		f += len;
		if (!*f)
			break;
	}
	char *copy = strdup(fields), *copy2 = strdup(fields);
	header(copy, apps);
	free(copy);
	int rc = 0;
	for (unsigned i = 0; i < n && !rc; i++) {
		for (unsigned k = 0; k < (apps ? gpus[i].nprocs : 1) && !rc; k++) {
			char *list = strdup(copy2), *save = NULL;
			const char *sep = "";
			for (char *f = strtok_r(list, ",", &save); f && !rc; f = strtok_r(NULL, ",", &save), sep = ", ") {
				if ((apps ? app_field(&gpus[i], &gpus[i].procs[k], f, sep) : gpu_field(&gpus[i], f, sep)) != 0)
					rc = 2; /* not reached: every field of fields_known is answered */
			}
			free(list);
			if (!rc)
				printf("\n");
		}
	}
	free(copy2);
	return rc;
}

static int usage(FILE *f, int rc)
{
	fprintf(f, "usage: vmgpu-smi [--json | -L | --query-gpu=FIELDS | --query-compute-apps=FIELDS]\n"
		   "                 [--format=csv[,noheader][,nounits]]\n"
		   "  GPU fields: index name uuid pci.bus_id memory.total memory.used memory.free utilization.gpu\n"
		   "              utilization.memory temperature.gpu power.draw power.limit clocks.sm clocks.mem\n"
		   "              clocks.gr pstate compute_mode driver_version\n"
		   "  process fields: pid process_name used_memory gpu_uuid gpu_bus_id (and the GPU fields)\n");
	return rc;
}

int main(int argc, char **argv)
{
	int json = 0, list = 0;
	const char *qgpu = NULL, *qapps = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--json"))
			json = 1;
		else if (!strcmp(a, "-L") || !strcmp(a, "--list-gpus"))
			list = 1;
		else if (!strncmp(a, "--query-gpu=", 12))
			qgpu = a + 12;
		else if (!strncmp(a, "--query-compute-apps=", 21))
			qapps = a + 21;
		else if (!strncmp(a, "--format=", 9)) {
			if (strncmp(a + 9, "csv", 3) || (a[12] && a[12] != ','))
				return usage(stderr, 2);
			for (const char *o = a + 12; *o; o += strcspn(o + 1, ",") + 1) {
				size_t len = strcspn(o + 1, ",");
				if (len == 8 && !strncmp(o + 1, "noheader", 8))
					noheader = 1;
				else if (len == 7 && !strncmp(o + 1, "nounits", 7))
					nounits = 1;
				else
					return usage(stderr, 2);
			}
		} else if (!strcmp(a, "--help") || !strcmp(a, "-h"))
			return usage(stdout, 0);
		else
			return usage(stderr, 2);
	}
	nvmlReturn_t r = nvmlInit_v2();
	unsigned n = 0;
	if (r == NVML_SUCCESS)
		r = nvmlDeviceGetCount_v2(&n);
	if (r != NVML_SUCCESS) {
		fprintf(stderr, "vmgpu-smi: no GPU through vmgpu (%s); is the guest agent running?\n", nvmlErrorString(r));
		return 1;
	}
	struct gpu *gpus = calloc(n ? n : 1, sizeof *gpus);
	for (unsigned i = 0; i < n; i++) {
		struct gpu *g = &gpus[i];
		g->index = i;
		g->nprocs = MAX_PROCS;
		if (nvmlDeviceGetHandleByIndex_v2(i, &g->h) != NVML_SUCCESS ||
		    nvmlDeviceGetName(g->h, g->name, sizeof g->name) != NVML_SUCCESS ||
		    nvmlDeviceGetUUID(g->h, g->uuid, sizeof g->uuid) != NVML_SUCCESS ||
		    nvmlDeviceGetPciInfo_v3(g->h, &g->pci) != NVML_SUCCESS ||
		    nvmlDeviceGetMemoryInfo(g->h, &g->mem) != NVML_SUCCESS ||
		    nvmlDeviceGetComputeRunningProcesses_v3(g->h, &g->nprocs, g->procs) != NVML_SUCCESS) {
			fprintf(stderr, "vmgpu-smi: cannot read GPU %u through vmgpu\n", i);
			return 1;
		}
	}
	int rc = 0;
	if (list) {
		for (unsigned i = 0; i < n; i++)
			printf("GPU %u: %s (UUID: %s)\n", i, gpus[i].name, gpus[i].uuid);
	} else if (qgpu || qapps) {
		rc = query(gpus, n, qgpu ? qgpu : qapps, !qgpu);
	} else if (json) {
		printf("{\"gpus\": [");
		for (unsigned i = 0; i < n; i++) {
			struct gpu *g = &gpus[i];
			printf("%s{\"index\": %u, \"name\": \"%s\", \"uuid\": \"%s\", \"quota_bytes\": %llu, \"used_bytes\": %llu, "
			       "\"processes\": [",
			       i ? ", " : "", i, g->name, g->uuid, g->mem.total, g->mem.used);
			for (unsigned k = 0; k < g->nprocs; k++)
				printf("%s{\"pid\": %u, \"used_bytes\": %llu}", k ? ", " : "", g->procs[k].pid,
				       g->procs[k].usedGpuMemory);
			printf("]}");
		}
		printf("]}\n");
	} else {
		printf("%-4s %-32s %12s %12s %12s\n", "gpu", "name", "quota MiB", "used MiB", "free MiB");
		for (unsigned i = 0; i < n; i++)
			printf("%-4u %-32s %12llu %12llu %12llu\n", i, gpus[i].name, gpus[i].mem.total >> 20,
			       gpus[i].mem.used >> 20, gpus[i].mem.free >> 20);
		printf("\n%-4s %-8s %-24s %s\n", "gpu", "pid", "process", "used MiB");
		unsigned shown = 0;
		for (unsigned i = 0; i < n; i++)
			for (unsigned k = 0; k < gpus[i].nprocs; k++, shown++) {
				char name[256] = "";
				if (nvmlSystemGetProcessName(gpus[i].procs[k].pid, name, sizeof name) != NVML_SUCCESS)
					snprintf(name, sizeof name, "-");
				printf("%-4u %-8u %-24s %llu\n", i, gpus[i].procs[k].pid, name,
				       gpus[i].procs[k].usedGpuMemory >> 20);
			}
		if (!shown)
			printf("(no process of this guest holds GPU memory)\n");
	}
	nvmlShutdown();
	free(gpus);
	return rc;
}
