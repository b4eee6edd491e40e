/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The meter (native/meter.c) without a GPU: which of the guest's GPUs can be measured is asked
 * once per worker, and a thread that asks while another is still asking waits for that answer.
 * The quota's refresh thread asking while the serving thread's first call was asking found the
 * meter opened with no GPU marked yet, and took a measured GPU for one that is not.  The meter
 * here is the simulated backend's vmgpuSimProcessUsage, found in this program (linked -rdynamic),
 * its first answer slow.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "channel.h"
#include "check.h"
#include "host_nvml.h"
#include "log.h"
#include "meter.h"

void vh_log(const char *fmt, ...)
{
	(void)fmt;
}

const struct vh_host_nvml *vh_host_nvml(const struct vh_chan *ch)
{
	(void)ch;
	return NULL;
}

static int asked; /* how many times the meter was read */

__attribute__((visibility("default"))) int vmgpuSimProcessUsage(CUdevice d, unsigned long long *bytes);
int vmgpuSimProcessUsage(CUdevice d, unsigned long long *bytes)
{
	(void)d;
	if (__atomic_fetch_add(&asked, 1, __ATOMIC_SEQ_CST) == 0) {
		struct timespec t = {0, 300 * 1000 * 1000}; /* the first answer: 300 ms */
		nanosleep(&t, NULL);
	}
	*bytes = 4096;
	return 0;
}

static struct vh_fwd f;
static struct vh_backend bk;
static struct vh_chan ch;

static void *serving(void *arg)
{
	(void)arg;
	return (void *)(intptr_t)vh_meter_on(&ch, 0);
}

int main(void)
{
	f.ndev = 1;
	bk.simulated = 1;
	bk.dl = dlopen(NULL, RTLD_NOW);
	CHECK(bk.dl);
	ch.fwd = &f;
	ch.backend = &bk;
	pthread_t t;
	CHECK(pthread_create(&t, NULL, serving, NULL) == 0);
	while (!__atomic_load_n(&asked, __ATOMIC_SEQ_CST)) { /* the serving thread is asking */
		struct timespec w = {0, 1000 * 1000};
		nanosleep(&w, NULL);
	}
	CHECK_EQ(vh_meter_on(&ch, 0), 1); /* the refresh thread, meanwhile: measured */
	void *r;
	pthread_join(t, &r);
	CHECK_EQ((intptr_t)r, 1);
	CHECK_EQ(__atomic_load_n(&asked, __ATOMIC_SEQ_CST), 1); /* asked once */
	CHECK_EQ(vh_meter_read(&ch, 0), 4096);
	CHECK_EQ(__atomic_load_n(&asked, __ATOMIC_SEQ_CST), 2);
	puts("ok");
	return 0;
}
