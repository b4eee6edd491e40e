/* runas UID GID PROG ARGS...: run PROG as an unprivileged user (the test guest's busybox
 * cannot change uid). */
#define _GNU_SOURCE
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: runas UID GID PROG [ARGS...]\n");
		return 2;
	}
	gid_t gid = (gid_t)atoi(argv[2]);
	if (setgroups(0, NULL) || setgid(gid) || setuid((uid_t)atoi(argv[1]))) {
		perror("runas");
		return 1;
	}
	execv(argv[3], argv + 3);
	perror("runas: exec");
	return 127;
}
