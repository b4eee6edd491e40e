/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The supervisor: the forwarder's first process, after start-up (main.c).  It keeps the region:
 * beats the host heartbeat, puts back what the guest scribbled over in the header, restores a
 * region file the guest truncated, watches the channel table, starts a worker (worker.c) for each
 * guest process that opens a channel and reaps it when it ends, giving back its charges and its
 * place in the GPUs' schedulers however it ended.  It never touches CUDA.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fd_broker.h"
#include "images.h"
#include "ipc.h"
#include "proc.h"
#include "process.h"
#include "region_file.h"

struct slot {
	pid_t worker; /* serving this channel, 0 if none */
	int sock;     /* the supervisor's end of its descriptor socket (fd_broker.c), or -1 */
};

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

void vh_region_guard(void)
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

/* ---- workers' lives ----------------------------------------------------------------- */

/* A worker ended: give back its row of the quota and its place in its GPUs' scheduler
 * slots, however it ended, and fence its channel (reclaimed by the supervisor's loop). */
static void worker_ended(struct slot *slots, uint32_t i, pid_t pid, int status, uint8_t *fence)
{
	slots[i].worker = 0;
	if (slots[i].sock >= 0)
		close(slots[i].sock);
	slots[i].sock = -1;
	for (int d = 0; d < F.ndev; d++) {
		atomic_fetch_sub(&F.used[d], atomic_exchange(&F.charged[i][d], 0));
		atomic_store(&F.ahead[i][d], 0);
		if (atomic_exchange(&F.sched_joined[i][d], 0))
			vh_sched_worker(&F.sched[d], -1); /* it could not say so itself */
	}
	fence[i] = 1;
	vh_ipc_forget_channel(&F, i); /* its IPC handles open nothing new, however it ended */
	if (WIFSIGNALED(status))
		vh_log("channel %u: worker %d died (signal %d); the guest process loses its GPU", i, (int)pid,
		       WTERMSIG(status));
	else if (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != VH_EXIT_PROTOCOL)
		vh_log("channel %u: worker %d failed (exit %d); the guest process loses its GPU", i, (int)pid,
		       WEXITSTATUS(status));
}

/* Reap the workers that ended (waiting for them if block).  Returns how many are left.  What
 * the driver left in /dev/shm for one is removed first, while it is a zombie: its pid is no
 * other process's until it is reaped. */
