/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A worker: the forked process that serves one guest process's channel.  It opens the driver,
 * makes nothing on a GPU until its guest process asks (context.c), serves the channel on one
 * thread (serve.c) while a second thread takes part in the GPUs' compute scheduling and
 * refreshes the quota's charges, and at the end destroys what the guest process held and takes
 * its charges back itself.  The supervisor counted it into the scheduler before forking it.
 */
#include <signal.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "context.h"
#include "log.h"
#include "meter.h"
#include "process.h"
#include "quota.h"
#include "region_file.h"
#include "sched_policy.h"

/* ---- the compute scheduler's thread in a worker ------------------------------------ */

static _Atomic int sched_stop;
static CUcontext *_Atomic sched_ctx; /* the served channel's contexts (ch.ctx) */

static void sched_drain(void *arg, int dev)
{
	(void)arg;
	atomic_fetch_add(&ctx_draining, 1);
	if (atomic_load(&open_captures) > 0 || atomic_load(&capture_beginning)) {
		/* a context-wide wait would break the capture: the streams' drain marks instead.  A
		 * capture's begin under way first waits itself for the work queued before it, which no
		 * mark covers (serve.c: vh_capture_opening): that wait is this drain's too */
		atomic_fetch_sub(&ctx_draining, 1);
		while (atomic_load(&capture_beginning)) {
			struct timespec t = {0, 20000};
			nanosleep(&t, NULL);
		}
		vh_capture_drain(&BK, dev);
		return;
	}
	CUcontext *ctx = atomic_load(&sched_ctx);
	/* (counted on its GPU before the load: a context dropped after this load is released only once
	 * this synchronisation is over, context.c: context_drop) */
	atomic_fetch_add(&ctx_draining_on[dev], 1);
	CUcontext c = ctx ? __atomic_load_n(&ctx[dev], __ATOMIC_SEQ_CST) : NULL;
	if (c)
		BK.cuCtxSynchronize_v2(c); /* a fault's error stays for the guest's own next call */
	atomic_fetch_sub(&ctx_draining_on[dev], 1);
	atomic_fetch_sub(&ctx_draining, 1);
	vh_capture_drain(&BK, dev); /* and the marks of graphs launched from another GPU's stream */
}

/* One scheduler thread per guest GPU, each asleep on its own GPU's page, so that a wake there (a
 * higher-priority guest waits, a hand-over begins) reaches it at once on every GPU; the first
 * also refreshes the quota's charges. */
struct sched_arg {
	struct vh_chan *ch;
	int dev;
};

static void *sched_thread(void *arg)
{
	struct sched_arg *a = arg;
	struct vh_chan *ch = a->ch;
	struct vh_sched *s = &F.sched[a->dev];
	/* this thread's drains must not break a stream capture the guest has open in the serving
	 * thread (a global-mode capture forbids other threads' synchronisation unless relaxed) */
	CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
	BK.cuThreadExchangeStreamCaptureMode(&relaxed);
	uint64_t last_calls = 0, quiet_since = vmgpu_now_ns(), refreshed = quiet_since;
	uint32_t reads_answered = 0; /* (the asks of other workers refused on the charges: vh_quota_asked) */
	while (!atomic_load(&sched_stop)) {
		uint32_t looked = vh_sched_look(s); /* before the tick: no wake is missed */
		atomic_store_explicit(&s->in_call, atomic_load_explicit(&ch->in_call, memory_order_relaxed) == a->dev + 1,
				      memory_order_relaxed);
		vh_sched_tick(s, sched_drain, NULL);
		uint64_t now = vmgpu_now_ns(), calls = atomic_load_explicit(&ch->ncalls, memory_order_relaxed);
		if (calls != last_calls) {
			last_calls = calls;
			quiet_since = now;
		}
		/* every 50 ms, and at once where another worker waits on charges of this one's that may be
		 * ahead of the truth (until they are read) */
		if (a->dev == 0 && (now - refreshed >= 50000000ull || vh_quota_asked(ch, &reads_answered))) {
			vh_quota_refresh(ch);
			refreshed = now;
		}
		/* every 250 us while the guest process works; a process quiet for 20 ms is looked after
		 * every 1 ms, so that an idle guest costs the host little CPU; woken sooner by its page */
		vh_sched_nap(s, looked, now - quiet_since > 20000000ull ? 1000 * 1000 : 250 * 1000);
	}
	return NULL;
}

