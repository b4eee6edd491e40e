/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmgpu-forwarder: serves one guest's shared-memory region on a GPU (or on the
 * simulated backend).  vmgpud starts and supervises it.
 *
 * The process that starts keeps the region: it beats the host heartbeat, watches
 * the channel table, and never touches CUDA (supervisor.c).  Each guest process that
 * claims a channel gets a worker process of its own (forked, worker.c), which opens the
 * driver, serves that channel on one native thread and exits when the guest process goes.
 * As natively, a guest process's CUDA state lives and dies with one host process:
 * a kernel fault poisons only that worker, and its exit frees everything it held.
 * The memory quota is counted across the workers in shared memory (quota.c).
 *
 * This file: the command line and start-up (the GPUs, the statistics page, the region,
 * the compute schedulers, the shared rows of the quota), then the supervisor's loop.
 *
 *   vmgpu-forwarder --region /dev/shm/vmgpu-NAME [--create SIZE] [--backend cuda|sim]
 *                   [--gpus 0[,1..]] [--mem BYTES[,BYTES..]] [--guest NAME] ...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "images.h"
#include "proc.h"
#include "process.h"
#include "region_file.h"
#include "sched_policy.h"

volatile sig_atomic_t stopping;
volatile sig_atomic_t region_broken;
struct vh_fwd F;
struct vh_backend BK;
const char *backend_name;

void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: vmgpu-forwarder --region PATH [options]\n"
		"       vmgpu-forwarder --sweep [--after PID] [--stats FILE] [--guest NAME]\n"
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
		"  --weight LIST       the guest's compute weight per GPU, 1..100, relative to the others'\n"
		"                      (its cap under the fixed policy; default 100); --compute is the same\n"
		"  --guarantee LIST    the compute share per GPU reserved for it at admission, 0..100 (%%;\n"
		"                      default 0: none): under weighted it is given first, the rest by weight\n"
		"  --cap LIST          at most this %% of each period per GPU, 0..100 (default 0: no cap),\n"
		"                      beside weighted guests that have none\n"
		"  --priority LIST     high, normal (default) or low per GPU: a higher guest's work goes first\n"
		"  --sched-dir DIR     where the GPUs' scheduler pages live (default $VMGPU_SCHED_DIR or /dev/shm/vmgpu)\n"
		"  --sched-id LIST     the scheduler page name per GPU (vmgpud gives its GPU UUIDs;\n"
		"                      default the UUID the driver reports)\n"
		"  --no-sched          take no part in compute scheduling (benchmarks' native baseline)\n"
		"  --sweep             serve nothing: remove what forwarders that are gone left behind (this\n"
		"                      user's module image caches in /dev/shm of forwarders that are gone and,\n"
		"                      with --stats, what the CUDA driver left in /dev/shm for the workers that\n"
		"                      page names), waiting while workers still ending hold it (at most 120 s);\n"
		"                      a forwarder that starts does the same first.  --after PID: first wait\n"
		"                      (as long) for process PID, a forwarder stopped, to be gone\n"
		"  --sched-depth N     beside a guest of a higher priority, at most N of a guest process's calls\n"
		"                      that put work on the GPU may be unfinished there (0..1024, default 32;\n"
		"                      0: no limit): the higher guest waits behind no more of its work than that\n"
		"  --yield-depth N     under shared, for half a second after a guest of a higher priority last\n"
		"                      put work on the GPU, at most N of a process's calls may be unfinished\n"
		"                      there where N is less than --sched-depth (0..1024, default 0: none), so\n"
		"                      that the higher guest's next work finds little of this one's ahead of it\n"
		"  --mps DIR           serve the guest as a client of the MPS control daemon whose pipe\n"
		"                      directory is DIR (root's, writable by no one else): its kernels run\n"
		"                      beside other clients' on the GPU (time them with the GPU's policy:\n"
		"                      shared lets them run side by side, held to their shares)\n"
		"  --mps-when WHEN     with --mps: which guest processes are its clients: always (default), or\n"
		"                      shared: those that start while one of their GPUs' policy is shared\n"
		"                      (the others keep a context of their own, out of reach of MPS's shared\n"
		"                      fault domain)\n"
		"  --mps-threads PCT   with --mps: at most PCT %% of the GPU's SMs (1..100, default 100)\n"
		"  --sm-partitions MODE  under shared, while another guest of its priority or above is at\n"
		"                      work, run the guest's work on the SMs the share controller gives it\n"
		"                      (green contexts; alone it has the whole GPU): auto (default: in the\n"
		"                      guest processes that are MPS clients, whose partitions run side by\n"
		"                      side), on, or off\n"
		"  --mps-priority MODE with --mps: the MPS client priority of the guest's processes, read as\n"
		"                      each starts: auto (default: normal for a guest high on any of its\n"
		"                      GPUs, below normal for every other, so the SMs run a high guest's\n"
		"                      kernels first; other clients of the MPS daemon are normal), normal,\n"
		"                      below, or driver (CUDA_MPS_CLIENT_PRIORITY as the forwarder's\n"
		"                      environment has it, else the driver's default)\n"
		"  --ctx-reserve SIZE  what each guest process's context is charged where NVML cannot measure\n"
		"                      it (default 544M, 0 on the simulated backend; where NVML can, the\n"
		"                      measurement is charged)\n"
		"  --allow-pageable-access  serve a GPU whose kernels reach any pageable host memory (HMM/ATS),\n"
		"                      though a guest's kernel could then read and write its worker\n"
		"  --oom-script PATH   run PATH GUEST when the guest is refused memory, with VMGPU_GUEST,\n"
		"                      VMGPU_GPU (UUID), VMGPU_QUOTA, VMGPU_USED, VMGPU_REQUEST, VMGPU_CALL,\n"
		"                      VMGPU_CHANNEL and VMGPU_WORKER_PID set (at most once a second per process)\n"
		"Environment: VMGPU_HOST_FUNC_TIMEOUT_S (default 10): a guest's host function (cuLaunchHostFunc)\n"
		"  that has not returned this long after its stream reached it is given up on: its stream is\n"
		"  released and the guest gets CUDA_ERROR_LAUNCH_TIMEOUT.  VMGPU_TRACE_ERRORS=1: log every\n"
		"  call that fails, with its name, and every address refused.\n");
}

