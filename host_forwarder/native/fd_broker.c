/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The descriptors of exported VMM handles, held by the supervisor for the guest's workers
 * (fd_broker.h).  The boundary: a descriptor is memory on the GPU, kept alive as long as anyone
 * holds it, so the supervisor holds one only while its entry in the IPC table is there (the
 * exporter still holds the handle, and its process lives), hands a copy only to a worker that
 * names the entry's slot and token, and no worker keeps one it did not ask for (a forked worker
 * closes every one it inherited).  Messages are fixed-size records on SOCK_SEQPACKET pairs made
 * by the supervisor itself: no one outside the forwarder can reach them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "fd_broker.h"
#include "forwarder.h"
#include "ipc.h"
#include "log.h"

enum { BROKER_PUT = 1, BROKER_GET = 2 };

struct broker_msg {
	uint32_t op;
	uint32_t slot;
	uint8_t token[16];
	int32_t status; /* the answer: 0, or -1 */
	uint32_t seq;   /* a worker's request number, echoed: a late answer to an earlier one is dropped */
};

/* The supervisor's descriptors, by IPC table slot (-1: none). */
static struct held {
	int fd;
	uint8_t token[16];
} held[VH_IPC_SLOTS];
static uint32_t nheld, held_cap = VH_IPC_SLOTS;
static int held_ready;

static void held_init(void)
{
	if (held_ready)
		return;
	for (uint32_t i = 0; i < VH_IPC_SLOTS; i++)
		held[i].fd = -1;
	held_ready = 1;
}

static void held_drop(uint32_t slot)
{
	if (held[slot].fd >= 0) {
		close(held[slot].fd);
		held[slot].fd = -1;
		nheld--;
	}
}

/* Send a record, with fd attached if fd >= 0. */
static int send_msg(int sock, const struct broker_msg *m, int fd)
{
	struct iovec iov = {(void *)m, sizeof *m};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		memset(&u, 0, sizeof u);
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof u.buf;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof fd);
	}
	ssize_t n;
	do
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n == (ssize_t)sizeof *m ? 0 : -1;
}

/* Receive one record: its size (1 for one cut short); 0 if the peer is gone; -1 if none is waiting
 * (or, blocking, none came in time).  *fd is the one descriptor it
 * carried, or -1; any other descriptor that came with it is closed (a record carries at most one). */
static ssize_t recv_msg(int sock, struct broker_msg *m, int *fd, int flags)
{
	struct iovec iov = {m, sizeof *m};
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	*fd = -1;
	ssize_t n;
	do
		n = recvmsg(sock, &mh, flags | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : 0; /* none waiting, or the peer gone */
	if (n == 0)
		return 0; /* the peer is gone (a record is never empty) */
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int d;
			memcpy(&d, CMSG_DATA(c) + i * sizeof(int), sizeof d);
			if (*fd < 0)
				*fd = d;
			else
				close(d);
		}
	}
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		return 1; /* not a whole record: answered as a bad one */
	}
	return n;
}

/* ---- the supervisor ------------------------------------------------------------------ */

void vh_broker_init(uint32_t nchannels)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t was = rl.rlim_cur;
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			rl.rlim_cur = was;
	}
	/* the workers' sockets, the region, logs, the image cache and the rest: a margin */
	rlim_t reserve = 2 * (rlim_t)nchannels + 64;
	rlim_t room = rl.rlim_cur > reserve ? rl.rlim_cur - reserve : 0;
	if (room < VH_IPC_SLOTS) {
		held_cap = (uint32_t)room;
		vh_log("open files are limited to %llu: at most %u VMM handles can be shared between this guest's "
		       "processes at once (raise RLIMIT_NOFILE for %u)",
		       (unsigned long long)rl.rlim_cur, held_cap, VH_IPC_SLOTS);
	}
}