/* Whether this worker's guest process is an MPS client (--mps): always, or under --mps-when shared
 * if one of its GPUs' policy is shared as it starts.  A process that is not one keeps a context of
 * its own, outside the MPS server's fault domain; a policy changed to shared later reaches the guest's
 * processes started after it (until then the share controller holds this one by time: it follows no
 * span, partition.h). */
static int mps_client(void)
{
	if (F.mps != VH_MPS_SHARED)
		return F.mps == VH_MPS_ALWAYS;
	for (int d = 0; d < F.ndev; d++)
		if (F.sched[d].pg && atomic_load(&F.sched[d].pg->policy) == VMGPU_SCHED_SHARED)
			return 1;
	return 0;
}

/* ---- a worker whose supervisor is gone ---------------------------------------------- */

static pid_t supervisor_pid;

/* The supervisor's death signal (PR_SET_PDEATHSIG): the supervisor is gone (killed, or crashed),
 * so no one will remove what the driver left in /dev/shm for this worker once it is killed, as the
 * supervisor does for the workers it reaps (supervisor.c: reap), and init, which reaps it now, does
 * not.  It removes those files itself, says so, and ends at once, as a SIGKILL would: the guest
 * must see the host go.  Only async-signal-safe calls here.  A worker whose threads all
 * blocked the signal would outlive its supervisor: vh_worker unblocks it before its threads are made
 * (a mask the forwarder was started with is inherited), and none of them blocks it after. */
static void on_orphaned(int sig)
{
	(void)sig;
	if (getppid() == supervisor_pid)
		return; /* (sent by someone else: the supervisor is there) */
	char pid[24], n[24];
	vh_decimal(pid, (unsigned long long)getpid());
	vh_decimal(n, (unsigned long long)vh_driver_files_remove_mine());
	const char *line[] = {"worker ", pid, ": its supervisor is gone: removed ", n,
			      " file(s) the CUDA driver made in /dev/shm for it; it ends (its guest process loses its GPU)",
			      NULL};
	vh_log_in_handler(line);
	_exit(VH_EXIT_ORPHANED);
}

