/* What the driver-API transcript programs (drv_api.c, link.c) share: a step printed as
 * "<step> <CUresult's name> ok|UNEXPECTED", a check as "<check> - ok|WRONG", each remembered if it
 * failed, and a text file read whole (read_file.h).  The same transcript natively and through vmgpu. */
#ifndef TRANSCRIPT_H
#define TRANSCRIPT_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#include "read_file.h"

static int failures;

static void step(const char *what, CUresult r, CUresult want, const char *extra)
{
	const char *name = NULL;
	cuGetErrorName(r, &name);
	printf("%-28s %-34s %s%s\n", what, name ? name : "?", r == want ? "ok" : "UNEXPECTED", extra ? extra : "");
	if (r != want)
		failures++;
}

static void check(const char *what, int cond)
{
	printf("%-28s %-34s %s\n", what, "-", cond ? "ok" : "WRONG");
	if (!cond)
		failures++;
}

#endif
