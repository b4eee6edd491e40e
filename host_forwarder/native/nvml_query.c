/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a guest's NVML shows of one of its GPUs (VG_OP_NVML_QUERY): its own slice, never the
 * host's.  Memory is the guest's quota and what its processes hold by the books; the
 * processes are this guest's (the channels of its region holding memory, by the pid each
 * guest process gave); utilization is the share of the GPU's time this guest's workers used
 * over the last second, from the host NVML's per-process samples of this forwarder's own
 * workers.  Temperature, power, clocks, fan, ECC, compute and persistence mode are read-only
 * facts of the card, read from the host's NVML where it has one (nothing there names another
 * guest).  Without a host NVML (the simulated backend, or a host without it) those values are
 * left out and the guest's NVML answers NVML_ERROR_NOT_SUPPORTED for them.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>

#include "host_nvml.h"
#include "proc.h"
#include "vh_dispatch.h"
#include "protocol.h"

/* The few host NVML entry points read here, by their documented C signatures (nvml.h): handles
 * are pointers, enums ints, and nvmlProcessUtilizationSample_t is
 * {unsigned pid; unsigned long long timeStamp; unsigned smUtil, memUtil, encUtil, decUtil}. */
struct host_util_sample {
	unsigned pid;
	unsigned long long ts;
	unsigned sm, mem, enc, dec;
};
static struct {
	int tried;
	int (*proc_util)(void *, struct host_util_sample *, unsigned *, unsigned long long);
	int (*util)(void *, unsigned[2]); /* nvmlUtilization_t: {unsigned gpu, memory} */
	int (*temp)(void *, int, unsigned *);
	int (*fan)(void *, unsigned *);
	int (*pstate)(void *, int *);
	int (*power)(void *, unsigned *);
	int (*power_limit)(void *, unsigned *);
	int (*clock)(void *, int, unsigned *);
	int (*max_clock)(void *, int, unsigned *);
	int (*ecc)(void *, int *, int *);
	int (*compute_mode)(void *, int *);
	int (*persistence)(void *, int *);
	int (*pci)(void *, void *);
	int (*driver)(char *, unsigned);
} H;

/* The entry points above, from the worker's host NVML (host_nvml.c), once. */
static void host_nvml_load(const struct vh_host_nvml *n)
{
	if (H.tried)
		return;
	H.tried = 1;
#define L(field, sym) *(void **)&H.field = dlsym(n->lib, sym)
	L(proc_util, "nvmlDeviceGetProcessUtilization");
	L(util, "nvmlDeviceGetUtilizationRates");
	L(temp, "nvmlDeviceGetTemperature");
	L(fan, "nvmlDeviceGetFanSpeed");
	L(pstate, "nvmlDeviceGetPerformanceState");
	L(power, "nvmlDeviceGetPowerUsage");
	L(power_limit, "nvmlDeviceGetEnforcedPowerLimit");
	L(clock, "nvmlDeviceGetClockInfo");
	L(max_clock, "nvmlDeviceGetMaxClockInfo");
	L(ecc, "nvmlDeviceGetEccMode");
	L(compute_mode, "nvmlDeviceGetComputeMode");
	L(persistence, "nvmlDeviceGetPersistenceMode");
	L(pci, "nvmlDeviceGetPciInfo_v3");
	L(driver, "nvmlSystemGetDriverVersion");
#undef L
}

/* This guest's share of the GPU's time over the last second: the card's utilization (the time
 * a kernel ran; memory: the time memory was read or written), split among the processes on it
 * by their per-process samples, of which this guest's are those of this forwarder's workers
 * (the children of its supervisor, as this worker is).  A guest alone on a busy card shows
 * what the card shows; two equally busy guests half each. */
static int guest_utilization(void *dev, uint32_t *gpu, uint32_t *mem)
{
	unsigned card[2];
	if (!H.proc_util || !H.util || H.util(dev, card) != 0)
		return -1;
	struct timeval tv;
	gettimeofday(&tv, NULL);
	unsigned long long since = (unsigned long long)tv.tv_sec * 1000000ull + (unsigned long long)tv.tv_usec - 1000000ull;
	/* ask for the count, then the samples; a process that starts in between makes the count
	 * grow: ask again with room for it (a few times) */
	unsigned n = 0;
	int r = H.proc_util(dev, NULL, &n, since);
	struct host_util_sample *s = NULL;
	for (int tries = 0; tries < 4; tries++) {
		if (r == 6 /* NVML_ERROR_NOT_FOUND: no process ran */ || (r == 0 && n == 0)) {
			free(s);
			*gpu = *mem = 0;
			return 0;
		}
		if ((r != 0 && r != 7 /* NVML_ERROR_INSUFFICIENT_SIZE */) || n > 4096)
			break;
		if (r == 0 && s)
			break; /* the samples are in */
		free(s);
		n += 16;
		s = calloc(n, sizeof *s);
		if (!s)
			return -1;
		r = H.proc_util(dev, s, &n, since);
	}
	if (r != 0 || !s) {
		static int logged;
		if (!logged++)
			vh_log("the host NVML gives no per-process utilization (nvmlDeviceGetProcessUtilization: %d); a "
			       "guest's NVML shows none",
			       r);
		free(s);
		return -1;
	}
	uint64_t g = 0, m = 0, all_g = 0, all_m = 0;
	pid_t supervisor = getppid();
	for (unsigned i = 0; i < n; i++) {
		int seen = 0; /* one sample per process: the newest */
		for (unsigned j = 0; j < n; j++)
			seen |= j != i && s[j].pid == s[i].pid && (s[j].ts > s[i].ts || (s[j].ts == s[i].ts && j < i));
		if (seen)
			continue;
		all_g += s[i].sm;
		all_m += s[i].mem;
		int parent;
		if (vh_proc_stat(s[i].pid, NULL, &parent) == 0 && parent == supervisor) {
			g += s[i].sm;
			m += s[i].mem;
		}
	}
	free(s);
	*gpu = all_g ? (uint32_t)((card[0] * g + all_g / 2) / all_g) : 0;
	*mem = all_m ? (uint32_t)((card[1] * m + all_m / 2) / all_m) : 0;
	return 0;
}

