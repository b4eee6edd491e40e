/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The simulated backend's test knobs: what a test sets through the environment (VMGPU_SIM_*),
 * and the memory the process holds as NVML would report it.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>

#include "sim.h"

/* What the process holds, as NVML would say: allocations rounded as the H100's driver rounds
 * them, and VMGPU_SIM_CTX_MIB (default 0) per context.  vmgpuSimProcessUsage reports it. */
uint64_t sim_proc_bytes;

/* VMGPU_SIM_USAGE_DIR: each process keeps what it holds in DIR/<pid>, rewritten at every
 * change, so that tests can check the forwarder's quota against the simulated driver's own
 * account, as the GPU tests check them against NVML. */
void sim_usage_add(int64_t delta)
{
	uint64_t now = __atomic_add_fetch(&sim_proc_bytes, (uint64_t)delta, __ATOMIC_RELAXED);
	const char *dir = getenv("VMGPU_SIM_USAGE_DIR");
	if (!dir || !*dir)
		return;
	char path[512], line[32];
	snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
	int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	int n = snprintf(line, sizeof line, "%020llu\n", (unsigned long long)now);
	if (pwrite(fd, line, (size_t)n, 0) != n)
		now = 0;
	close(fd);
}

/* VMGPU_SIM_DEVICES (default 1, at most 8) simulated GPUs, told apart by UUID and PCI bus. */
int sim_devices(void)
{
	const char *e = getenv("VMGPU_SIM_DEVICES");
	int n = e ? atoi(e) : 1;
	return n < 1 ? 1 : n > 8 ? 8 : n;
}
uint64_t sim_ctx_bytes(void)
{
	const char *e = getenv("VMGPU_SIM_CTX_MIB");
	char text[32] = "";
	if (e && e[0] == '@') { /* (a test writes the file whole: by rename) */
		int fd = open(e + 1, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		ssize_t n = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
		if (fd >= 0)
			close(fd);
		if (n <= 0)
			sim_fatal("VMGPU_SIM_CTX_MIB=%s: the file cannot be read, or is empty", e);
		text[n] = 0;
		e = text;
	}
	return (e && atoll(e) > 0 ? (uint64_t)atoll(e) : 0) << 20;
}

/* A knob in microseconds (default 0), in nanoseconds. */
static uint64_t us_knob(const char *name)
{
	const char *e = getenv(name);
	return (e ? strtoull(e, NULL, 10) : 0) * 1000;
}

uint64_t sim_register_ns(void)
{
	return us_knob("VMGPU_SIM_REGISTER_US");
}

void sim_fatal(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "vmgpu simulated driver: %s\n", line);
	abort();
}

uint64_t sim_green_bytes(void)
{
	const char *e = getenv("VMGPU_SIM_GREEN_MIB");
	return (e && atoll(e) > 0 ? (uint64_t)atoll(e) : 0) << 20;
}

uint64_t sim_total_mem(void)
{
	const char *e = getenv("VMGPU_SIM_MEM_MIB");
	return (e && atoll(e) > 0 ? (uint64_t)atoll(e) : 16384) << 20;
}

int sim_hgx(void)
{
	const char *e = getenv("VMGPU_SIM_NVSWITCH");
	return e && atoi(e) > 0;
}

uint64_t sim_event_lag_ns(void)
{
	return us_knob("VMGPU_SIM_EVENT_LAG_US");
}

int sim_event_lag_dev(void)
{
	const char *e = getenv("VMGPU_SIM_EVENT_LAG_DEV");
	return e && *e ? atoi(e) : -1;
}

int sim_event_create_fails(void)
{
	static _Atomic long made;
	const char *e = getenv("VMGPU_SIM_EVENT_FAIL_FIRST");
	return e && atomic_fetch_add(&made, 1) < atol(e);
}

uint64_t sim_ctx_sync_ns(void)
{
	return us_knob("VMGPU_SIM_CTX_SYNC_US");
}

int sim_pageable_access(void)
{
	return getenv("VMGPU_SIM_PAGEABLE_ACCESS") != NULL;
}

/* As a driver that calls exit() would (tests: a worker that ends with a status while it holds
 * the GPU). */
void sim_memset_knob(void)
{
	static unsigned long long calls;
	const char *e = getenv("VMGPU_SIM_EXIT_AT_MEMSET");
	if (e && *e && __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED) == strtoull(e, NULL, 10))
		exit(3);
}

EXPORT int vmgpuSimProcessUsage(CUdevice d, unsigned long long *bytes)
{
	if (d != 0 || !bytes)
		return -1; /* one device's usage is modelled; the others are not measured */
	*bytes = __atomic_load_n(&sim_proc_bytes, __ATOMIC_RELAXED);
	return 0;
}
