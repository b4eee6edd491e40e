/* SPDX-License-Identifier: Apache-2.0 */
/* A host process as /proc shows it: see proc.h. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"

int vh_proc_stat(uint32_t pid, char *state, int *ppid)
{
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/%u/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	const char *end = strrchr(buf, ')'); /* "pid (comm) S ppid ...": the command may hold ')' */
	if (!end || end[1] != ' ' || !end[2] || end[3] != ' ')
		return -1;
	if (state)
		*state = end[2];
	if (ppid)
		*ppid = atoi(end + 4);
	return 0;
}
