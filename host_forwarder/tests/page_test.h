/* SPDX-License-Identifier: Apache-2.0 */
/* The log line region_file.c and sched_page.c write, for test programs built without the
 * forwarder's log.c (which needs the whole forwarder): to stderr.  Include it in one file of a
 * program. */
#ifndef VH_TEST_LOG_STUB_H
#define VH_TEST_LOG_STUB_H

#include <stdarg.h>
#include <stdio.h>

void vh_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

#endif
