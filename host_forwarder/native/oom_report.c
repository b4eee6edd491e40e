/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A refusal of memory: counted on the statistics page, every one (vmgpud exports the count as
 * vmgpu_guest_oom_refusals_total), and reported: a line in the log and, if the operator gave one
 * (--oom-script), their script run with the guest's identity and the numbers, apart from the
 * worker (it waits for nothing).  Reported at most once a second per worker: a program that
 * retries in a loop is told about once.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "channel.h"
#include "log.h"
#include "quota.h"

void vh_oom_report(struct vh_chan *ch, int dev, const char *call, uint64_t want)
{
	static uint64_t last_ns;
	if (dev >= 0 && dev < VMGPU_STATS_GPUS)
		atomic_fetch_add_explicit(&ch->fwd->stats->oom_refusals[dev], 1, memory_order_relaxed);
	uint64_t now = ch->fwd->clock->now_ns();
	if (last_ns && now - last_ns < 1000000000ull)
		return; /* a program that retries in a loop is told about once a second */
	last_ns = now;
	struct vh_fwd *f = ch->fwd;
	uint64_t used = atomic_load(&f->used[dev]);
	vh_log("channel %u: out of memory on GPU %d: %s wanted %llu bytes; the guest holds %llu of its %llu", ch->index,
	       dev, call, (unsigned long long)want, (unsigned long long)used, (unsigned long long)f->quota[dev]);
	if (!f->oom_script || !*f->oom_script)
		return;
	pid_t child = fork();
	if (child == 0) {
		/* the script runs apart from this worker: it outlives nothing and waits for nothing */
		if (fork() != 0)
			_exit(0);
		char uuid[64], v[6][32];
		vh_uuid_str(f->info[dev].uuid, uuid, sizeof uuid);
		snprintf(v[0], sizeof v[0], "%d", dev);
		snprintf(v[1], sizeof v[1], "%llu", (unsigned long long)f->quota[dev]);
		snprintf(v[2], sizeof v[2], "%llu", (unsigned long long)used);
		snprintf(v[3], sizeof v[3], "%llu", (unsigned long long)want);
		snprintf(v[4], sizeof v[4], "%u", ch->index);
		snprintf(v[5], sizeof v[5], "%d", (int)getppid());
		setenv("VMGPU_GUEST", f->guest, 1);
		setenv("VMGPU_GPU", uuid, 1);
		setenv("VMGPU_GPU_INDEX", v[0], 1);
		setenv("VMGPU_QUOTA", v[1], 1);
		setenv("VMGPU_USED", v[2], 1);
		setenv("VMGPU_REQUEST", v[3], 1);
		setenv("VMGPU_CHANNEL", v[4], 1);
		setenv("VMGPU_WORKER_PID", v[5], 1);
		setenv("VMGPU_CALL", call, 1);
		signal(SIGPIPE, SIG_DFL);
		execl(f->oom_script, f->oom_script, f->guest, (char *)NULL);
		vh_log("cannot run the OOM script %s", f->oom_script);
		_exit(127);
	}
	if (child > 0)
		waitpid(child, NULL, 0);
}