int vh_broker_pair(int *worker_end)
{
	held_init();
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
		vh_log("cannot make a worker's descriptor socket: %s (its VMM handles cannot be shared)",
		       strerror(errno));
		*worker_end = -1;
		return -1;
	}
	struct timeval tv = {5, 0}; /* the worker waits for its supervisor at most this long */
	setsockopt(sv[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(sv[1], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	int fl = fcntl(sv[0], F_GETFL);
	if (fl < 0 || fcntl(sv[0], F_SETFL, fl | O_NONBLOCK) != 0) {
		close(sv[0]);
		close(sv[1]);
		*worker_end = -1;
		return -1;
	}
	*worker_end = sv[1];
	return sv[0];
}

void vh_broker_child(const int *supervisor_ends, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (supervisor_ends[i] >= 0)
			close(supervisor_ends[i]);
	for (uint32_t i = 0; held_ready && i < VH_IPC_SLOTS; i++)
		if (held[i].fd >= 0)
			close(held[i].fd);
	nheld = 0;
	held_ready = 0;
}

int vh_broker_serve(struct vh_fwd *f, int sock, uint32_t chan)
{
	for (int k = 0; k < 64; k++) { /* (a worker waits for each answer: one record at a time) */
		struct broker_msg m = {0};
		int fd;
		ssize_t n = recv_msg(sock, &m, &fd, MSG_DONTWAIT);
		if (n == 0)
			return -1; /* the worker is gone (reaped elsewhere) */
		if (n < 0)
			return 0; /* nothing more */
		struct broker_msg rep = {.op = m.op, .slot = m.slot, .status = -1, .seq = m.seq};
		uint32_t owner = 0;
		int state = n == (ssize_t)sizeof m && m.slot < VH_IPC_SLOTS ? vh_ipc_vmm_state(f, m.slot, m.token, &owner)
									       : VH_IPC_VMM_NONE;
		int give = -1;
		if (m.op == BROKER_PUT && fd >= 0 && state == VH_IPC_VMM_PENDING && owner == chan &&
		    held[m.slot].fd < 0 && nheld >= held_cap) {
			rep.status = VH_BROKER_FULL; /* the descriptors it may hold are all held */
		} else if (m.op == BROKER_PUT && fd >= 0 && state == VH_IPC_VMM_PENDING && owner == chan) {
			/* the worker of chan is exporting into this slot: keep the descriptor */
			held_drop(m.slot);
			held[m.slot].fd = fd;
			memcpy(held[m.slot].token, m.token, sizeof m.token);
			nheld++;
			fd = -1;
			rep.status = 0;
		} else if (m.op == BROKER_GET && state == VH_IPC_VMM_READY && held[m.slot].fd >= 0 &&
			   memcmp(held[m.slot].token, m.token, sizeof m.token) == 0) {
			give = held[m.slot].fd;
			rep.status = 0;
		}
		if (fd >= 0)
			close(fd); /* a descriptor nobody asked us to keep */
		if (send_msg(sock, &rep, give) != 0 && rep.status == 0 && m.op == BROKER_PUT)
			held_drop(m.slot); /* the worker will not mark it exported: do not keep it */
	}
	return 0;
}

void vh_broker_sweep(struct vh_fwd *f)
{
	static struct vh_ipc_vmm_view view[VH_IPC_SLOTS];
	if (!nheld)
		return;
	vh_ipc_vmm_view(f, view);
	for (uint32_t i = 0; nheld && i < VH_IPC_SLOTS; i++)
		if (held[i].fd >= 0 &&
		    (view[i].state == VH_IPC_VMM_NONE || memcmp(view[i].token, held[i].token, sizeof view[i].token) != 0))
			held_drop(i);
}

/* ---- a worker ------------------------------------------------------------------------ */

/* One request and its answer: the answer's status (0, or negative), with *fd_in its descriptor
 * (or -1); -1 if no answer came. */
static int ask(int sock, uint32_t op, uint32_t slot, const uint8_t token[16], int fd_out, int *fd_in)
{
	static uint32_t seq;
	struct broker_msg m = {.op = op, .slot = slot, .seq = ++seq};
	memcpy(m.token, token, sizeof m.token);
	*fd_in = -1;
	if (sock < 0 || send_msg(sock, &m, fd_out) != 0)
		return -1;
	for (;;) { /* each wait bounded by the socket's receive timeout */
		struct broker_msg rep = {0};
		int fd;
		ssize_t n = recv_msg(sock, &rep, &fd, 0);
		if (n <= 0)
			return -1;
		if (n == (ssize_t)sizeof rep && rep.seq == m.seq && rep.op == op && rep.slot == slot) {
			if (rep.status == 0) {
				*fd_in = fd;
				return 0;
			}
			if (fd >= 0)
				close(fd);
			return rep.status < 0 ? rep.status : -1;
		}
		if (fd >= 0)
			close(fd); /* a late answer to an earlier request */
	}
}

int vh_broker_put(int sock, uint32_t slot, const uint8_t token[16], int fd)
{
	int back;
	int r = ask(sock, BROKER_PUT, slot, token, fd, &back);
	if (back >= 0)
		close(back);
	return r;
}

int vh_broker_get(int sock, uint32_t slot, const uint8_t token[16])
{
	int fd;
	if (ask(sock, BROKER_GET, slot, token, -1, &fd) != 0 || fd < 0)
		return -1;
	return fd;
}
