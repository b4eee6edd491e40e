/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A refusal of memory: counted on the statistics page, every one (vmgpud exports the count as
 * vmgpu_guest_oom_refusals_total), and reported: a line in the log and, if the operator gave one
 * (--oom-script), their script run with the guest's identity and the numbers, apart from the
 * worker (it waits for nothing).
 *
 * The guest decides when refusals happen, and each of its processes has a worker of its own (a
 * fresh fork of the supervisor), so what limits the reports is kept in memory that every worker
 * of this forwarder shares (mapped before any is forked): reported at most once a second per
 * forwarder, however many processes the guest starts, and the script (root's) run one at a time:
 * while one runs, no other is started; one that runs past OOM_SCRIPT_TIMEOUT_S is killed, with
 * whatever it started (its own session).  The script is opened never through a link, checked on
 * that descriptor (a regular executable file of root's, or of this user's, that no one else can
 * write) and run from it: what runs is what was checked.  It gets /dev/null as its input, the
 * forwarder's log as its output, no other descriptor of the worker's (the guest's memory, the
 * driver's devices), and an environment of its own: PATH and the VMGPU_* variables below.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "channel.h"
#include "log.h"
#include "quota.h"

#define OOM_SCRIPT_TIMEOUT_S 30
#define OOM_SCRIPT_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* What every worker of this forwarder shares: when the last report was, and since when a script
 * runs (0: none), CLOCK_MONOTONIC ns (the watcher clears it; a watcher killed outright leaves it,
 * and it counts as over once the script would have been killed). */
struct oom_shared {
	_Atomic uint64_t last_ns;
	_Atomic uint64_t script_since;
};

static struct oom_shared own; /* where the shared page cannot be had: this process's own */
static struct oom_shared *shared = &own;

__attribute__((constructor)) static void oom_shared_map(void)
{
	void *p = mmap(NULL, sizeof(struct oom_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED)
		shared = p;
}

static uint64_t monotonic_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The script, opened (never through a link) and checked on its descriptor; -1 (logged) if it
 * is not one to run as this user.  The descriptor stays open across exec: a script's
 * interpreter reads it through /dev/fd. */
static int open_script(const char *path)
{
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		vh_log("cannot run the OOM script %s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode) || (st.st_uid != 0 && st.st_uid != geteuid()) || (st.st_mode & 022) ||
	    !(st.st_mode & 0100)) {
		vh_log("not running the OOM script %s: it is not a regular executable file of root's that no one "
		       "else can write (uid %u, mode %04o)",
		       path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
		close(fd);
		return -1;
	}
	return fd;
}

/* The script's process: its own session, /dev/null in, the log out, nothing else open but the
 * script itself; run from its descriptor. */
static void run_script(const char *path, char *const argv[], char *const envp[])
{
	setsid();
	int null = open("/dev/null", O_RDONLY);
	if (null > 0) {
		dup2(null, 0);
		close(null);
	}
	dup2(2, 1);
	if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0) /* a kernel before 5.9 */
		for (int fd = 3; fd < 4096; fd++)
			close(fd);
	int fd = open_script(path);
	if (fd < 0)
		_exit(126);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			signal(s, SIG_DFL);
	syscall(SYS_execveat, fd, "", argv, envp, AT_EMPTY_PATH);
	vh_log("cannot run the OOM script %s: %s", path, strerror(errno));
	_exit(127);
}

/* The watcher: runs the script, kills it (and what it started) if it runs too long, then lets
 * the next report run one. */
static void watch_script(const char *path, char *const argv[], char *const envp[])
{
	pid_t s = fork();
	if (s == 0)
		run_script(path, argv, envp);
	if (s > 0) {
		uint64_t deadline = monotonic_ns() + OOM_SCRIPT_TIMEOUT_S * 1000000000ull;
		int done = 0;
		while (!done && monotonic_ns() < deadline) {
			pid_t r = waitpid(s, NULL, WNOHANG);
			done = r == s || (r < 0 && errno != EINTR);
			if (!done) {
				struct timespec t = {0, 50000000};
				nanosleep(&t, NULL);
			}
		}
		if (!done) {
			vh_log("the OOM script %s ran past %d s: killed", path, OOM_SCRIPT_TIMEOUT_S);
			kill(-s, SIGKILL);
			kill(s, SIGKILL);
			waitpid(s, NULL, 0);
		}
	}
	atomic_store(&shared->script_since, 0);
	_exit(0);
}

void vh_oom_report(struct vh_chan *ch, int dev, const char *call, uint64_t want)
{
	if (dev < 0 || dev >= VG_MAX_DEVICES)
		return;
	if (dev < VMGPU_STATS_GPUS)
		atomic_fetch_add_explicit(&ch->fwd->stats->oom_refusals[dev], 1, memory_order_relaxed);
	uint64_t now = ch->fwd->clock->now_ns();
	uint64_t last = atomic_load(&shared->last_ns);
	if (last && now - last < 1000000000ull)
		return; /* a guest that retries in a loop, or starts process after process, is told about once a second */
	if (!atomic_compare_exchange_strong(&shared->last_ns, &last, now))
		return; /* another worker reports this second */
	struct vh_fwd *f = ch->fwd;
	uint64_t used = atomic_load(&f->used[dev]);
	vh_log("channel %u: out of memory on GPU %d: %s wanted %llu bytes; the guest holds %llu of its %llu", ch->index,
	       dev, call, (unsigned long long)want, (unsigned long long)used, (unsigned long long)f->quota[dev]);
	if (!f->oom_script || !*f->oom_script)
		return;
	uint64_t mono = monotonic_ns(), since = atomic_load(&shared->script_since);
	if (since && mono - since < (OOM_SCRIPT_TIMEOUT_S + 5) * 1000000000ull) {
		vh_log("the OOM script %s is still running: not started again", f->oom_script);
		return;
	}
	if (!atomic_compare_exchange_strong(&shared->script_since, &since, mono))
		return;
	/* everything the script gets, made before the fork */
	char uuid[64], v[9][160];
	vh_uuid_str(f->info[dev].uuid, uuid, sizeof uuid);
	snprintf(v[0], sizeof v[0], "VMGPU_GUEST=%s", f->guest);
	snprintf(v[1], sizeof v[1], "VMGPU_GPU=%s", uuid);
	snprintf(v[2], sizeof v[2], "VMGPU_GPU_INDEX=%d", dev);
	snprintf(v[3], sizeof v[3], "VMGPU_QUOTA=%llu", (unsigned long long)f->quota[dev]);
	snprintf(v[4], sizeof v[4], "VMGPU_USED=%llu", (unsigned long long)used);
	snprintf(v[5], sizeof v[5], "VMGPU_REQUEST=%llu", (unsigned long long)want);
	snprintf(v[6], sizeof v[6], "VMGPU_CHANNEL=%u", ch->index);
	snprintf(v[7], sizeof v[7], "VMGPU_WORKER_PID=%d", (int)getpid());
	snprintf(v[8], sizeof v[8], "VMGPU_CALL=%s", call);
	char *envp[] = {OOM_SCRIPT_PATH, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], NULL};
	char *argv[] = {(char *)f->oom_script, (char *)f->guest, NULL};
	pid_t child = fork();
	if (child == 0) {
		/* apart from this worker: it waits for nothing, and the watcher outlives it if need be */
		pid_t w = fork();
		if (w == 0)
			watch_script(f->oom_script, argv, envp);
		if (w < 0)
			atomic_store(&shared->script_since, 0);
		_exit(0);
	}
	if (child > 0)
		waitpid(child, NULL, 0);
	else
		atomic_store(&shared->script_since, 0);
}
