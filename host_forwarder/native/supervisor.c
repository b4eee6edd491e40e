/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmgpu-forwarder: serves one guest's shared-memory region on a GPU (or on the
 * simulated backend).  vmgpud starts and supervises it.
 *
 * The process that starts keeps the region: it beats the host heartbeat, watches
 * the channel table, and never touches CUDA.  Each guest process that claims a
 * channel gets a worker process of its own (forked), which opens the driver,
 * serves that channel on one native thread and exits when the guest process goes.
 * As natively, a guest process's CUDA state lives and dies with one host process:
 * a kernel fault poisons only that worker, and its exit frees everything it held.
 * The memory quota is counted across the workers in shared memory.
 *
 *   vmgpu-forwarder --region /dev/shm/vmgpu-NAME [--create SIZE] [--backend cuda|sim]
 *                   [--gpus 0[,1..]] [--mem BYTES[,BYTES..]] [--guest NAME] ...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "region_file.h"
#include "process.h"
#include "vh_images.h"

volatile sig_atomic_t stopping;
volatile sig_atomic_t region_broken;
struct vh_fwd F;
struct vh_backend BK;
const char *backend_name;

struct slot {
	pid_t worker; /* serving this channel, 0 if none */
};

static void vlogf_(const char *prefix, const char *fmt, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof msg, fmt, ap);
	/* the simulated backend says so on every line */
	fprintf(stderr, "vmgpu-forwarder[%s]%s %s%s\n", F.guest, BK.simulated ? " SIMULATED (no GPU):" : "", prefix, msg);
}

void vh_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlogf_("", fmt, ap);
	va_end(ap);
}

static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	uint64_t mul = 1;
	switch (*end) {
	case 'K': case 'k': mul = 1ull << 10; end++; break;
	case 'M': case 'm': mul = 1ull << 20; end++; break;
	case 'G': case 'g': mul = 1ull << 30; end++; break;
	case 'T': case 't': mul = 1ull << 40; end++; break;
	}
	if (*end == 'i' || *end == 'B')
		end++;
	if (*end == 'B')
		end++;
	if (*end || (mul > 1 && v > UINT64_MAX / mul))
		return -1;
	*out = v * mul;
	return 0;
}


/* ---- the region file: the host survives whatever the guest does to it ------------- */

/* A container guest has its region file bind-mounted and can truncate it: the host's next
 * touch of a page past the new end raises SIGBUS.  The handler puts a private zero page
 * there (so the access completes) and marks the region broken; the worker that touched it
 * stops serving, and the supervisor restores the file's size, maps it again, formats it
 * afresh and cuts every guest process off (they broke their own region).  A file the guest
 * grows is cut back to its size at once, so no host memory goes uncounted for long. */
static uintptr_t region_lo, region_hi, page_size;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	uintptr_t a = (uintptr_t)si->si_addr;
	if (a >= region_lo && a < region_hi &&
	    mmap((void *)(a & ~(page_size - 1)), page_size, PROT_READ | PROT_WRITE,
		 MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
		region_broken = 1;
		return;
	}
	signal(sig, SIG_DFL); /* not the region: a real fault */
	raise(sig);
}

static void region_guard(void)
{
	page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
	region_lo = (uintptr_t)F.region;
	region_hi = region_lo + F.region_size;
	struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_NODEFER};
	sigaction(SIGBUS, &sa, NULL);
}

/* 0: the file is as the host made it.  1: it was shrunk or a page went missing: the file
 * has its size back, is mapped again and must be formatted afresh.  A file that was only
 * grown is cut back and stays as it is (0). */