/* What the command line sets besides F. */
struct options {
	const char *region, *backend, *gpus, *mems, *stats_path, *sched_dir, *sched_ids;
	struct sched_share share[VG_MAX_DEVICES];
	int no_sched, ctx_reserve_set, allow_pageable, mps_threads;
	int sweep, serving; /* --sweep; an option only serving takes was given */
	long sweep_after;   /* --after PID, or 0 */
	int mps_priority; /* VH_MPS_PRIO_*, or -1: not given */
	int mps_when;     /* VH_MPS_*, or -1: not given */
	int sm_partitions; /* 1 on, 0 off, -1 auto (on in the workers that are MPS clients) */
	const char *mps_dir;
	uint64_t create;
	struct vmgpu_shm_params params;
	struct vmgpu_wait_opts wopts;
};

/* A share field per GPU (--weight, --cap, --guarantee, --priority LIST), the last one for the
 * GPUs not named: a number in lo..hi, or (lo < 0) high, normal or low. */
static int parse_share(const char *flag, const char *arg, struct sched_share share[VG_MAX_DEVICES], int lo, int hi)
{
	char *list = strdup(arg), *save = NULL;
	int n = 0, val[VG_MAX_DEVICES];
	uint64_t v;
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int ok = n < VG_MAX_DEVICES;
		if (ok && lo < 0) {
			ok = !strcmp(t, "high") || !strcmp(t, "normal") || !strcmp(t, "low");
			val[n] = !strcmp(t, "high")  ? VMGPU_SCHED_PRIO_HIGH
				 : !strcmp(t, "low") ? VMGPU_SCHED_PRIO_LOW
						     : VMGPU_SCHED_PRIO_NORMAL;
		} else if (ok) {
			ok = !vh_parse_size(t, &v) && v >= (uint64_t)lo && v <= (uint64_t)hi;
			val[n] = (int)v;
		}
		if (!ok) {
			free(list);
			if (lo < 0)
				return vh_die("--%s: '%s' is not a list of high, normal or low", flag, arg);
			return vh_die("--%s: '%s' is not a list of numbers in %d..%d", flag, arg, lo, hi);
		}
		n++;
	}
	free(list);
	if (!n)
		return vh_die("--%s: the list is empty", flag);
	for (int d = 0; d < VG_MAX_DEVICES; d++) {
		int x = val[d < n ? d : n - 1];
		if (!strcmp(flag, "cap"))
			share[d].cap = x;
		else if (!strcmp(flag, "guarantee"))
			share[d].guarantee = x;
		else if (!strcmp(flag, "priority"))
			share[d].priority = x;
		else
			share[d].weight = x;
	}
	return 0;
}