/* In a worker: open the driver, serve one channel, free what the guest process held. */
int vh_worker(uint32_t idx, pid_t supervisor)
{
	char err[512];
	signal(SIGTERM, on_signal);
	/* a worker does not outlive its supervisor: the guest must see the host go (on_orphaned) */
	supervisor_pid = supervisor;
	struct sigaction orphaned = {.sa_handler = on_orphaned, .sa_flags = SA_RESTART};
	sigfillset(&orphaned.sa_mask);
	sigaction(VH_ORPHAN_SIGNAL, &orphaned, NULL);
	/* (a mask is inherited through fork and exec: whoever started the forwarder may have blocked
	 * it; the threads made from here on inherit this one's) */
	sigset_t death;
	sigemptyset(&death);
	sigaddset(&death, VH_ORPHAN_SIGNAL);
	pthread_sigmask(SIG_UNBLOCK, &death, NULL);
	prctl(PR_SET_PDEATHSIG, VH_ORPHAN_SIGNAL);
	if (getppid() != supervisor)
		return 3;
	signal(SIGINT, SIG_IGN); /* the supervisor decides when workers stop */
	if (vh_backend_load(&BK, backend_name, err, sizeof err)) {
		vh_log("channel %u: %s", idx, err);
		return 3;
	}
	const struct vh_backend *B = &BK;
	int client = mps_client();
	if (client) /* (everywhere else the pipe directory is one no one can make: use_mps) */
		setenv("CUDA_MPS_PIPE_DIRECTORY", F.mps_dir, 1);
	else if (F.mps)
		vh_log("channel %u: not an MPS client: none of its GPUs is shared as it starts (--mps-when shared)", idx);
	if (F.sm_partitions < 0) /* (auto: only an MPS client's partitions run beside other processes' work) */
		F.sm_partitions = client;
	if (client && F.mps_priority == VH_MPS_PRIO_AUTO) {
		/* an MPS client's priority is read as it opens the driver: its guest's now (a change
		 * later reaches the guest's processes started after it) */
		struct vmgpu_sched_slot *slots[VG_MAX_DEVICES];
		for (int d = 0; d < F.ndev; d++)
			slots[d] = F.sched[d].pg ? &F.sched[d].pg->slot[F.sched[d].me] : NULL;
		setenv("CUDA_MPS_CLIENT_PRIORITY", sched_mps_client_priority(slots, F.high_opt, F.ndev), 1);
	} else if (client && F.mps_priority != VH_MPS_PRIO_DRIVER) {
		setenv("CUDA_MPS_CLIENT_PRIORITY", F.mps_priority == VH_MPS_PRIO_NORMAL ? "0" : "1", 1);
	}
	if (B->cuInit(0) != CUDA_SUCCESS)
		return 3;
	/* nothing is made on a GPU here: a context is made, after its charge, at the guest
	 * process's first call that needs that GPU (context.c) */
	for (int i = 0; i < F.ndev; i++)
		if (B->cuDeviceGet(&F.dev[i], F.ordinal[i]) != CUDA_SUCCESS)
			return 3;

	struct vh_chan ch = {.fwd = &F, .backend = B, .hc = vmgpu_host_chan(F.host, idx), .index = idx, .cur_dev = -1,
			     .charged = F.charged[idx], .quota_mu = PTHREAD_MUTEX_INITIALIZER};
	for (int d = 0; d < F.ndev; d++)
		atomic_store(&F.ahead[idx][d], 0); /* (its last worker's row came back with it) */
	atomic_fetch_add(&F.stats->processes, 1);
	vh_log("channel %u: guest process connected (generation %u), served by worker %d", idx,
	       vmgpu_hchan_generation(ch.hc), (int)getpid());
	atomic_store(&sched_ctx, ch.ctx);
	/* (the supervisor counted this worker into the GPUs' scheduler slots) */
	pthread_t st[VG_MAX_DEVICES];
	struct sched_arg sa[VG_MAX_DEVICES];
	int nthreads = 0;
	for (int d = 0; d < F.ndev; d++) {
		vh_sched_worker_begins(&F.sched[d]);
		/* a forwarder that does not partition never follows a span: the share controller must
		 * know, should another on the GPU offer spans (partition.h) */
		atomic_store(&F.sched[d].part_off, !F.sm_partitions);
	}
	for (int d = 0; d < F.ndev; d++) {
		sa[d] = (struct sched_arg){&ch, d};
		if (pthread_create(&st[nthreads], NULL, sched_thread, &sa[d]) == 0)
			nthreads++;
		else
			vh_log("channel %u: no scheduler thread for guest GPU %d: its hand-overs wait for this "
			       "worker's next call", idx, d);
	}
	int ended = vh_serve(&ch);
	atomic_store(&sched_stop, 1);
	for (int i = 0; i < nthreads; i++)
		pthread_join(st[i], NULL);
	/* stop counting in hand-overs: one under way completes without this worker (whoever is
	 * left, or the supervisor, completes it) */
	for (int d = 0; d < F.ndev; d++) {
		if (atomic_exchange(&F.sched_joined[idx][d], 0))
			vh_sched_worker(&F.sched[d], 0);
		vh_sched_unheld(&F.sched[d]);
	}
	uint64_t calls = atomic_load(&ch.ncalls), async = ch.nasync;
	atomic_store(&sched_ctx, NULL);
	vh_host_func_release_all(&ch); /* nobody runs them now, and the watchdog has stopped */
	vh_chan_release_all(&ch);
	/* its contexts go now, and with them all it held on the GPUs: the quota takes that back
	 * here, so that the guest's next process finds its memory free (the supervisor's reap is
	 * the backstop for a worker that cannot say so) */
	vh_quota_call_begin(&ch); /* (a reading of the meter begun before is not taken after) */
	vh_quota_worker_end(&ch, vh_chan_contexts_drop(&ch));
	vh_quota_call_end(&ch);
	static const char *const why[] = {"its channel went free", "", "", "it closed its channel",
					   "it is gone or cut off", "it was refused"};
	const char *reason = ended      ? "it broke the protocol"
			     : stopping ? "the forwarder stops"
			     : ch.end_event >= 0 && ch.end_event <= 5 ? why[ch.end_event]
								      : "?";
	vh_log("channel %u: closed after %llu calls (%s; %llu async; module images: %llu sent, %llu from cache); "
	       "its memory and objects are freed",
	       idx, (unsigned long long)calls, reason, (unsigned long long)async,
	       (unsigned long long)ch.images_sent, (unsigned long long)ch.images_cached);
	return ended;
}