static int region_restore(int fd)
{
	struct stat st;
	int shrunk = fstat(fd, &st) != 0 || (uint64_t)st.st_size < F.region_size || region_broken;
	if (!shrunk && (uint64_t)st.st_size == F.region_size)
		return 0;
	vh_log("the guest changed the size of its region file (%lld bytes; it is %llu): %s", (long long)st.st_size,
	       (unsigned long long)F.region_size,
	       shrunk ? "restored and formatted afresh; its processes lose their GPU" : "cut back");
	if (ftruncate(fd, (off_t)F.region_size) != 0)
		vh_log("cannot restore the region file's size: %s", strerror(errno));
	if (!shrunk)
		return 0;
	if (mmap(F.region, F.region_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
		vh_log("cannot map the region again: %s", strerror(errno));
	region_broken = 0;
	return 1;
}

/* ---- start-up -------------------------------------------------------------------- */

static int die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlogf_("error: ", fmt, ap);
	va_end(ap);
	return 1;
}

const char *errname(CUresult r)
{
	const char *s = NULL;
	if (BK.cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
		return "unknown CUDA error";
	return s;
}

static int open_devices(const char *gpus, const char *mems)
{
	const struct vh_backend *B = &BK;
	CUresult r = B->cuInit(0);
	if (r != CUDA_SUCCESS)
		return die("cuInit failed: %s (%d)", errname(r), r);
	B->cuDriverGetVersion(&F.driver_version);
	int count = 0;
	B->cuDeviceGetCount(&count);
	char *list = strdup(gpus), *save = NULL;
	for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (F.ndev == VG_MAX_DEVICES)
			return die("at most %d GPUs per guest", VG_MAX_DEVICES);
		char *end;
		long ord = strtol(tok, &end, 10);
		if (*end || ord < 0 || ord >= count)
			return die("GPU '%s' is not a device index of this host (0..%d)", tok, count - 1);
		int i = F.ndev++;
		F.ordinal[i] = (int)ord;
		if ((r = B->cuDeviceGet(&F.dev[i], (int)ord)) != CUDA_SUCCESS)
			return die("GPU %ld: %s", ord, errname(r));
		struct vg_dev_info *d = &F.info[i];
		B->cuDeviceGetName(d->name, sizeof d->name, F.dev[i]);
		B->cuDeviceGetUuid_v2((CUuuid *)d->uuid, F.dev[i]);
		size_t total = 0;
		B->cuDeviceTotalMem_v2(&total, F.dev[i]);
		d->nattrs = CU_DEVICE_ATTRIBUTE_MAX < VG_MAX_ATTRS ? CU_DEVICE_ATTRIBUTE_MAX : VG_MAX_ATTRS;
		for (int a = 1; a < d->nattrs; a++)
			if (B->cuDeviceGetAttribute(&d->attrs[a], a, F.dev[i]) != CUDA_SUCCESS)
				d->attrs[a] = 0;
		d->pci_domain = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID];
		d->pci_bus = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID];
		d->pci_device = d->attrs[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID];
		F.quota[i] = total;
		d->total_mem = total;
	}
	free(list);
	if (F.ndev == 0)
		return die("no GPU given (--gpus)");
	if (mems) {
		char *ml = strdup(mems);
		int i = 0;
		for (char *tok = strtok_r(ml, ",", &save); tok; tok = strtok_r(NULL, ",", &save), i++) {
			uint64_t q;
			if (i >= F.ndev || parse_size(tok, &q) || q == 0)
				return die("--mem: '%s' is not a size for GPU slot %d", tok, i);
			if (q > F.info[i].total_mem)
				return die("--mem: %s is more than GPU slot %d has (%llu bytes)", tok, i,
					   (unsigned long long)F.info[i].total_mem);
			F.quota[i] = F.info[i].total_mem = q;
		}
		free(ml);
		if (i != F.ndev)
			return die("--mem: give one size per GPU (%d)", F.ndev);
	}
	return 0;
}

/* Check the GPUs and read what guests will be told, in a child: this process never
 * opens the driver, so that each worker it forks can. */