static void host_facts(struct vh_chan *ch, int dev, struct vg_nvml_live *o)
{
	const struct vh_host_nvml *n = vh_host_nvml(ch); /* none on the simulated backend */
	void *d = n ? n->dev[dev] : NULL;
	if (!d)
		return;
	host_nvml_load(n);
	unsigned u;
	int a, b;
	if (guest_utilization(d, &o->util_gpu, &o->util_mem) == 0)
		o->flags |= VG_NVML_UTIL;
	if (H.temp && H.temp(d, 0 /* NVML_TEMPERATURE_GPU */, &u) == 0)
		o->temp_c = u, o->flags |= VG_NVML_TEMP;
	if (H.fan && H.fan(d, &u) == 0)
		o->fan_pct = u, o->flags |= VG_NVML_FAN;
	if (H.pstate && H.pstate(d, &a) == 0)
		o->pstate = (uint32_t)a, o->flags |= VG_NVML_PSTATE;
	if (H.power && H.power(d, &u) == 0)
		o->power_mw = u, o->flags |= VG_NVML_POWER;
	if (H.power_limit && H.power_limit(d, &u) == 0)
		o->power_limit_mw = u, o->flags |= VG_NVML_POWER_LIMIT;
	int clocks = 1, max_clocks = 1;
	for (int t = 0; t < 4; t++) {
		clocks &= H.clock && H.clock(d, t, &o->clock_mhz[t]) == 0;
		max_clocks &= H.max_clock && H.max_clock(d, t, &o->max_clock_mhz[t]) == 0;
	}
	o->flags |= (clocks ? VG_NVML_CLOCKS : 0) | (max_clocks ? VG_NVML_MAX_CLOCKS : 0);
	if (H.ecc && H.ecc(d, &a, &b) == 0)
		o->ecc_current = (uint32_t)a, o->ecc_pending = (uint32_t)b, o->flags |= VG_NVML_ECC;
	if (H.compute_mode && H.compute_mode(d, &a) == 0)
		o->compute_mode = (uint32_t)a, o->flags |= VG_NVML_COMPUTE_MODE;
	if (H.persistence && H.persistence(d, &a) == 0)
		o->persistence = (uint32_t)a, o->flags |= VG_NVML_PERSISTENCE;
	/* nvmlPciInfo_t: char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32] */
	struct {
		char legacy[16];
		unsigned domain, bus, device, device_id, subsystem_id;
		char bus_id[32];
	} pci;
	if (H.pci && H.pci(d, &pci) == 0)
		o->pci_device_id = pci.device_id, o->pci_subsystem_id = pci.subsystem_id, o->flags |= VG_NVML_PCI_IDS;
	if (H.driver && H.driver(o->driver_version, sizeof o->driver_version) == 0)
		o->flags |= VG_NVML_DRIVER;
	o->driver_version[sizeof o->driver_version - 1] = '\0';
}

/* The card's readings (host_facts fills nothing else: no memory, no processes) as this worker
 * last read them, at most READINGS_TTL_NS old: a guest that asks in a loop costs the host's
 * NVML (and the driver's locks its neighbours share) at most a few reads a second per guest
 * process. */
#define READINGS_TTL_NS 250000000ull
static const struct vg_nvml_live *readings(struct vh_chan *ch, int dev)
{
	static struct {
		uint64_t at;
		struct vg_nvml_live facts;
	} cache[VG_MAX_DEVICES];
	uint64_t now = vmgpu_now_ns();
	if (!cache[dev].at || now - cache[dev].at > READINGS_TTL_NS) {
		memset(&cache[dev].facts, 0, sizeof cache[dev].facts);
		host_facts(ch, dev, &cache[dev].facts);
		cache[dev].at = now;
	}
	return &cache[dev].facts;
}

CUresult vh_proto_nvml_query(struct vh_chan *ch, struct vh_rd *rd, struct vh_wr *wr)
{
	struct vh_fwd *f = ch->fwd;
	uint64_t dev = vh_get_u64(rd);
	if (rd->bad || dev >= (uint64_t)f->ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	struct vg_nvml_live *o = malloc(sizeof *o);
	if (!o)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*o = *readings(ch, (int)dev); /* the card's readings; memory and processes are this guest's: */
	o->quota = f->quota[dev];
	o->used = atomic_load(&f->used[dev]);
	/* this guest's processes: every channel of its region that is served and holds memory here */
	const struct vmgpu_layout *L = vmgpu_host_layout(f->host);
	for (uint32_t i = 0; i < L->nchannels; i++) {
		uint64_t held = atomic_load(&f->charged[i][dev]);
		struct vmgpu_chan_info ci;
		if (!held || vmgpu_region_chan_info(f->region, f->region_size, L, i, &ci) != 0 ||
		    ci.state != VMGPU_CHAN_ACTIVE)
			continue;
		uint32_t k = 0;
		while (k < o->nprocs && o->procs[k].pid != ci.owner_pid)
			k++;
		if (k == VG_NVML_MAX_PROCS)
			continue;
		o->procs[k].pid = ci.owner_pid;
		o->procs[k].bytes += held;
		o->nprocs += k == o->nprocs;
	}
	vh_put(wr, o, sizeof *o);
	free(o);
	return wr->bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
