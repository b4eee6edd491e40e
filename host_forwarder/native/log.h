/* SPDX-License-Identifier: Apache-2.0 */
/* The forwarder's log: one line per event on stderr, each marked with the guest (log.c). */
#ifndef VH_LOG_H
#define VH_LOG_H

#include <stdlib.h>
#include <string.h>

/* A line in the forwarder's log, marked as the others are. */
void vh_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A line in the log from a signal handler (async-signal-safe: no stdio, no allocation): the
 * pieces of its message, up to a NULL, written with one write(2), as vh_log's are. */
void vh_log_in_handler(const char *const *pieces);

/* The decimal digits of v at out (at least 21 bytes), NUL-terminated; returns out.
 * Async-signal-safe. */
char *vh_decimal(char *out, unsigned long long v);

/* A start-up error: logged as "error: ...", and 1 returned (main's exit status). */
int vh_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* VMGPU_TRACE_ERRORS=1 in the forwarder's environment: every call that fails, every address
 * refused and every tensor map the driver's rules refuse is logged (read once per file). */
static inline int vh_tracing_errors(void)
{
	static int trace = -1;
	if (trace < 0) {
		const char *t = getenv("VMGPU_TRACE_ERRORS");
		trace = t && !strcmp(t, "1");
	}
	return trace;
}

#endif
