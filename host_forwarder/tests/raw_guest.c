/* SPDX-License-Identifier: Apache-2.0 */
/* A guest that speaks the wire protocol itself (raw_guest.h). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "raw_guest.h"
#include "vg_wire.h"

int raw_guest_open(struct raw_guest *rg, const char *path, int attach_tries)
{
	int fd = open(path, O_RDWR);
	struct stat st;
	if (fd < 0 || fstat(fd, &st)) {
		perror(path);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	rg->size = (uint64_t)st.st_size;
	rg->base = mmap(NULL, rg->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (!rg->reply_timeout_ns)
		rg->reply_timeout_ns = 10000000000ull;
	struct vmgpu_wait_opts wo;
	vmgpu_wait_opts_default(&wo);
	int e = -1;
	for (int tries = 0; rg->base != MAP_FAILED && tries < attach_tries && e; tries++) {
		e = vmgpu_guest_attach(rg->base, rg->size, &wo, &rg->g);
		if (e)
			usleep(1000);
	}
	if (e || vmgpu_guest_claim(rg->g, 5000000000ull, &rg->ch)) {
		fprintf(stderr, "attach: %s\n", vmgpu_shm_errmsg());
		return -1;
	}
	vmgpu_gchan_autobeat(rg->ch, 100000000ull);
	return 0;
}

void raw_guest_close(struct raw_guest *rg)
{
	vmgpu_gchan_close(rg->ch);
	vmgpu_guest_detach(rg->g);
	munmap(rg->base, rg->size);
}

int raw_call(struct raw_guest *rg, uint32_t op, uint16_t dev, uint16_t flags, const void *args, uint32_t len)
{
	struct vg_req_hdr h = {op, dev, flags, ++rg->seq};
	memcpy(rg->req, &h, sizeof h);
	if (len)
		memcpy(rg->req + sizeof h, args, len);
	rg->rlen = 0;
	if (vmgpu_gchan_send(rg->ch, VG_REC_REQUEST, rg->req, sizeof h + len, 5000000000ull) < 0) {
		fprintf(stderr, "send failed: %s\n", vmgpu_shm_errmsg());
		return -1;
	}
	if (flags & VG_F_NOREPLY)
		return 0;
	uint16_t type;
	int n = vmgpu_gchan_recv(rg->ch, rg->rep, sizeof rg->rep, &type, rg->reply_timeout_ns);
	if (n < (int)sizeof(struct vg_rep_hdr)) {
		fprintf(stderr, "no reply to op %u: the forwarder's worker is gone (%d: %s)\n", op, n, vmgpu_shm_errmsg());
		return -1;
	}
	struct vg_rep_hdr r;
	memcpy(&r, rg->rep, sizeof r);
	if (r.seq != rg->seq) {
		fprintf(stderr, "reply out of order\n");
		return -1;
	}
	rg->rlen = (uint32_t)n - sizeof r;
	return r.result;
}

uint64_t raw_out(const struct raw_guest *rg, unsigned i)
{
	uint64_t v = 0;
	if ((i + 1) * 8 <= rg->rlen)
		memcpy(&v, rg->rep + sizeof(struct vg_rep_hdr) + i * 8, 8);
	return v;
}