/* 0, 1 (an error, said), or -1: exit with status 0 (--help) or 2 (usage) as *status says. */
static int parse_options(int argc, char **argv, struct options *o, int *status)
{
	static const struct option opts[] = {
		{"region", 1, 0, 'r'}, {"create", 1, 0, 'c'}, {"backend", 1, 0, 'b'}, {"gpus", 1, 0, 'g'},
		{"mem", 1, 0, 'm'}, {"guest", 1, 0, 'n'}, {"channels", 1, 0, 'C'}, {"bulk", 1, 0, 'B'},
		{"wait", 1, 0, 'w'}, {"peer-timeout", 1, 0, 't'}, {"stats", 1, 0, 's'}, {"help", 0, 0, 'h'},
		{"compute", 1, 0, 'W'}, {"weight", 1, 0, 'W'}, {"cap", 1, 0, 'K'}, {"guarantee", 1, 0, 'G'},
		{"priority", 1, 0, 'p'}, {"sched-dir", 1, 0, 'D'}, {"no-sched", 0, 0, 'N'}, {"sched-id", 1, 0, 'I'},
		{"ctx-reserve", 1, 0, 'R'}, {"oom-script", 1, 0, 'O'}, {"allow-pageable-access", 0, 0, 'P'},
		{"mps", 1, 0, 'M'}, {"mps-threads", 1, 0, 'T'}, {"mps-priority", 1, 0, 'Y'}, {"mps-when", 1, 0, 'H'},
		{"sched-depth", 1, 0, 'Q'}, {"yield-depth", 1, 0, 'y'}, {"sm-partitions", 1, 0, 'S'}, {"sweep", 0, 0, 'X'},
		{"after", 1, 0, 'A'}, {0, 0, 0, 0},
	};
	int c;
	uint64_t v;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		o->serving |= c != 's' && c != 'n' && c != 'X' && c != 'A' && c != 'h' && c != '?';
		switch (c) {
		case 'r': o->region = optarg; break;
		case 'c':
			if (vh_parse_size(optarg, &o->create) || !o->create)
				return vh_die("--create: '%s' is not a size", optarg);
			break;
		case 'b': o->backend = optarg; break;
		case 'g': o->gpus = optarg; break;
		case 'm': o->mems = optarg; break;
		case 'n': F.guest = optarg; break;
		case 'C':
			if (vh_parse_size(optarg, &v) || v < 1 || v > VMGPU_MAX_CHANNELS)
				return vh_die("--channels: '%s' is not in 1..%d", optarg, VMGPU_MAX_CHANNELS);
			o->params.nchannels = (uint32_t)v;
			break;
		case 'B':
			if (vh_parse_size(optarg, &v))
				return vh_die("--bulk: '%s' is not a size", optarg);
			o->params.bulk_size = v;
			break;
		case 'w':
			if (!strcmp(optarg, "futex"))
				o->params.wait_mode = VMGPU_WAIT_FUTEX;
			else if (!strcmp(optarg, "poll"))
				o->params.wait_mode = VMGPU_WAIT_POLL;
			else
				return vh_die("--wait: '%s' is neither futex nor poll", optarg);
			break;
		case 't':
			if (vh_parse_size(optarg, &v) || v < 1)
				return vh_die("--peer-timeout: '%s' is not a number of seconds", optarg);
			o->wopts.peer_timeout_ns = v * 1000000000ull;
			break;
		case 's': o->stats_path = optarg; break;
		case 'W':
			if (parse_share("weight", optarg, o->share, 1, 100))
				return 1;
			break;
		case 'K':
			if (parse_share("cap", optarg, o->share, 0, 100))
				return 1;
			break;
		case 'G':
			if (parse_share("guarantee", optarg, o->share, 0, 100))
				return 1;
			break;
		case 'p':
			if (parse_share("priority", optarg, o->share, -1, 0))
				return 1;
			break;
		case 'D': o->sched_dir = optarg; break;
		case 'I': o->sched_ids = optarg; break;
		case 'N': o->no_sched = 1; break;
		case 'R':
			if (vh_parse_size(optarg, &F.ctx_reserve))
				return vh_die("--ctx-reserve: '%s' is not a size", optarg);
			o->ctx_reserve_set = 1;
			break;
		case 'O':
			if (access(optarg, X_OK) != 0)
				return vh_die("--oom-script: %s is not an executable file", optarg);
			F.oom_script = optarg;
			break;
		case 'P': o->allow_pageable = 1; break;
		case 'X': o->sweep = 1; break;
		case 'A':
			if (vh_parse_size(optarg, &v) || v < 1 || v > INT32_MAX)
				return vh_die("--after: '%s' is not a process id", optarg);
			o->sweep_after = (long)v;
			break;
		case 'M': o->mps_dir = optarg; break;
		case 'Y':
			o->mps_priority = !strcmp(optarg, "auto")     ? VH_MPS_PRIO_AUTO
					  : !strcmp(optarg, "normal") ? VH_MPS_PRIO_NORMAL
					  : !strcmp(optarg, "below")  ? VH_MPS_PRIO_BELOW
					  : !strcmp(optarg, "driver") ? VH_MPS_PRIO_DRIVER
								      : -1;
			if (o->mps_priority < 0)
				return vh_die("--mps-priority: '%s' is not auto, normal, below or driver", optarg);
			break;
		case 'H':
			o->mps_when = !strcmp(optarg, "always") ? VH_MPS_ALWAYS : !strcmp(optarg, "shared") ? VH_MPS_SHARED : -1;
			if (o->mps_when < 0)
				return vh_die("--mps-when: '%s' is not always or shared", optarg);
			break;
		case 'T':
			if (vh_parse_size(optarg, &v) || v < 1 || v > 100)
				return vh_die("--mps-threads: '%s' is not a percentage in 1..100", optarg);
			o->mps_threads = (int)v;
			break;
		case 'Q':
			if (vh_parse_size(optarg, &v) || v > VH_DEPTH_MAX)
				return vh_die("--sched-depth: '%s' is not a number in 0..%d", optarg, VH_DEPTH_MAX);
			F.sched_depth = (int)v;
			break;
		case 'y':
			if (vh_parse_size(optarg, &v) || v > VH_DEPTH_MAX)
				return vh_die("--yield-depth: '%s' is not a number in 0..%d", optarg, VH_DEPTH_MAX);
			F.yield_depth = (int)v;
			break;
		case 'S':
			o->sm_partitions = !strcmp(optarg, "on") ? 1 : !strcmp(optarg, "off") ? 0 : !strcmp(optarg, "auto") ? -1 : -2;
			if (o->sm_partitions == -2)
				return vh_die("--sm-partitions: '%s' is not auto, on or off", optarg);
			break;
		case 'h': usage(stdout); *status = 0; return -1;
		default: usage(stderr); *status = 2; return -1;
		}
	}
	if (o->sweep && (o->region || o->serving))
		return vh_die("--sweep serves no region: it takes only --after, --stats and --guest");
	if (o->sweep_after && !o->sweep)
		return vh_die("--after goes with --sweep");
	if ((!o->region && !o->sweep) || optind != argc) {
		usage(stderr);
		*status = 2;
		return -1;
	}
	return 0;
}

