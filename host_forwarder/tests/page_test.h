/* SPDX-License-Identifier: Apache-2.0 */
/* What the scheduler page's test programs (t_sched_dead.c, t_sched_wake.c) share: the log line
 * region_file.c and sched_page.c write, for programs built without the forwarder's log.c (which
 * needs the whole forwarder), to stderr; and the page they join, PAGE_TEST_UUID in a private
 * directory of their own, removed with the directory at the end.  Include it in one file of a
 * program. */
#ifndef VH_TEST_PAGE_TEST_H
#define VH_TEST_PAGE_TEST_H

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#define PAGE_TEST_UUID "GPU-test"

void vh_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void page_test_remove(const char *dir)
{
	char page[256];
	snprintf(page, sizeof page, "%s/vmgpu-sched-" PAGE_TEST_UUID, dir);
	unlink(page);
	rmdir(dir);
}

#endif
