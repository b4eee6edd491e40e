/* SPDX-License-Identifier: Apache-2.0 */
/* The real clock the quota waits by (forwarder.h: struct vh_clock; unit tests bring a fake one). */
#include <time.h>

#include "forwarder.h"

static uint64_t monotonic_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec t = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
	nanosleep(&t, NULL);
}

const struct vh_clock vh_real_clock = {monotonic_ns, sleep_ns};