static int probe_devices(const char *gpus, const char *mems)
{
	struct vh_fwd *shared = mmap(NULL, sizeof F, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED)
		return die("cannot map shared memory: %s", strerror(errno));
	pid_t pid = fork();
	if (pid == 0) {
		char err[512];
		if (vh_backend_load(&BK, backend_name, err, sizeof err))
			_exit(die("%s", err));
		if (open_devices(gpus, mems))
			_exit(1);
		*shared = F;
		_exit(0);
	}
	int status = 0;
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		munmap(shared, sizeof F);
		return 1;
	}
	F.ndev = shared->ndev;
	F.driver_version = shared->driver_version;
	memcpy(F.ordinal, shared->ordinal, sizeof F.ordinal);
	memcpy(F.quota, shared->quota, sizeof F.quota);
	memcpy(F.info, shared->info, sizeof F.info);
	munmap(shared, sizeof F);
	return 0;
}

/* The statistics page: in a file vmgpud can read (--stats), or anonymous; shared with the workers. */
static int map_stats(const char *path)
{
	int fd = -1, flags = MAP_SHARED | MAP_ANONYMOUS;
	if (path) {
		/* never through a link, never a file someone else made (vmgpud keeps it in its own
		 * private directory) */
		fd = vh_open_ours(path, O_RDWR | O_CREAT);
		if (fd < 0 || ftruncate(fd, 0) != 0 || ftruncate(fd, sizeof *F.stats) != 0)
			return die("--stats %s: %s", path, strerror(errno));
		flags = MAP_SHARED;
	}
	F.stats = mmap(NULL, sizeof *F.stats, PROT_READ | PROT_WRITE, flags, fd, 0);
	if (fd >= 0)
		close(fd);
	if (F.stats == MAP_FAILED)
		return die("cannot map the statistics page: %s", strerror(errno));
	memset(F.stats, 0, sizeof *F.stats);
	F.stats->version = VH_STATS_VERSION;
	F.stats->ndev = (uint32_t)F.ndev;
	for (int i = 0; i < F.ndev; i++)
		F.stats->quota[i] = F.quota[i];
	F.used = F.stats->used;
	atomic_thread_fence(memory_order_release);
	F.stats->magic = VH_STATS_MAGIC; /* last: a reader sees a complete header */
	return 0;
}

void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: vmgpu-forwarder --region PATH [options]\n"
		"Serve one guest's vmgpu region: run its CUDA calls on a GPU.\n\n"
		"  --region PATH       the region file (/dev/shm/...)\n"
		"  --create SIZE       create and format the region first (e.g. 256M)\n"
		"  --backend NAME      cuda (default) or sim (simulated, for tests without a GPU)\n"
		"  --gpus LIST         host GPU indices given to the guest, comma separated (default 0)\n"
		"  --mem LIST          memory quota per GPU (e.g. 8G,8G; default the whole card)\n"
		"  --guest NAME        the guest's name, for logs\n"
		"  --channels N        region geometry: channels (default 16)\n"
		"  --bulk SIZE         region geometry: bulk area per channel (default 4M)\n"
		"  --wait futex|poll   region geometry: wait mode (default futex)\n"
		"  --peer-timeout SEC  a guest process silent this long is gone (default 5)\n"
		"  --stats FILE        keep the statistics page in FILE (vmgpud and `vmgpu breakdown` read it)\n"
		"  --compute LIST      the guest's compute weight per GPU, 1..100 (its cap under the fixed\n"
		"                      policy; default 100)\n"
		"  --sched-dir DIR     where the GPUs' scheduler pages live (default $VMGPU_SCHED_DIR or /dev/shm/vmgpu)\n"
		"  --sched-id LIST     the scheduler page name per GPU (vmgpud gives its GPU UUIDs;\n"
		"                      default the UUID the driver reports)\n"
		"  --no-sched          take no part in compute scheduling (benchmarks' native baseline)\n"
		"  --ctx-reserve SIZE  what each guest process's context is charged where NVML cannot measure\n"
		"                      it (default 544M, 0 on the simulated backend; where NVML can, the\n"
		"                      measurement is charged)\n"
		"  --allow-pageable-access  serve a GPU whose kernels reach any pageable host memory (HMM/ATS),\n"
		"                      though a guest's kernel could then read and write its worker\n"
		"  --oom-script PATH   run PATH GUEST when the guest is refused memory, with VMGPU_GUEST,\n"
		"                      VMGPU_GPU (UUID), VMGPU_QUOTA, VMGPU_USED, VMGPU_REQUEST, VMGPU_CALL,\n"
		"                      VMGPU_CHANNEL and VMGPU_WORKER_PID set (at most once a second per process)\n");
}