static uint32_t reap(struct slot *slots, uint32_t n, uint8_t *fence, int block)
{
	int status;
	siginfo_t info;
	for (;;) {
		info.si_pid = 0;
		if (waitid(P_ALL, 0, &info, WEXITED | WNOWAIT | (block ? 0 : WNOHANG)) != 0 || info.si_pid <= 0)
			break;
		pid_t pid = info.si_pid;
		int removed = vh_driver_files_remove(pid);
		for (uint32_t i = 0; i < n; i++) /* (before its pid is free again: the page names it no more) */
			if (slots[i].worker == pid)
				atomic_store_explicit(&F.stats->worker[i].pid, 0, memory_order_release);
		if (waitpid(pid, &status, 0) != pid)
			break;
		for (uint32_t i = 0; i < n; i++)
			if (slots[i].worker == pid) {
				if (removed)
					vh_log("channel %u: removed %d file(s) the CUDA driver left in /dev/shm for worker %d",
					       i, removed, (int)pid);
				worker_ended(slots, i, pid, status, fence);
			}
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
static void start_worker(struct slot *slots, uint32_t n, uint32_t i)
{
	for (int d = 0; d < F.ndev; d++) {
		vh_sched_worker(&F.sched[d], 1);
		atomic_store(&F.sched_joined[i][d], 1);
	}
	int worker_end;
	slots[i].sock = vh_broker_pair(&worker_end);
	struct vmgpu_stats_worker *rec = &F.stats->worker[i]; /* (the page outlives this process) */
	rec->started = 0;
	rec->forked_ns = vh_coarse_realtime_ns(); /* (every file the driver makes for it is later) */
	pid_t self = getpid(), pid = fork();
	if (pid == 0) {
		atomic_store_explicit(&rec->pid, (uint32_t)getpid(), memory_order_release); /* (first thing) */
		/* the worker keeps its own end only: no other worker's socket, no descriptor the
		 * supervisor holds */
		int ends[n];
		for (uint32_t k = 0; k < n; k++)
			ends[k] = slots[k].sock;
		vh_broker_child(ends, n);
		F.broker = worker_end;
		_exit(vh_worker(i, self));
	}
	if (worker_end >= 0)
		close(worker_end);
	if (pid > 0) {
		slots[i].worker = pid;
		/* were this process killed with its workers at one stroke, the next forwarder given the
		 * page removes what the driver left for them */
		uint64_t started = 0;
		if (vh_proc_started((uint32_t)pid, &started) == 0)
			rec->started = started; /* (before the pid: the pair names the process) */
		atomic_store_explicit(&rec->pid, (uint32_t)pid, memory_order_release);
		return;
	}
	if (slots[i].sock >= 0)
		close(slots[i].sock);
	slots[i].sock = -1;
	vh_log("channel %u: cannot start a worker: %s", i, strerror(errno));
	for (int d = 0; d < F.ndev; d++)
		if (atomic_exchange(&F.sched_joined[i][d], 0))
			vh_sched_worker(&F.sched[d], -1);
}

/* One look at every channel without a worker: start one for a new owner, reclaim a channel
 * whose owner is done. */
static void watch_channels(struct slot *slots, uint32_t n, uint8_t *fence)
{
	uint64_t now = vmgpu_now_ns();
	for (uint32_t i = 0; i < n; i++) {
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
			start_worker(slots, n, i);
		}
	}
}

/* Stop: workers finish their call and free what their process held; one that does not within
 * a few seconds (stuck in the driver) is killed. */
static void stop_workers(struct slot *slots, uint32_t n, uint8_t *fence)
{
	signal_workers(slots, n, SIGTERM);
	uint64_t deadline = vmgpu_now_ns() + 5000000000ull;
	while (reap(slots, n, fence, 0) && vmgpu_now_ns() < deadline) {
		struct timespec ts = {0, 5 * 1000000};
		nanosleep(&ts, NULL);
	}
	signal_workers(slots, n, SIGKILL);
	reap_all(slots, n, fence);
}

int vh_supervise(int fd, const struct vmgpu_shm_params *params, const struct vmgpu_wait_opts *wopts)
{
	const struct vmgpu_layout *L = vmgpu_host_layout(F.host);
	struct slot *slots = calloc(L->nchannels, sizeof *slots);
	uint8_t *fence = calloc(L->nchannels, 1);
	struct pollfd *pfd = calloc(L->nchannels, sizeof *pfd);
	uint32_t *pchan = calloc(L->nchannels, sizeof *pchan);
	for (uint32_t i = 0; i < L->nchannels; i++)
		slots[i].sock = -1;
	vh_broker_init(L->nchannels);
	uint32_t turns = 0;
	while (!stopping) {
		vmgpu_host_beat(F.host);
		vmgpu_host_republish(F.host); /* what the host owns in the header, put back if scribbled */
		if (region_restore(fd)) {
			/* every guest process loses its channel; the region starts again, empty */
			signal_workers(slots, L->nchannels, SIGKILL);
			reap_all(slots, L->nchannels, fence);
			vmgpu_host_detach(F.host);
			F.host = NULL;
			if (vmgpu_region_format(F.region, F.region_size, params, F.guest) != 0 ||
			    vmgpu_host_attach(F.region, F.region_size, params, wopts, &F.host) != 0) {
				vh_log("cannot format the region again: %s", vmgpu_shm_errmsg());
				break;
			}
			L = vmgpu_host_layout(F.host);
			vh_log("the region is formatted afresh and served again");
			memset(fence, 0, L->nchannels);
		}
		reap(slots, L->nchannels, fence, 0);
		if (turns % 32 == 0) { /* every 64 ms: an earlier forwarder's workers still ending */
			vh_driver_files_sweep_pending();
			vh_images_sweep_pending();
		}
		for (int d = 0; d < F.ndev; d++)
			vh_sched_unheld(&F.sched[d]);
		watch_channels(slots, L->nchannels, fence);
		if (++turns % 8 == 0)
			vh_broker_sweep(&F); /* every 16 ms: a released handle's descriptor is closed soon after */
		/* wait 2 ms, answering workers' descriptor requests (fd_broker.c) meanwhile */
		nfds_t np = 0;
		for (uint32_t i = 0; i < L->nchannels; i++)
			if (slots[i].worker && slots[i].sock >= 0) {
				pfd[np] = (struct pollfd){.fd = slots[i].sock, .events = POLLIN};
				pchan[np++] = i;
			}
		uint64_t until = vmgpu_now_ns() + 2000000ull;
		for (uint64_t now = vmgpu_now_ns(); now < until && !stopping; now = vmgpu_now_ns()) {
			int k = poll(pfd, np, (int)((until - now + 999999) / 1000000));
			for (nfds_t j = 0; k > 0 && j < np; j++) {
				if ((pfd[j].revents & POLLIN) && vh_broker_serve(&F, pfd[j].fd, pchan[j]) == 0)
					continue;
				if (pfd[j].revents)
					pfd[j].fd = -1; /* its worker is gone: reaped at the next turn */
			}
			if (k <= 0)
				break;
		}
	}
	vh_log("stopping");
	stop_workers(slots, L->nchannels, fence);
	close(fd);
	free(slots);
	free(fence);
	free(pfd);
	free(pchan);
	for (int d = 0; d < F.ndev; d++)
		vh_sched_leave(&F.sched[d]);
	vmgpu_host_close(F.host);
	vmgpu_host_detach(F.host);
	munmap(F.region, F.region_size);
	vh_images_close(&F);
	return 0;
}
