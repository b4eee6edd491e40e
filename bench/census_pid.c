/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Part of `make census` (bench/census.py), built into the census library beside the census tool:
 * each process of a program gets a census file of its own.  The census writes $CENSUS_OUT as each
 * process exits, so the processes of a program that starts others (NCCL's ranks, a framework's
 * compile workers) wrote one file in turn and the last to end left its census alone, often the
 * parent's, empty.  With CENSUS_OUT_DIR set, each process's CENSUS_OUT becomes
 * $CENSUS_OUT_DIR/<pid>, as it starts and again in a forked child; census.py joins the files.
 * A forked child inherits its parent's counts, so what the parent called before the fork counts
 * twice (the census's counters are its own); the names, what the report is about, are right.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void own_file(void)
{
	const char *dir = getenv("CENSUS_OUT_DIR");
	char path[4096];
	if (dir && *dir && snprintf(path, sizeof path, "%s/%d", dir, (int)getpid()) < (int)sizeof path)
		setenv("CENSUS_OUT", path, 1);
}

__attribute__((constructor)) static void census_per_process(void)
{
	own_file();
	pthread_atfork(NULL, NULL, own_file);
}
