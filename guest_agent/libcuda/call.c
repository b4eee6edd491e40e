/* SPDX-License-Identifier: Apache-2.0 */
/* The call helpers the generated entries use: build a request in place, send it, read the reply. */
#include <stddef.h>
#include <string.h>

#include "call.h"
#include "connection.h"
#include "context.h"

static uint64_t seq;

CUresult vg_begin(struct vg_call *c, uint32_t op, unsigned flags)
{
	CUresult r = vg_check_ready();
	if (r != CUDA_SUCCESS)
		return r;
	vg_lock();
	int dev = vg_current_device();
	struct vg_req_hdr h = {op, dev < 0 ? VG_NO_DEVICE : (uint16_t)dev, (uint16_t)flags, ++seq};
	memcpy(vg_conn.send_buf, &h, sizeof h);
	*c = (struct vg_call){.buf = vg_conn.send_buf, .len = sizeof h, .cap = vg_conn.send_cap};
	return CUDA_SUCCESS;
}

void vg_put(struct vg_call *c, const void *p, size_t n)
{
	size_t padded = (n + 7) & ~(size_t)7;
	if (c->bad || padded > c->cap - c->len) {
		c->bad = 1;
		return;
	}
	if (n)
		memcpy(c->buf + c->len, p, n);
	memset(c->buf + c->len + n, 0, padded - n);
	c->len += (uint32_t)padded;
}

void vg_put_u64(struct vg_call *c, uint64_t v)
{
	vg_put(c, &v, 8);
}

void vg_put_opt(struct vg_call *c, const void *p, size_t n)
{
	vg_put_u64(c, p != NULL);
	if (p)
		vg_put(c, p, n);
}

void vg_put_arr(struct vg_call *c, const void *p, uint64_t count, size_t elsz)
{
	if (!p)
		count = 0;
	if (elsz && count > c->cap / elsz) {
		c->bad = 1;
		return;
	}
	vg_put_u64(c, count);
	vg_put(c, p, count * elsz);
}

void vg_put_str(struct vg_call *c, const char *s)
{
	if (!s) {
		c->bad = 1;
		return;
	}
	vg_put_arr(c, s, strlen(s) + 1, 1);
}

void vg_put_ctx(struct vg_call *c, CUcontext ctx)
{
	int o = vg_context_device(ctx);
	vg_put_u64(c, o < 0 ? UINT64_MAX : (uint64_t)o + 1);
}

static CUresult send_req(struct vg_call *c)
{
	int e = vmgpu_gchan_send(vg_conn.chan, VG_REC_REQUEST, c->buf, c->len, VG_WAIT_FOREVER_NS);
	return e < 0 ? vg_lose("send", e) : CUDA_SUCCESS;
}

CUresult vg_send_request(struct vg_call *c)
{
	if (c->bad)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&c->seq, c->buf + offsetof(struct vg_req_hdr, seq), sizeof c->seq);
	return send_req(c);
}

CUresult vg_call_sync(struct vg_call *c)
{
	CUresult r = vg_send_request(c);
	return r == CUDA_SUCCESS ? vg_wait_reply(c) : r;
}

CUresult vg_wait_reply(struct vg_call *c)
{
	uint16_t type = 0;
	int n = vmgpu_gchan_recv(vg_conn.chan, vg_conn.reply_buf, vg_conn.reply_cap, &type, VG_WAIT_FOREVER_NS);
	if (n < 0)
		return vg_lose("receive", n);
	struct vg_rep_hdr rep;
	if (type != VG_REC_REPLY || (uint32_t)n < sizeof rep)
		return vg_lose("reply", 0);
	memcpy(&rep, vg_conn.reply_buf, sizeof rep);
	if (rep.seq != c->seq)
		return vg_lose("reply order", 0);
	c->reply = vg_conn.reply_buf + sizeof rep;
	c->reply_len = (uint32_t)n - sizeof rep;
	c->reply_pos = 0;
	return (CUresult)rep.result;
}

const void *vg_get_ref(struct vg_call *c, size_t n)
{
	size_t padded = (n + 7) & ~(size_t)7;
	if (c->bad || !c->reply || padded > c->reply_len - c->reply_pos) {
		c->bad = 1;
		return NULL;
	}
	const void *p = c->reply + c->reply_pos;
	c->reply_pos += (uint32_t)padded;
	return p;
}

void vg_get(struct vg_call *c, void *dst, size_t n)
{
	const void *p = vg_get_ref(c, n);
	if (p)
		memcpy(dst, p, n);
	else
		memset(dst, 0, n);
}

uint64_t vg_get_u64(struct vg_call *c)
{
	uint64_t v;
	vg_get(c, &v, 8);
	return v;
}

CUresult vg_end(struct vg_call *c, CUresult r)
{
	(void)c;
	vg_unlock();
	return r;
}

CUresult vg_send_async(struct vg_call *c)
{
	CUresult r;
	if (c->bad) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		struct vg_req_hdr *h = (struct vg_req_hdr *)c->buf;
		h->flags |= VG_F_NOREPLY;
		r = send_req(c);
	}
	vg_unlock();
	return r;
}
