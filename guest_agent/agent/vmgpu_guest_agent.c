/* SPDX-License-Identifier: Apache-2.0 */
/* vmgpu-guest-agent: runs as root inside a VM.
 *
 *   vmgpu-guest-agent setup [--mode OCTAL] [--group NAME | --gid GID]
 *       find the ivshmem device (PCI 1af4:1110) that carries the vmgpu region, enable it,
 *       give its BAR2 to CUDA users (default: group `vmgpu`, created if missing, mode
 *       0660), and link it as /dev/vmgpu/region, where the guest libcuda.so.1 looks.
 *   vmgpu-guest-agent reap [--interval MS] [--once]
 *       close the channels of guest processes that died without closing them, so the host
 *       frees their GPU memory at once instead of after the heartbeat timeout.
 *   vmgpu-guest-agent run [--mode OCTAL] [--group NAME | --gid GID] [--interval MS]
 *       setup, then reap until killed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <getopt.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "ivshmem.h"

#define LINK_DIR "/dev/vmgpu"
#define LINK_PATH VG_REGION_LINK

static int say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("vmgpu-guest-agent: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return 1;
}

struct setup {
	mode_t mode;
	gid_t gid;
	int found;
	char res2[320];
};

static int try_device(const char *dev, const char *res2, void *ctx)
{
	struct setup *s = ctx;
	char p[400];
	snprintf(p, sizeof p, "%s/enable", dev);
	int fd = open(p, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (write(fd, "1", 1) != 1 && errno != EBUSY)
			say("cannot enable %s: %s", dev, strerror(errno));
		close(fd);
	}
	if (!vg_has_region_magic(res2)) {
		say("%s: ivshmem device without a vmgpu region (not formatted by the host?)", dev);
		return 0;
	}
	snprintf(s->res2, sizeof s->res2, "%s", res2);
	return 1;
}

static int setup(mode_t mode, gid_t gid)
{
	struct setup s = {.mode = mode, .gid = gid};
	if (!vg_each_ivshmem(try_device, &s))
		return say("no ivshmem device (PCI 1af4:1110) with a vmgpu region; is the domain's <shmem> device "
			   "there and the host's hook installed?");
	if (gid != (gid_t)-1 && chown(s.res2, (uid_t)-1, gid) != 0)
		return say("chown %s: %s", s.res2, strerror(errno));
	if (chmod(s.res2, mode) != 0)
		return say("chmod %s: %s", s.res2, strerror(errno));
	if (mkdir(LINK_DIR, 0755) != 0 && errno != EEXIST)
		return say("mkdir %s: %s", LINK_DIR, strerror(errno));
	unlink(LINK_PATH);
	if (symlink(s.res2, LINK_PATH) != 0)
		return say("symlink %s: %s", LINK_PATH, strerror(errno));
	struct stat st;
	stat(s.res2, &st);
	printf("vmgpu region: %s -> %s (%lld MiB, mode %04o)\n", LINK_PATH, s.res2, (long long)(st.st_size >> 20),
	       (unsigned)mode);
	fflush(stdout);
	return 0;
}

/* The gid of group `name`, created if missing: by groupadd where there is one, else by
 * a line appended to /etc/group (a minimal guest image) with an unused system gid. */
static int group_gid(const char *name, gid_t *gid)
{
	struct group *gr = getgrnam(name);
	if (gr) {
		*gid = gr->gr_gid;
		return 0;
	}
	pid_t pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		if (null >= 0)
			dup2(null, 2);
		execlp("groupadd", "groupadd", "--system", name, (char *)NULL);
		_exit(127);
	}
	int st = 0;
	if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0 && (gr = getgrnam(name))) {
		*gid = gr->gr_gid;
		printf("created group %s (gid %u); let a user use the GPU with: usermod -aG %s USER\n", name,
		       (unsigned)*gid, name);
		return 0;
	}
	gid_t g = 999;
	while (g >= 100 && getgrgid(g))
		g--;
	if (g < 100)
		return say("group %s does not exist and no system gid is free; create it or pass --gid", name);
	int fd = open("/etc/group", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	char line[160];
	int n = snprintf(line, sizeof line, "%s:x:%u:\n", name, (unsigned)g);
	if (fd < 0 || write(fd, line, (size_t)n) != n) {
		if (fd >= 0)
			close(fd);
		return say("group %s does not exist and /etc/group cannot be written (%s); create it or pass --gid",
			   name, strerror(errno));
	}
	close(fd);
	*gid = g;
	printf("created group %s (gid %u) in /etc/group; let a user use the GPU by adding it there\n", name,
	       (unsigned)g);
	return 0;
}

