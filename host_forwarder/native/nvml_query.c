/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a guest's NVML shows of one of its GPUs (VG_OP_NVML_QUERY): its own slice, never the
 * host's.  Memory is the guest's quota and what its processes are charged; the
 * processes are this guest's (the channels of its region holding memory, by the pid each
 * guest process gave); utilization is the share of the GPU's time this guest's workers used
 * over the last second, from the host NVML's per-process samples of this forwarder's own
 * workers.  Temperature, power, clocks, fan, ECC, compute and persistence mode are read-only
 * facts of the card, read from the host's NVML where it has one (nothing there names another
 * guest).  Without a host NVML (a host without it; the simulated backend's own NVML has none of
 * them) those values are left out and the guest's NVML answers NVML_ERROR_NOT_SUPPORTED for them.
 * The wiring (NvLinks and P2P status, for NCCL's topology) is the host NVML's for the guest's
 * own GPUs only: a link's far end is named as one of the guest's GPUs or a switch, never by a
 * host address, and a GPU that is not the guest's is not named at all (link_remote).
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
	int (*p2p)(void *, void *, int, int *);
	int (*link_state)(void *, unsigned, int *);
	int (*link_version)(void *, unsigned, unsigned *);
	int (*link_cap)(void *, unsigned, int, unsigned *);
	int (*link_remote_pci)(void *, unsigned, void *);
	int (*link_remote_type)(void *, unsigned, int *);
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
	L(p2p, "nvmlDeviceGetP2PStatus");
	L(link_state, "nvmlDeviceGetNvLinkState");
	L(link_version, "nvmlDeviceGetNvLinkVersion");
	L(link_cap, "nvmlDeviceGetNvLinkCapability");
	L(link_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
	L(link_remote_type, "nvmlDeviceGetNvLinkRemoteDeviceType");
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

/* nvmlPciInfo_t: char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32] */
struct host_pci {
	char legacy[16];
	unsigned domain, bus, device, device_id, subsystem_id;
	char bus_id[32];
};

static void host_facts(struct vh_chan *ch, int dev, struct vg_nvml_live *o)
{
	const struct vh_host_nvml *n = vh_host_nvml(ch); /* the simulated backend's has no readings */
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
	struct host_pci pci;
	if (H.pci && H.pci(d, &pci) == 0)
		o->pci_device_id = pci.device_id, o->pci_subsystem_id = pci.subsystem_id, o->flags |= VG_NVML_PCI_IDS;
	if (H.driver && H.driver(o->driver_version, sizeof o->driver_version) == 0)
		o->flags |= VG_NVML_DRIVER;
	o->driver_version[sizeof o->driver_version - 1] = '\0';
}

#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_NVLINK_DEVICE_TYPE_GPU 0
#define NVML_NVLINK_DEVICE_TYPE_SWITCH 2
#define NVML_NVLINK_CAP_COUNT 6

/* What is at the far end of link `l` of the guest's GPU `d`, as the guest may know it: one of its
 * own GPUs (by its index), an NVSwitch, or nothing it may know.  The host's answer names the far
 * end by its PCI address on the host; that address never leaves here.  A GPU that is not this
 * guest's is hidden, as is anything else that is not a switch (a CPU): the guest could not reach
 * it, and its address would tell one guest where another's GPU sits. */
static void link_remote(struct vh_chan *ch, void *d, unsigned l, struct vg_nvml_link *k)
{
	const struct vh_fwd *f = ch->fwd;
	int type = -1;
	struct host_pci pci;
	k->remote = VG_NVML_REMOTE_HIDDEN;
	k->remote_ret = NVML_ERROR_NOT_SUPPORTED;
	if (H.link_remote_type && H.link_remote_type(d, l, &type) == 0 && type == NVML_NVLINK_DEVICE_TYPE_SWITCH) {
		k->remote = VG_NVML_REMOTE_SWITCH, k->remote_ret = 0;
		return;
	}
	if (type != -1 && type != NVML_NVLINK_DEVICE_TYPE_GPU)
		return;
	if (!H.link_remote_pci || H.link_remote_pci(d, l, &pci) != 0)
		return;
	for (int g = 0; g < f->ndev; g++)
		if (pci.domain == (unsigned)f->info[g].pci_domain && pci.bus == (unsigned)f->info[g].pci_bus &&
		    pci.device == (unsigned)f->info[g].pci_device) {
			k->remote = VG_NVML_REMOTE_GUEST_GPU, k->remote_dev = (uint8_t)g, k->remote_ret = 0;
			return;
		}
}

/* How the guest's GPU `dev` reaches its other GPUs: its NvLinks and the P2P status to each of
 * the guest's GPUs, by the host's NVML (the simulated backend's own NVML on it). */
static void host_topology(struct vh_chan *ch, int dev, struct vg_nvml_live *o)
{
	const struct vh_host_nvml *n = vh_host_nvml(ch);
	void *d = n ? n->dev[dev] : NULL;
	if (!d)
		return;
	host_nvml_load(n);
	const struct vh_fwd *f = ch->fwd;
	for (int g = 0; g < f->ndev; g++)
		for (int c = 0; c < VG_NVML_P2P_CAPS; c++) {
			struct vg_nvml_p2p *p = &o->p2p[g][c];
			int status = 0, r = NVML_ERROR_NOT_SUPPORTED;
			if (H.p2p && n->dev[g])
				r = H.p2p(d, n->dev[g], c, &status);
			p->ret = (uint16_t)r, p->status = (uint16_t)status;
		}
	for (unsigned l = 0; l < VG_NVML_MAX_LINKS; l++) {
		struct vg_nvml_link *k = &o->links[l];
		int state = 0;
		unsigned version = 0, cap = 0;
		k->state_ret = (uint16_t)(H.link_state ? H.link_state(d, l, &state) : NVML_ERROR_NOT_SUPPORTED);
		k->state = (uint8_t)state;
		k->version_ret = (uint16_t)(H.link_version ? H.link_version(d, l, &version) : NVML_ERROR_NOT_SUPPORTED);
		k->version = (uint8_t)version;
		for (int c = 0; c < NVML_NVLINK_CAP_COUNT; c++)
			if (H.link_cap && H.link_cap(d, l, c, &cap) == 0)
				k->caps_known |= (uint8_t)(1u << c), k->caps |= (uint8_t)(cap ? 1u << c : 0);
		k->remote_ret = NVML_ERROR_NOT_SUPPORTED;
		if (k->state_ret == 0 && k->state)
			link_remote(ch, d, l, k);
	}
	o->has_topology = 1;
}

/* What `fill` read of the guest's GPU `dev` (and nothing else: no memory, no processes), as this
 * worker last read it, at most `ttl_ns` old. */
struct nvml_cache {
	uint64_t at;
	struct vg_nvml_live facts;
};
static const struct vg_nvml_live *cached(struct nvml_cache *cache, uint64_t ttl_ns,
					 void (*fill)(struct vh_chan *, int, struct vg_nvml_live *), struct vh_chan *ch,
					 int dev)
{
	uint64_t now = vmgpu_now_ns();
	if (!cache[dev].at || now - cache[dev].at > ttl_ns) {
		memset(&cache[dev].facts, 0, sizeof cache[dev].facts);
		fill(ch, dev, &cache[dev].facts);
		cache[dev].at = now;
	}
	return &cache[dev].facts;
}

/* The card's readings at most 250 ms old: a guest that asks in a loop costs the host's NVML (and
 * the driver's locks its neighbours share) at most a few reads a second per guest process. */
static const struct vg_nvml_live *readings(struct vh_chan *ch, int dev)
{
	static struct nvml_cache cache[VG_MAX_DEVICES];
	return cached(cache, 250000000ull, host_facts, ch, dev);
}

/* The wiring at most 10 s old: it is the machine's, which a guest asks about at its start (NCCL:
 * every pair, every link), and reading it costs the host's NVML some hundred calls. */
static void topology(struct vh_chan *ch, int dev, struct vg_nvml_live *o)
{
	static struct nvml_cache cache[VG_MAX_DEVICES];
	const struct vg_nvml_live *t = cached(cache, 10000000000ull, host_topology, ch, dev);
	o->has_topology = t->has_topology;
	memcpy(o->links, t->links, sizeof o->links);
	memcpy(o->p2p, t->p2p, sizeof o->p2p);
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
	*o = *readings(ch, (int)dev); /* the card's readings and wiring; memory and processes are this guest's: */
	topology(ch, (int)dev, o);
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