/* The d-th comma-separated name of list (vmgpud's name of the GPU, its UUID) into out. */
static int sched_id(const char *list, int d, char *out, size_t cap)
{
	const char *p = list;
	for (int i = 0; i < d && p; i++)
		p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL;
	if (!p)
		return -1;
	size_t n = strcspn(p, ",");
	if (!n || n >= cap)
		return -1;
	for (size_t i = 0; i < n; i++)
		if (!(p[i] == '-' || (p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'z') ||
		      (p[i] >= 'A' && p[i] <= 'Z')))
			return -1;
	memcpy(out, p, n);
	out[n] = '\0';
	return 0;
}

/* A worker ended: give back its row of the books and its place in its GPUs' scheduler
 * slots, however it ended, and fence its channel (reclaimed by the supervisor's loop). */
static void worker_ended(struct slot *slots, uint32_t i, pid_t pid, int status, uint8_t *fence)
{
	slots[i].worker = 0;
	for (int d = 0; d < F.ndev; d++) {
		atomic_fetch_sub(&F.used[d], atomic_exchange(&F.charged[i][d], 0));
		if (atomic_exchange(&F.sched_joined[i][d], 0))
			vh_sched_worker(&F.sched[d], -1); /* it could not say so itself */
	}
	fence[i] = 1;
	if (WIFSIGNALED(status))
		vh_log("channel %u: worker %d died (signal %d); the guest process loses its GPU", i, (int)pid,
		       WTERMSIG(status));
	else if (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != VH_EXIT_PROTOCOL)
		vh_log("channel %u: worker %d failed (exit %d); the guest process loses its GPU", i, (int)pid,
		       WEXITSTATUS(status));
}

/* Reap the workers that ended (waiting for them if block).  Returns how many are left. */
static uint32_t reap(struct slot *slots, uint32_t n, uint8_t *fence, int block)
{
	int status;
	pid_t pid;
	while ((pid = waitpid(-1, &status, block ? 0 : WNOHANG)) > 0) {
		for (uint32_t i = 0; i < n; i++)
			if (slots[i].worker == pid)
				worker_ended(slots, i, pid, status, fence);
		block = 0;
	}
	uint32_t left = 0;
	for (uint32_t i = 0; i < n; i++)
		left += slots[i].worker != 0;
	return left;
}

static void reap_all(struct slot *slots, uint32_t n, uint8_t *fence)
{
	while (reap(slots, n, fence, 1))
		;
}

static void signal_workers(const struct slot *slots, uint32_t n, int sig)
{
	for (uint32_t i = 0; i < n; i++)
		if (slots[i].worker)
			kill(slots[i].worker, sig);
}

/* A worker for the guest process that opened channel i.  It is counted into its GPUs'
 * scheduler slots here, before it exists, so that no way it can end leaves a count behind. */
static void start_worker(struct slot *slots, uint32_t i)
{
	for (int d = 0; d < F.ndev; d++) {
		vh_sched_worker(&F.sched[d], 1);
		atomic_store(&F.sched_joined[i][d], 1);
	}
	pid_t self = getpid(), pid = fork();
	if (pid == 0)
		_exit(vh_worker(i, self));
	if (pid > 0) {
		slots[i].worker = pid;
		return;
	}
	vh_log("channel %u: cannot start a worker: %s", i, strerror(errno));
	for (int d = 0; d < F.ndev; d++)
		if (atomic_exchange(&F.sched_joined[i][d], 0))
			vh_sched_worker(&F.sched[d], -1);
}

