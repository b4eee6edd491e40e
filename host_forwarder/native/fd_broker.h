/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The descriptors of exported VMM handles (fd_broker.c): the driver gives a worker a file
 * descriptor for a handle a guest process exports, and a worker of another process of the same
 * guest needs that descriptor to import it.  Workers are separate processes, so the supervisor
 * holds each descriptor, by the slot of the forwarder's IPC table (ipc.c) it was exported under,
 * and hands a copy to a worker that presents the slot's token.  Each worker talks to the
 * supervisor over a socket pair of its own, made before it is forked.
 */
#ifndef VH_FD_BROKER_H
#define VH_FD_BROKER_H

#include <stdint.h>

struct vh_fwd;

/* ---- in the supervisor -------------------------------------------------------------- */

/* Before the workers: raise the soft limit on open files to the hard one (each exported handle's
 * descriptor is one the supervisor holds), and keep the descriptors held within what the limit
 * leaves after nchannels workers' sockets and a margin: an export past that is refused as a full
 * table is, never by running the supervisor out of descriptors. */
void vh_broker_init(uint32_t nchannels);

/* A socket pair for the worker about to be forked for channel chan: the supervisor's end is
 * returned (non-blocking), the worker's in *worker_end.  -1 on failure (the worker then runs
 * without: its exports and imports of VMM handles are refused). */
int vh_broker_pair(int *worker_end);
/* In the forked worker, before it serves: close every descriptor the supervisor holds and every
 * supervisor end of a socket pair (other workers'), so that no worker keeps memory alive. */
void vh_broker_child(const int *supervisor_ends, uint32_t n);
/* Answer what the worker of channel chan asked on its socket (nothing waits).  -1 once the worker
 * is gone (its socket's other end closed), else 0. */
int vh_broker_serve(struct vh_fwd *f, int sock, uint32_t chan);
/* Close the descriptors whose table entries are gone (the handle was released, the process
 * ended); cheap when none is held. */
void vh_broker_sweep(struct vh_fwd *f);

/* ---- in a worker -------------------------------------------------------------------- */

/* Give the supervisor the descriptor of the handle exported under slot (its entry pending, with
 * token).  0; VH_BROKER_FULL if it holds all it may; or -1. */
#define VH_BROKER_FULL (-2)
int vh_broker_put(int sock, uint32_t slot, const uint8_t token[16], int fd);
/* A descriptor for the handle exported under slot with token, or -1. */
int vh_broker_get(int sock, uint32_t slot, const uint8_t token[16]);

#endif
