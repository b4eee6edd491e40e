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
 *   vmgpu-guest-agent install [--prefix DIR]
 *       put the guest libcuda.so.1 and libnvidia-ml.so.1 (from the agent's own directory) in
 *       DIR/lib/x86_64-linux-gnu and vmgpu-smi in DIR/bin (default DIR /usr), each written
 *       under a fresh name and renamed into place (never through a link), then run ldconfig;
 *       refused where a user other than root could change a directory on the way.
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

/* Copy src to dir/name: written exclusively under a temporary name in dir, then renamed over
 * the name (a link there is replaced, never followed).  0, or 1 with the reason said. */
static int install_file(const char *src, const char *dir, const char *name, mode_t mode)
{
	char tmp[PATH_MAX], dst[PATH_MAX];
	if (snprintf(dst, sizeof dst, "%s/%s", dir, name) >= (int)sizeof dst ||
	    snprintf(tmp, sizeof tmp, "%s/.%s.vmgpu-%d", dir, name, (int)getpid()) >= (int)sizeof tmp)
		return say("install: %s: the path is too long", dir);
	int in = open(src, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return say("install: %s: %s", src, strerror(errno));
	int out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
	if (out < 0) {
		close(in);
		return say("install: %s: %s", tmp, strerror(errno));
	}
	char buf[1 << 16];
	ssize_t n;
	int bad = 0;
	while ((n = read(in, buf, sizeof buf)) > 0)
		bad |= write(out, buf, (size_t)n) != n;
	bad |= n < 0 || fchmod(out, mode) != 0 || fsync(out) != 0;
	close(in);
	bad |= close(out) != 0;
	if (bad || rename(tmp, dst) != 0) {
		int e = errno;
		unlink(tmp);
		return say("install: cannot write %s: %s", dst, strerror(e));
	}
	printf("installed %s\n", dst);
	return 0;
}

/* Every guest process loads what install puts in place, root's included: each directory from /
 * to dir must be the installer's (root's) alone, so that nobody else can replace a file in it
 * afterwards: owned by root or the installer, and writable by no one else unless sticky (as
 * /tmp, where nobody else may rename or remove what is not theirs).  0, or 1 with the reason said. */
static int dir_is_ours(const char *dir)
{
	char real[PATH_MAX];
	if (!realpath(dir, real))
		return say("install: %s: %s", dir, strerror(errno));
	for (char *p = real;; p++)
		if (*p == '/' || !*p) {
			char c = *p;
			*p = '\0';
			struct stat st;
			const char *at = p == real ? "/" : real;
			if (lstat(at, &st) != 0)
				return say("install: %s: %s", at, strerror(errno));
			if (!S_ISDIR(st.st_mode) || (st.st_uid != 0 && st.st_uid != geteuid()) ||
			    ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)))
				return say("install: %s is not root's alone (owner uid %u, mode %04o): another user could "
					   "replace the guest libraries there",
					   at, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
			if (!(*p = c))
				return 0;
		}
}

static int install(const char *prefix)
{
	char self[PATH_MAX], here[PATH_MAX], lib[PATH_MAX], bin[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return say("install: cannot find my own directory: %s", strerror(errno));
	self[n] = '\0';
	char *slash = strrchr(self, '/');
	*slash = '\0';
	if (snprintf(lib, sizeof lib, "%s/lib/x86_64-linux-gnu", prefix) >= (int)sizeof lib ||
	    snprintf(bin, sizeof bin, "%s/bin", prefix) >= (int)sizeof bin)
		return say("install: --prefix %s is too long", prefix);
	static const struct {
		const char *name;
		int to_bin;
		mode_t mode;
	} files[] = {{"libcuda.so.1", 0, 0644}, {"libnvidia-ml.so.1", 0, 0644}, {"vmgpu-smi", 1, 0755}};
	const char *dirs[] = {prefix, lib, bin};
	char part[PATH_MAX];
	for (size_t i = 0; i < 3; i++) /* make what is missing of DIR/lib/x86_64-linux-gnu and DIR/bin */
		for (char *p = strcpy(part, dirs[i]) + 1;; p++)
			if (*p == '/' || !*p) {
				char c = *p;
				*p = '\0';
				if (mkdir(part, 0755) != 0 && errno != EEXIST)
					return say("install: %s: %s", part, strerror(errno));
				if (!(*p = c))
					break;
			}
	if (dir_is_ours(lib) || dir_is_ours(bin))
		return 1;
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		if (snprintf(here, sizeof here, "%s/%s", self, files[i].name) >= (int)sizeof here)
			return say("install: %s: the path is too long", self);
		if (install_file(here, files[i].to_bin ? bin : lib, files[i].name, files[i].mode))
			return 1;
	}
	if (!strcmp(prefix, "/usr") && access("/sbin/ldconfig", X_OK) == 0 && system("/sbin/ldconfig") != 0)
		say("install: ldconfig failed; run it by hand");
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: vmgpu-guest-agent setup|reap|run|install [--mode OCTAL] [--group NAME | --gid GID] [--interval MS] "
		   "[--once]\n"
		   "  setup   find the vmgpu ivshmem device, enable it, give it to group NAME (default vmgpu,\n"
		   "          created if missing) with mode OCTAL (default 0660), link it as " LINK_PATH "\n"
		   "  reap    close the channels of processes that exited without closing them\n"
		   "  run     setup, then reap until killed\n"
		   "  install [--prefix DIR]  put the guest libcuda.so.1, libnvidia-ml.so.1 (DIR/lib/x86_64-linux-gnu)\n"
		   "          and vmgpu-smi (DIR/bin) from this program's directory in place (default DIR /usr)\n");
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
	const char *prefix = "/usr";
	static const struct option opts[] = {
		{"mode", 1, 0, 'm'}, {"gid", 1, 0, 'g'},  {"group", 1, 0, 'G'},
		{"interval", 1, 0, 'i'}, {"once", 0, 0, 'o'}, {"prefix", 1, 0, 'p'}, {0, 0, 0, 0},
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
		case 'p':
			if (optarg[0] != '/')
				return say("--prefix: '%s' is not an absolute directory", optarg), 2;
			prefix = optarg;
			break;
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
	if (!strcmp(cmd, "install"))
		return install(prefix);
	usage(stderr);
	return 2;
}
