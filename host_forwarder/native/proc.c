/* SPDX-License-Identifier: Apache-2.0 */
/* A host process as /proc shows it: see proc.h. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"

/* /proc/PID/stat into buf; what follows the command's closing parenthesis (" S ppid ..."), or NULL. */
static const char *stat_fields(uint32_t pid, char *buf, size_t cap)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%u/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	ssize_t n = read(fd, buf, cap - 1);
	close(fd);
	if (n <= 0)
		return NULL;
	buf[n] = '\0';
	const char *end = strrchr(buf, ')'); /* "pid (comm) S ppid ...": the command may hold ')' */
	if (!end || end[1] != ' ' || !end[2] || end[3] != ' ')
		return NULL;
	return end + 1;
}

int vh_proc_stat(uint32_t pid, char *state, int *ppid)
{
	char buf[256];
	const char *f = stat_fields(pid, buf, sizeof buf);
	if (!f)
		return -1;
	if (state)
		*state = f[1];
	if (ppid)
		*ppid = atoi(f + 3);
	return 0;
}

int vh_proc_gone(uint32_t pid)
{
	char state = 0;
	return (kill((pid_t)pid, 0) != 0 && errno == ESRCH) || (vh_proc_stat(pid, &state, NULL) == 0 && state == 'Z');
}

int vh_proc_started(uint32_t pid, uint64_t *ticks)
{
	char buf[1024];
	const char *f = stat_fields(pid, buf, sizeof buf);
	for (int field = 3; f && field < 22; field++) /* (from the space before field 3, the state) */
		f = strchr(f + 1, ' ');
	if (!f)
		return -1;
	char *end;
	*ticks = strtoull(f + 1, &end, 10);
	return end == f + 1 ? -1 : 0;
}

int vh_boot_id(char out[48])
{
	memset(out, 0, 48);
	int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, out, 47);
	close(fd);
	if (n < 32) {
		memset(out, 0, 48);
		return -1;
	}
	return 0;
}