/* --mps DIR: the workers are clients of the MPS control daemon whose pipes are in DIR, which must
 * be root's or ours and writable by no one else (whoever could put a pipe there would be served
 * every call of the guest's as its MPS server); its guest's kernels may run beside other clients'
 * on the GPU's SMs, each client on at most --mps-threads % of them.  The forwarder still takes
 * part in its GPUs' scheduling: under the shared policy its guest runs beside the others, held
 * back only as the share controller says; under the policies with turns, it takes turns. */
static int use_mps(struct options *o)
{
	/* no MPS but in the workers that are clients (vh_worker names DIR there): the driver would
	 * otherwise look for a control daemon in /tmp/nvidia-mps, a directory any local user can make,
	 * and have every guest process (and the forwarder's probe of its GPUs) served by it */
	setenv("CUDA_MPS_PIPE_DIRECTORY", VH_NO_MPS_DIR, 1);
	if (!o->mps_dir) {
		if (o->mps_threads || o->mps_priority >= 0 || o->mps_when >= 0)
			return vh_die("%s needs --mps DIR", o->mps_threads ? "--mps-threads"
							   : o->mps_when >= 0 ? "--mps-when"
									      : "--mps-priority");
		return 0;
	}
	struct stat st;
	if (lstat(o->mps_dir, &st) != 0)
		return vh_die("--mps: %s: %s", o->mps_dir, strerror(errno));
	if (!S_ISDIR(st.st_mode) || (st.st_uid != 0 && st.st_uid != geteuid()) || (st.st_mode & 077))
		return vh_die("--mps: %s must be a directory (not a link) of root's or ours that no one else can "
			      "reach (0700): a pipe put there by someone else would be served every call of the "
			      "guest's, and anyone who reaches the daemon's control pipe can stop it",
			      o->mps_dir);
	char pct[8];
	snprintf(pct, sizeof pct, "%d", o->mps_threads ? o->mps_threads : 100);
	F.mps_dir = o->mps_dir;
	setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", pct, 1);
	for (int d = 0; d < VG_MAX_DEVICES; d++)
		F.high_opt[d] = o->share[d].priority == VMGPU_SCHED_PRIO_HIGH;
	F.mps_priority = o->mps_priority >= 0 ? o->mps_priority : VH_MPS_PRIO_AUTO; /* (set by each worker: vh_worker) */
	F.mps = o->mps_when >= 0 ? o->mps_when : VH_MPS_ALWAYS; /* (each worker decides: mps_client in worker.c) */
	if (BK.simulated)
		vh_log("--mps: the simulated backend opens no MPS client: its workers only act as clients would");
	return 0;
}

