/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The forwarder's log: every line starts with the time it was written (ISO 8601, UTC, to the
 * millisecond), names the guest, and says so when the backend is simulated:
 *   2026-11-22T21:56:37.123Z vmgpu-forwarder[guest-a] channel 0: ...
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "process.h"

/* v as width digits with leading zeros at p; returns what follows. */
static char *digits(char *p, unsigned long long v, int width)
{
	for (int i = width - 1; i >= 0; i--, v /= 10)
		p[i] = (char)('0' + v % 10);
	return p + width;
}

char *vh_decimal(char *out, unsigned long long v)
{
	int width = 1;
	for (unsigned long long rest = v; rest >= 10; rest /= 10)
		width++;
	*digits(out, v, width) = 0;
	return out;
}

/* "YYYY-MM-DDTHH:MM:SS.mmmZ" of the wall clock now (24 characters), without gmtime or strftime,
 * which a signal handler may not call (the civil date from the days since 1970, in 400-year eras
 * of 146,097 days). */
static void timestamp(char out[32])
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	long days = ts.tv_sec / 86400, secs = ts.tv_sec % 86400;
	long z = days + 719468, era = z / 146097, doe = z - era * 146097;
	long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	long doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
	long d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9, y = yoe + era * 400 + (m <= 2);
	char *p = digits(out, y, 4);
	*p++ = '-';
	p = digits(p, m, 2);
	*p++ = '-';
	p = digits(p, d, 2);
	*p++ = 'T';
	p = digits(p, secs / 3600, 2);
	*p++ = ':';
	p = digits(p, secs / 60 % 60, 2);
	*p++ = ':';
	p = digits(p, secs % 60, 2);
	*p++ = '.';
	p = digits(p, ts.tv_nsec / 1000000, 3);
	*p++ = 'Z';
	*p = 0;
}

/* A line holds a region's whole path (PATH_MAX: 4,096 bytes) and what is said about it: vmgpud
 * knows a forwarder serves by its start line, which names the region. */
enum { LOG_MSG_MAX = 6144, LOG_LINE_MAX = LOG_MSG_MAX + 512 };

void vh_log_in_handler(const char *const *pieces)
{
	char line[LOG_LINE_MAX], when[32];
	timestamp(when);
	/* the simulated backend says so on every line */
	const char *head[] = {when, " vmgpu-forwarder[", F.guest, "]", BK.simulated ? " SIMULATED (no GPU):" : "", " "};
	size_t n = 0;
	for (size_t i = 0; i < sizeof head / sizeof *head; i++)
		for (const char *c = head[i]; *c && n < sizeof line - 1; c++)
			line[n++] = *c;
	for (; *pieces; pieces++)
		for (const char *c = *pieces; *c && n < sizeof line - 1; c++)
			line[n++] = *c;
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
}

/* Every line, a handler's or not, is written by vh_log_in_handler: one write(2) each. */
static void log_line(const char *prefix, const char *fmt, va_list ap)
{
	char msg[LOG_MSG_MAX];
	vsnprintf(msg, sizeof msg, fmt, ap);
	const char *pieces[] = {prefix, msg, NULL};
	vh_log_in_handler(pieces);
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
