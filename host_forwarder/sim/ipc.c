/* SPDX-License-Identifier: Apache-2.0 */
/*
 * IPC handles between simulated processes.  Each worker's simulated device memory is its own
 * host memory, so two processes cannot really share a block: a handle is deterministic (the
 * exporting process, the block's address and size), and opening it in another process maps a new
 * block of that size, zeroed, at an address of the opener's, which is not counted as the opener's
 * memory (the driver counts imported memory as the exporter's).  The same handle opened again in a
 * process gives the same address, counted, and each close takes one open back, as the driver does.
 * What tests check with it is who may open what (the forwarder's boundary), not that bytes move.
 * Events: a handle of an event made with CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, opened
 * as a new event of the opener's.  A process opening its own handle is refused
 * (CUDA_ERROR_INVALID_CONTEXT), as the driver refuses it.
 * The driver keeps a process's interprocess events in a file of its own in /dev/shm,
 * `cuda.shm.0.<pid in hex>.1` (root's, 0600), made with its first such event and gone with its
 * last one destroyed, and left behind by a process that ends holding one (seen on an H100): made
 * and removed here the same way, so that what the forwarder does with a dead worker's file is
 * tested.
 */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "sim.h"

struct sim_ipc_handle {
	char magic[8];
	uint32_t pid;
	uint32_t pad;
	uint64_t id; /* the exporter's address or event */
	uint64_t size;
	uint8_t zero[32];
};
_Static_assert(sizeof(struct sim_ipc_handle) == CU_IPC_HANDLE_SIZE, "an IPC handle's size");
static const char MEM_MAGIC[8] = "simipcm", EVENT_MAGIC_STR[8] = "simipce";

struct opened {
	uint32_t pid;
	uint64_t id, local;
	uint64_t refs;
	uint8_t *host;
	uint64_t size;
};
static struct opened table[256]; /* under sim_mu */

static int handle_in(const char *raw, const char *magic, struct sim_ipc_handle *h)
{
	memcpy(h, raw, sizeof *h);
	return memcmp(h->magic, magic, sizeof h->magic) == 0;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *out, CUdeviceptr p)
{
	if (!out) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_current) return CUDA_ERROR_INVALID_CONTEXT;
	uint64_t size = 0;
	pthread_mutex_lock(&sim_mu);
	for (size_t i = 0; i < sim_nranges; i++)
		if (sim_ranges[i].dev == p && !sim_ranges[i].registered)
			size = sim_ranges[i].size;
	pthread_mutex_unlock(&sim_mu);
	if (!size) return CUDA_ERROR_INVALID_VALUE;
	struct sim_ipc_handle h = {.pid = (uint32_t)getpid(), .id = p, .size = size};
	memcpy(h.magic, MEM_MAGIC, sizeof h.magic);
	memcpy(out->reserved, &h, sizeof h);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags)
{
	struct sim_ipc_handle h;
	if (!p || flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS || !handle_in(handle.reserved, MEM_MAGIC, &h) || !h.size)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_current || h.pid == (uint32_t)getpid()) return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&sim_mu);
	struct opened *free_slot = NULL;
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
		struct opened *o = &table[i];
		if (o->refs && o->pid == h.pid && o->id == h.id) {
			o->refs++;
			*p = o->local;
			pthread_mutex_unlock(&sim_mu);
			return CUDA_SUCCESS;
		}
		if (!o->refs && !free_slot) free_slot = o;
	}
	uint64_t local = sim_next_dev;
	sim_next_dev += (h.size + 0xFFFF) & ~0xFFFFull;
	pthread_mutex_unlock(&sim_mu);
	uint8_t *host = free_slot ? calloc(1, h.size) : NULL;
	if (!host || sim_add_range(local, host, h.size, 0)) {
		free(host);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&sim_mu);
	*free_slot = (struct opened){.pid = h.pid, .id = h.id, .local = local, .refs = 1, .host = host, .size = h.size};
	pthread_mutex_unlock(&sim_mu);
	*p = local;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	pthread_mutex_lock(&sim_mu);
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
		struct opened *o = &table[i];
		if (!o->refs || o->local != p) continue;
		if (--o->refs == 0) {
			for (size_t j = 0; j < sim_nranges; j++)
				if (sim_ranges[j].dev == p && sim_ranges[j].host == o->host) {
					sim_ranges[j] = sim_ranges[--sim_nranges];
					break;
				}
			free(o->host);
			*o = (struct opened){0};
		}
		pthread_mutex_unlock(&sim_mu);
		return CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&sim_mu);
	return CUDA_ERROR_INVALID_VALUE;
}

static unsigned ipc_events; /* this process's interprocess events, under sim_mu */
static int made_file;        /* whether the file is one this process made (one that was there stays) */

static void driver_file(char *name, size_t n)
{
	snprintf(name, n, "/dev/shm/cuda.shm.0.%x.1", (unsigned)getpid());
}

void sim_ipc_event_made(void)
{
	pthread_mutex_lock(&sim_mu);
	if (ipc_events++ == 0) {
		char name[64];
		driver_file(name, sizeof name);
		int fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd >= 0) { /* (empty: what it holds is the driver's business) */
			made_file = 1;
			close(fd);
		}
	}
	pthread_mutex_unlock(&sim_mu);
}

void sim_ipc_event_gone(void)
{
	pthread_mutex_lock(&sim_mu);
	if (ipc_events && --ipc_events == 0 && made_file) {
		made_file = 0;
		char name[64];
		driver_file(name, sizeof name);
		unlink(name);
	}
	pthread_mutex_unlock(&sim_mu);
}

EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *out, CUevent e)
{
	struct sim_obj *o = (struct sim_obj *)e;
	if (!out) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_is_obj(o, EVENT_MAGIC)) return CUDA_ERROR_INVALID_HANDLE;
	unsigned need = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
	if (((unsigned)o->flags & need) != need) return CUDA_ERROR_INVALID_VALUE;
	struct sim_ipc_handle h = {.pid = (uint32_t)getpid(), .id = (uint64_t)(uintptr_t)e};
	memcpy(h.magic, EVENT_MAGIC_STR, sizeof h.magic);
	memcpy(out->reserved, &h, sizeof h);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenEventHandle(CUevent *e, CUipcEventHandle handle)
{
	struct sim_ipc_handle h;
	if (!e || !handle_in(handle.reserved, EVENT_MAGIC_STR, &h)) return CUDA_ERROR_INVALID_VALUE;
	if (!sim_current || h.pid == (uint32_t)getpid()) return CUDA_ERROR_INVALID_CONTEXT;
	CUresult r = sim_new_obj((void **)e, EVENT_MAGIC, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
	if (r == CUDA_SUCCESS)
		sim_ipc_event_made();
	return r;
}