/* The workers an earlier forwarder's page (fd) says were serving when it ended: what the CUDA
 * driver left in /dev/shm for those that ended with it (killed at one stroke, as a cgroup is) is
 * removed, since nobody else will.  A page of another version, or of an earlier boot (/dev/shm
 * has been emptied since, and its pids mean nothing now), has no workers to go by. */
static void sweep_earlier_workers(int fd, const char *path)
{
	struct {
		uint64_t magic;
		uint32_t version;
	} head;
	static struct vmgpu_stats_worker was[VMGPU_STATS_WORKERS];
	char boot[48], now[48];
	if (pread(fd, &head, sizeof head, 0) != (ssize_t)sizeof head || head.magic != VMGPU_STATS_MAGIC ||
	    head.version != VMGPU_STATS_VERSION ||
	    pread(fd, boot, sizeof boot, offsetof(struct vmgpu_stats_page, boot_id)) != (ssize_t)sizeof boot ||
	    pread(fd, was, sizeof was, offsetof(struct vmgpu_stats_page, worker)) != (ssize_t)sizeof was ||
	    vh_boot_id(now) != 0 || memcmp(boot, now, sizeof now) != 0)
		return;
	int removed = 0, workers = 0, ending = 0;
	for (uint32_t i = 0; i < VMGPU_STATS_WORKERS; i++) {
		pid_t pid = (pid_t)atomic_load(&was[i].pid);
		if (pid <= 0)
			continue;
		workers++;
		int n = vh_driver_files_sweep(pid, was[i].forked_ns, was[i].started);
		ending += n == VH_SWEEP_STILL_ENDING;
		removed += n > 0 ? n : 0;
	}
	if (workers)
		vh_log("%s: an earlier forwarder ended with %d worker(s) at work; removed %d file(s) the CUDA "
		       "driver left in /dev/shm for them; %d still ending (looked at again as they end)",
		       path, workers, removed, ending);
}

/* --sweep: what forwarders that are gone left behind and no forwarder starting will remove (vmgpud
 * runs it when it stops a guest's forwarder, --after its pid: a forwarder killed is not gone until
 * its memory is, and a cache whose forwarder lives is left): the image caches of this user's
 * forwarders that are gone, and with --stats what the driver left for the workers the page names
 * (read, never made afresh: a forwarder starting for the guest makes it).  What workers still
 * ending hold is looked at again every 64 ms for VH_SWEEP_PENDING_S at most.  0 once everything
 * is looked at; 1 if the page was refused (the caches swept all the same). */