int main(int argc, char **argv)
{
	const char *region = NULL, *backend = "cuda", *gpus = "0", *mems = NULL, *stats_path = NULL;
	const char *sched_dir = getenv("VMGPU_SCHED_DIR");
	int compute[VG_MAX_DEVICES], no_sched = 0;
	const char *sched_ids = NULL;
	for (int i = 0; i < VG_MAX_DEVICES; i++)
		compute[i] = 100;
	uint64_t create = 0;
	struct vmgpu_shm_params params;
	vmgpu_shm_params_default(&params);
	struct vmgpu_wait_opts wopts;
	vmgpu_wait_opts_default(&wopts);
	F.guest = "guest";
	int ctx_reserve_set = 0, allow_pageable = 0;
	static const struct option opts[] = {
		{"region", 1, 0, 'r'}, {"create", 1, 0, 'c'}, {"backend", 1, 0, 'b'}, {"gpus", 1, 0, 'g'},
		{"mem", 1, 0, 'm'}, {"guest", 1, 0, 'n'}, {"channels", 1, 0, 'C'}, {"bulk", 1, 0, 'B'},
		{"wait", 1, 0, 'w'}, {"peer-timeout", 1, 0, 't'}, {"stats", 1, 0, 's'}, {"help", 0, 0, 'h'},
		{"compute", 1, 0, 'W'}, {"sched-dir", 1, 0, 'D'}, {"no-sched", 0, 0, 'N'}, {"sched-id", 1, 0, 'I'},
		{"ctx-reserve", 1, 0, 'R'}, {"oom-script", 1, 0, 'O'}, {"allow-pageable-access", 0, 0, 'P'},
		{0, 0, 0, 0},
	};
	int o;
	uint64_t v;
	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (o) {
		case 'r': region = optarg; break;
		case 'c':
			if (parse_size(optarg, &create) || !create)
				return die("--create: '%s' is not a size", optarg);
			break;
		case 'b': backend = optarg; break;
		case 'g': gpus = optarg; break;
		case 'm': mems = optarg; break;
		case 'n': F.guest = optarg; break;
		case 'C':
			if (parse_size(optarg, &v) || v < 1 || v > VMGPU_MAX_CHANNELS)
				return die("--channels: '%s' is not in 1..%d", optarg, VMGPU_MAX_CHANNELS);
			params.nchannels = (uint32_t)v;
			break;
		case 'B':
			if (parse_size(optarg, &v))
				return die("--bulk: '%s' is not a size", optarg);
			params.bulk_size = v;
			break;
		case 'w':
			if (!strcmp(optarg, "futex"))
				params.wait_mode = VMGPU_WAIT_FUTEX;
			else if (!strcmp(optarg, "poll"))
				params.wait_mode = VMGPU_WAIT_POLL;
			else
				return die("--wait: '%s' is neither futex nor poll", optarg);
			break;
		case 't':
			if (parse_size(optarg, &v) || v < 1)
				return die("--peer-timeout: '%s' is not a number of seconds", optarg);
			wopts.peer_timeout_ns = v * 1000000000ull;
			break;
		case 's': stats_path = optarg; break;
		case 'W': {
			char *list = strdup(optarg), *save = NULL;
			int n = 0;
			for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
				if (n >= VG_MAX_DEVICES || parse_size(t, &v) || v < 1 || v > 100) {
					free(list);
					return die("--compute: '%s' is not a list of weights in 1..100", optarg);
				}
				compute[n++] = (int)v;
			}
			for (; n > 0 && n < VG_MAX_DEVICES; n++)
				compute[n] = compute[n - 1]; /* the last one for the GPUs not named */
			free(list);
			break;
		}
		case 'D': sched_dir = optarg; break;
		case 'I': sched_ids = optarg; break;
		case 'N': no_sched = 1; break;
		case 'R':
			if (parse_size(optarg, &F.ctx_reserve))
				return die("--ctx-reserve: '%s' is not a size", optarg);
			ctx_reserve_set = 1;
			break;
		case 'O':
			if (access(optarg, X_OK) != 0)
				return die("--oom-script: %s is not an executable file", optarg);
			F.oom_script = optarg;
			break;
		case 'P': allow_pageable = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!region || optind != argc) {
		usage(stderr);
		return 2;
	}
	backend_name = backend;
	BK.simulated = !strcmp(backend, "sim");
	if (!ctx_reserve_set) /* an H100 context with driver 580, measured; the simulated one has none */
		F.ctx_reserve = BK.simulated ? 0 : 544ull << 20;
	if (strcmp(backend, "sim") && strcmp(backend, "cuda"))
		return die("unknown backend '%s' (cuda or sim)", backend);
	if (probe_devices(gpus, mems))
		return 1;
	/* A GPU whose kernels can reach any pageable memory of the process that runs them (HMM or
	 * ATS) lets a guest's kernel read and write its worker: the books, the scheduler pages, the
	 * driver's state.  Addresses given to kernels are the kernels' business, so there is no
	 * checking them: such a GPU is refused unless the operator accepts it. */
	for (int d = 0; d < F.ndev; d++) {
		if (F.info[d].nattrs <= CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS ||
		    !F.info[d].attrs[CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS])
			continue;
		if (!allow_pageable)
			return die("GPU %d: its kernels can reach any pageable host memory of the process that runs "
				   "them (HMM/ATS), so a guest's kernel could read and write its worker; refusing to "
				   "serve it. Load nvidia-uvm with uvm_disable_hmm=1, or pass --allow-pageable-access "
				   "to accept that risk",
				   d);
		vh_log("warning: GPU %d: kernels reach pageable host memory (HMM/ATS) and --allow-pageable-access "
		       "is given: a guest's kernel can read and write its worker",
		       d);
	}
	if (map_stats(stats_path))
		return 1;

	int fd = vh_region_open(region, create); /* never through a link, never someone else's file */
	if (fd < 0)
		return die("cannot open region %s: %s", region, strerror(errno));
	struct stat st;
	fstat(fd, &st);
	F.region_size = (uint64_t)st.st_size;
	F.region = mmap(NULL, F.region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (F.region == MAP_FAILED)
		return die("cannot map region %s: %s", region, strerror(errno));
	region_guard(); /* the fd stays open: the supervisor watches the file's size */
	if (create && vmgpu_region_format(F.region, F.region_size, &params, F.guest) != 0)
		return die("cannot format region %s: %s", region, vmgpu_shm_errmsg());
	if (vmgpu_host_attach(F.region, F.region_size, &params, &wopts, &F.host) != 0)
		return die("cannot serve region %s: %s", region, vmgpu_shm_errmsg());
	vh_images_open(&F); /* none: every image crosses */

	for (int d = 0; d < F.ndev && !no_sched; d++) {
		char uuid[64];
		const uint8_t *u = F.info[d].uuid;
		vh_uuid_str(u, uuid, sizeof uuid);
		if (sched_ids && sched_id(sched_ids, d, uuid, sizeof uuid))
			return die("--sched-id: '%s' names no page for GPU %d (UUIDs of letters, digits and '-')",
				   sched_ids, d);
		if (vh_sched_join(&F.sched[d], sched_dir && *sched_dir ? sched_dir : VS_DIR, uuid, F.guest, compute[d],
				  d))
			return die("cannot join the compute scheduler of %s in %s: %s", uuid,
				   sched_dir && *sched_dir ? sched_dir : VS_DIR, strerror(errno));
	}

	const struct vmgpu_layout *L = vmgpu_host_layout(F.host);
	vh_log("serving %s (%llu MiB, %u channels) on %d GPU(s): %s, quota %llu MiB; driver %d", region,
	       (unsigned long long)(F.region_size >> 20), L->nchannels, F.ndev, F.info[0].name,
	       (unsigned long long)(F.quota[0] >> 20), F.driver_version);

	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	struct slot *slots = calloc(L->nchannels, sizeof *slots);
	/* each worker's row of the books and its scheduler membership, shared, so that both
	 * come back however the worker ends; and the lock its contexts are made under */
	size_t rows = L->nchannels * sizeof *F.charged, joined = L->nchannels * sizeof *F.sched_joined;
	F.charged = mmap(NULL, rows, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	F.sched_joined = mmap(NULL, joined, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	F.shared = mmap(NULL, sizeof *F.shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (F.charged == MAP_FAILED || F.sched_joined == MAP_FAILED || F.shared == MAP_FAILED)
		return die("cannot map the memory books: %s", strerror(errno));
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&F.shared->ctx_mu, &ma);
	uint8_t *fence = calloc(L->nchannels, 1);
	while (!stopping) {
		vmgpu_host_beat(F.host);
		vmgpu_host_republish(F.host); /* what the host owns in the header, put back if scribbled */
		if (region_restore(fd)) {
			/* every guest process loses its channel; the region starts again, empty */
			signal_workers(slots, L->nchannels, SIGKILL);
			reap_all(slots, L->nchannels, fence);
			vmgpu_host_detach(F.host);
			F.host = NULL;
			if (vmgpu_region_format(F.region, F.region_size, &params, F.guest) != 0 ||
			    vmgpu_host_attach(F.region, F.region_size, &params, &wopts, &F.host) != 0) {
				vh_log("cannot format the region again: %s", vmgpu_shm_errmsg());
				break;
			}
			L = vmgpu_host_layout(F.host);
			vh_log("the region is formatted afresh and served again");
			memset(fence, 0, L->nchannels);
		}
		reap(slots, L->nchannels, fence, 0);
		for (int d = 0; d < F.ndev; d++)
			vh_sched_unheld(&F.sched[d]);
		uint64_t now = vmgpu_now_ns();
		for (uint32_t i = 0; i < L->nchannels; i++) {
			if (slots[i].worker)
				continue;
			struct vmgpu_hchan *hc = vmgpu_host_chan(F.host, i);
			int ev = vmgpu_hchan_poll(hc, now);
			if (fence[i]) {
				/* its worker ended: whatever the channel says, that owner is done (a worker
				 * ends only when its owner closed, was lost or broke the protocol, or when the
				 * worker itself failed).  A new owner comes with a new generation. */
				if (ev == VMGPU_HC_IDLE || vmgpu_hchan_reclaim(hc) == 0)
					fence[i] = 0;
				continue;
			}
			if (ev == VMGPU_HC_CLOSED || ev == VMGPU_HC_LOST) {
				vmgpu_hchan_reclaim(hc);
			} else if (ev == VMGPU_HC_OPENED || ev == VMGPU_HC_SERVING) {
				start_worker(slots, i);
			}
		}
		struct timespec ts = {0, 2 * 1000000};
		nanosleep(&ts, NULL);
	}
	vh_log("stopping");
	signal_workers(slots, L->nchannels, SIGTERM);
	/* workers finish their call and free what their process held; one that does not within
	 * a few seconds (stuck in the driver) is killed */
	uint64_t deadline = vmgpu_now_ns() + 5000000000ull;
	while (reap(slots, L->nchannels, fence, 0) && vmgpu_now_ns() < deadline) {
		struct timespec ts = {0, 5 * 1000000};
		nanosleep(&ts, NULL);
	}
	signal_workers(slots, L->nchannels, SIGKILL);
	reap_all(slots, L->nchannels, fence);
	close(fd);
	free(slots);
	free(fence);
	for (int d = 0; d < F.ndev; d++)
		vh_sched_leave(&F.sched[d]);
	vmgpu_host_close(F.host);
	vmgpu_host_detach(F.host);
	munmap(F.region, F.region_size);
	vh_images_close(&F);
	return 0;
}
