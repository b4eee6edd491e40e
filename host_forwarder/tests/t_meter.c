/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The meter (native/meter.c) and the host's NVML (native/host_nvml.c) without a GPU: each is
 * opened once per worker, and a thread that asks while another is still opening it waits for
 * that answer.  The quota's refresh thread asking while the serving thread's first call was
 * asking found the meter opened with no GPU marked yet, and took a measured GPU for one that is
 * not; one asking for the host's NVML while another initialised it got none.  The simulated
 * backend's vmgpuSimProcessUsage and NVML are found in this program (linked -rdynamic), the first
 * answer of each slow (300 ms: a thread later than that would find it open and pass regardless).
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

static int asked; /* how many times the meter was read */
static int inits;  /* how many times NVML was initialised */

static void slow(void)
{
	struct timespec t = {0, 300 * 1000 * 1000};
	nanosleep(&t, NULL);
}

__attribute__((visibility("default"))) int nvmlInit_v2(void);
int nvmlInit_v2(void)
{
	if (__atomic_fetch_add(&inits, 1, __ATOMIC_SEQ_CST) == 0)
		slow();
	return 0;
}

static int nvml_device;
__attribute__((visibility("default"))) int nvmlDeviceGetHandleByUUID(const char *uuid, void **dev);
int nvmlDeviceGetHandleByUUID(const char *uuid, void **dev)
{
	(void)uuid;
	*dev = &nvml_device;
	return 0;
}

__attribute__((visibility("default"))) int vmgpuSimProcessUsage(CUdevice d, unsigned long long *bytes);
int vmgpuSimProcessUsage(CUdevice d, unsigned long long *bytes)
{
	(void)d;
	if (__atomic_fetch_add(&asked, 1, __ATOMIC_SEQ_CST) == 0)
		slow();
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

static void *serving_nvml(void *arg)
{
	(void)arg;
	return (void *)vh_host_nvml(&ch);
}

/* Until the counter says another thread is in the slow first answer. */
static void wait_asking(int *counter)
{
	while (!__atomic_load_n(counter, __ATOMIC_SEQ_CST)) {
		struct timespec w = {0, 1000 * 1000};
		nanosleep(&w, NULL);
	}
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
	wait_asking(&asked);              /* the serving thread is asking */
	CHECK_EQ(vh_meter_on(&ch, 0), 1); /* the refresh thread, meanwhile: measured */
	void *r;
	pthread_join(t, &r);
	CHECK_EQ((intptr_t)r, 1);
	CHECK_EQ(__atomic_load_n(&asked, __ATOMIC_SEQ_CST), 1); /* asked once */
	CHECK_EQ(vh_meter_read(&ch, 0), 4096);
	CHECK_EQ(__atomic_load_n(&asked, __ATOMIC_SEQ_CST), 2);

	/* the host's NVML: the serving thread initialises it, the refresh thread asks meanwhile */
	CHECK(pthread_create(&t, NULL, serving_nvml, NULL) == 0);
	wait_asking(&inits);
	const struct vh_host_nvml *n = vh_host_nvml(&ch);
	CHECK(n != NULL);
	CHECK(n->lib == bk.dl && n->dev[0] == &nvml_device);
	pthread_join(t, &r);
	CHECK(r == n);
	CHECK_EQ(__atomic_load_n(&inits, __ATOMIC_SEQ_CST), 1);
	puts("ok");
	return 0;
}