static int sweep_only(const struct options *o)
{
	uint64_t until = vh_real_clock.now_ns() + VH_SWEEP_PENDING_S * 1000000000ull;
	while (o->sweep_after && !vh_proc_gone((uint32_t)o->sweep_after)) {
		if (vh_real_clock.now_ns() >= until) {
			vh_log("process %ld is still there after %d s: what it left is not swept", o->sweep_after,
			       VH_SWEEP_PENDING_S);
			break;
		}
		usleep(64000);
	}
	struct stat st;
	int refused = 0;
	if (o->stats_path && lstat(o->stats_path, &st) == 0) {
		int fd = vh_open_ours(o->stats_path, O_RDONLY);
		if (fd >= 0) {
			sweep_earlier_workers(fd, o->stats_path);
			close(fd);
		} else {
			refused = 1;
			vh_log("error: --stats %s: %s: the driver's files of its workers are not looked for", o->stats_path,
			       strerror(errno));
		}
	}
	vh_images_sweep();
	while (vh_driver_files_sweep_pending() + vh_images_sweep_pending() > 0)
		usleep(64000);
	return refused;
}

/* The statistics page: in a file vmgpud can read (--stats), or anonymous; shared with the workers. */
static int map_stats(const char *path)
{
	int fd = -1, flags = MAP_SHARED | MAP_ANONYMOUS;
	if (path) {
		/* an earlier forwarder's page: never through a link, never a file someone else made
		 * (vmgpud keeps it in its own private directory); the workers it names are seen to */
		struct stat st;
		if (lstat(path, &st) == 0) {
			int old = vh_open_ours(path, O_RDONLY);
			if (old < 0)
				return vh_die("--stats %s: %s", path, strerror(errno));
			sweep_earlier_workers(old, path);
			close(old);
		}
		/* then the page afresh, in one step: a process that still maps the earlier one (or reads
		 * it) keeps that to itself */
		fd = vh_fresh_file(path, sizeof *F.stats, "statistics page");
		if (fd < 0)
			return vh_die("--stats %s: %s", path, strerror(errno));
		flags = MAP_SHARED;
	}
	F.stats = mmap(NULL, sizeof *F.stats, PROT_READ | PROT_WRITE, flags, fd, 0);
	if (fd >= 0)
		close(fd);
	if (F.stats == MAP_FAILED)
		return vh_die("cannot map the statistics page: %s", strerror(errno));
	memset(F.stats, 0, sizeof *F.stats);
	F.stats->version = VMGPU_STATS_VERSION;
	F.stats->ndev = (uint32_t)F.ndev;
	for (int i = 0; i < F.ndev; i++)
		F.stats->quota[i] = F.quota[i];
	if (vh_boot_id(F.stats->boot_id) != 0)
		vh_log("cannot read /proc/sys/kernel/random/boot_id: should this forwarder be killed with its "
		       "workers, the next will not remove what the CUDA driver left for them");
	F.used = F.stats->used;
	atomic_thread_fence(memory_order_release);
	F.stats->magic = VMGPU_STATS_MAGIC; /* last: a reader sees a complete header */
	return 0;
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

static int join_schedulers(const struct options *o)
{
	const char *dir = o->sched_dir && *o->sched_dir ? o->sched_dir : VS_DIR;
	for (int d = 0; d < F.ndev && !o->no_sched; d++) {
		char uuid[64];
		vh_uuid_str(F.info[d].uuid, uuid, sizeof uuid);
		if (o->sched_ids && sched_id(o->sched_ids, d, uuid, sizeof uuid))
			return vh_die("--sched-id: '%s' names no page for GPU %d (UUIDs of letters, digits and '-')",
				      o->sched_ids, d);
		if (vh_sched_join(&F.sched[d], dir, uuid, F.guest, &o->share[d], d))
			return vh_die("cannot join the compute scheduler of %s in %s: %s", uuid, dir, strerror(errno));
	}
	return 0;
}

/* Each worker's row of the quota and its scheduler membership, shared, so that both come back
 * however the worker ends; and the lock its contexts are made under. */
static int map_shared_rows(uint32_t nchannels)
{
	size_t rows = nchannels * sizeof *F.charged, joined = nchannels * sizeof *F.sched_joined;
	F.charged = mmap(NULL, rows, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	F.ahead = mmap(NULL, nchannels * sizeof *F.ahead, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	F.sched_joined = mmap(NULL, joined, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	F.broker = -1;
	F.shared = mmap(NULL, sizeof *F.shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (F.charged == MAP_FAILED || F.ahead == MAP_FAILED || F.sched_joined == MAP_FAILED || F.shared == MAP_FAILED)
		return vh_die("cannot map the memory quota's rows: %s", strerror(errno));
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&F.shared->ctx_mu, &ma);
	pthread_mutex_init(&F.shared->ipc_mu, &ma);
	return 0;
}

int main(int argc, char **argv)
{
	struct options o = {.backend = "cuda", .gpus = "0", .sched_dir = getenv("VMGPU_SCHED_DIR"), .mps_priority = -1,
			  .mps_when = -1, .sm_partitions = -1};
	for (int i = 0; i < VG_MAX_DEVICES; i++)
		o.share[i] = (struct sched_share){.weight = 100, .priority = VMGPU_SCHED_PRIO_NORMAL};
	vmgpu_shm_params_default(&o.params);
	vmgpu_wait_opts_default(&o.wopts);
	F.guest = "guest";
	F.clock = &vh_real_clock;
	F.sched_depth = 32;
	int status = 0, r = parse_options(argc, argv, &o, &status);
	if (r)
		return r < 0 ? status : r;
	if (o.sweep)
		return sweep_only(&o);
	if (F.yield_depth && !F.sched_depth)
		return vh_die("--yield-depth %d needs a --sched-depth (0 holds no depth at all)", F.yield_depth);
	backend_name = o.backend;
	BK.simulated = !strcmp(o.backend, "sim");
	/* what forwarders that are gone left: first, before anything that could make this start fail (a
	 * forwarder vmgpud restarts again and again sweeps the one before it even so) */
	vh_images_sweep();
	if (!o.ctx_reserve_set) /* an H100 context with driver 580, measured; the simulated one has none */
		F.ctx_reserve = BK.simulated ? 0 : 544ull << 20;
	if (strcmp(o.backend, "sim") && strcmp(o.backend, "cuda"))
		return vh_die("unknown backend '%s' (cuda or sim)", o.backend);
	if (use_mps(&o) || vh_devices_probe(o.gpus, o.mems, o.allow_pageable) || map_stats(o.stats_path))
		return 1;
	/* (without MPS, different processes' partitions take turns on the GPU: nothing is gained; under
	 * auto each worker partitions if it is an MPS client: vh_worker) */
	F.sm_partitions = o.sm_partitions;

	int fd = vh_region_open(o.region, o.create); /* never through a link, never someone else's file */
	if (fd < 0)
		return vh_die("cannot open region %s: %s", o.region, strerror(errno));
	struct stat st;
	fstat(fd, &st);
	F.region_size = (uint64_t)st.st_size;
	F.region = mmap(NULL, F.region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (F.region == MAP_FAILED)
		return vh_die("cannot map region %s: %s", o.region, strerror(errno));
	vh_region_guard(); /* the fd stays open: the supervisor watches the file's size */
	if (o.create && vmgpu_region_format(F.region, F.region_size, &o.params, F.guest) != 0)
		return vh_die("cannot format region %s: %s", o.region, vmgpu_shm_errmsg());
	if (vmgpu_host_attach(F.region, F.region_size, &o.params, &o.wopts, &F.host) != 0)
		return vh_die("cannot serve region %s: %s", o.region, vmgpu_shm_errmsg());
	vh_images_open(&F); /* none: every image crosses */
	vh_images_jit_cache(&F);
	if (join_schedulers(&o))
		return 1;

	const struct vmgpu_layout *L = vmgpu_host_layout(F.host);
	F.heap_off = L->heap_off;
	F.heap_size = L->heap_size;
	vh_log("serving %s (%llu MiB, %u channels) on %d GPU(s): %s, quota %llu MiB; driver %d", o.region,
	       (unsigned long long)(F.region_size >> 20), L->nchannels, F.ndev, F.info[0].name,
	       (unsigned long long)(F.quota[0] >> 20), F.driver_version);
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (map_shared_rows(L->nchannels))
		return 1;
	return vh_supervise(fd, &o.params, &o.wopts);
}