static int pid_alive(uint32_t pid, void *ctx)
{
	(void)ctx;
	return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

static volatile sig_atomic_t stopping;
static void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

static int reap(unsigned interval_ms, int once)
{
	int fd = open(LINK_PATH, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return say("cannot open %s: %s (run `vmgpu-guest-agent setup` first)", LINK_PATH, strerror(errno));
	struct stat st;
	fstat(fd, &st);
	void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (base == MAP_FAILED)
		return say("cannot map %s: %s", LINK_PATH, strerror(errno));
	struct vmgpu_guest *g;
	if (vmgpu_guest_attach(base, (uint64_t)st.st_size, NULL, &g) != 0)
		return say("%s: %s", LINK_PATH, vmgpu_shm_errmsg());
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	do {
		int n = vmgpu_guest_reap(g, pid_alive, NULL);
		if (n > 0) {
			printf("reaped %d channel(s) of exited processes\n", n);
			fflush(stdout);
		}
		if (!once)
			usleep(interval_ms * 1000u);
	} while (!once && !stopping);
	vmgpu_guest_detach(g);
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: vmgpu-guest-agent setup|reap|run [--mode OCTAL] [--group NAME | --gid GID] [--interval MS] "
		   "[--once]\n"
		   "  setup   find the vmgpu ivshmem device, enable it, give it to group NAME (default vmgpu,\n"
		   "          created if missing) with mode OCTAL (default 0660), link it as " LINK_PATH "\n"
		   "  reap    close the channels of processes that exited without closing them\n"
		   "  run     setup, then reap until killed\n");
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	const char *cmd = argv[1];
	mode_t mode = 0660;
	gid_t gid = (gid_t)-1;
	const char *group = "vmgpu";
	unsigned interval = 500;
	int once = 0;
	static const struct option opts[] = {
		{"mode", 1, 0, 'm'}, {"gid", 1, 0, 'g'},  {"group", 1, 0, 'G'},
		{"interval", 1, 0, 'i'}, {"once", 0, 0, 'o'}, {0, 0, 0, 0},
	};
	int o;
	optind = 2;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		char *end;
		switch (o) {
		case 'm':
			mode = (mode_t)strtoul(optarg, &end, 8);
			if (*end || mode > 0777)
				return say("--mode: '%s' is not an octal mode", optarg), 2;
			break;
		case 'g':
			gid = (gid_t)strtoul(optarg, &end, 10);
			if (*end)
				return say("--gid: '%s' is not a number", optarg), 2;
			break;
		case 'G':
			if (!*optarg)
				return say("--group: a group name is needed"), 2;
			group = optarg;
			break;
		case 'i':
			interval = (unsigned)strtoul(optarg, &end, 10);
			if (*end || !interval)
				return say("--interval: '%s' is not a number of milliseconds", optarg), 2;
			break;
		case 'o': once = 1; break;
		default: usage(stderr); return 2;
		}
	}
	int needs_device = !strcmp(cmd, "setup") || !strcmp(cmd, "run");
	if (needs_device && gid == (gid_t)-1 && group_gid(group, &gid))
		return 1;
	if (!strcmp(cmd, "setup"))
		return setup(mode, gid);
	if (!strcmp(cmd, "reap"))
		return reap(interval, once);
	if (!strcmp(cmd, "run"))
		return setup(mode, gid) ? 1 : reap(interval, 0);
	usage(stderr);
	return 2;
}
