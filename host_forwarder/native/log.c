/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The forwarder's log: every line starts with the time it was written (ISO 8601, UTC, to the
 * millisecond), names the guest, and says so when the backend is simulated:
 *   2026-11-22T21:56:37.123Z vmgpu-forwarder[guest-a] channel 0: ...
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "process.h"

/* "YYYY-MM-DDTHH:MM:SS.mmmZ" of the wall clock now (24 characters). */
static void timestamp(char out[32])
{
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out + n, 32 - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

static void log_line(const char *prefix, const char *fmt, va_list ap)
{
	char msg[1024], when[32];
	vsnprintf(msg, sizeof msg, fmt, ap);
	timestamp(when);
	/* the simulated backend says so on every line */
	fprintf(stderr, "%s vmgpu-forwarder[%s]%s %s%s\n", when, F.guest, BK.simulated ? " SIMULATED (no GPU):" : "",
		prefix, msg);
}

void vh_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_line("", fmt, ap);
	va_end(ap);
}

int vh_die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_line("error: ", fmt, ap);
	va_end(ap);
	return 1;
}

const char *vh_error_name(CUresult r)
{
	const char *s = NULL;
	if (BK.cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
		return "unknown CUDA error";
	return s;
}
