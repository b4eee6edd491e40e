/* Fuzz the host side with hostile region contents.  The region sits between
 * PROT_NONE guard pages, so a read or write outside it crashes; build with
 * ASan/UBSan to catch the rest.  Every pointer and length the host hands out
 * is also checked to lie inside the region.
 *
 * Builds as a libFuzzer target (LLVMFuzzerTestOneInput) or, without
 * -DVMGPU_LIBFUZZER, as a standalone driver: fuzz_host SECONDS [SEED]. */
#include "common.h"

#define RSIZE (4u << 20)
static uint8_t *region;
static struct vmgpu_shm_params P;

static void setup(void)
{
	if (region)
		return;
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *m = mmap(NULL, RSIZE + 2 * (size_t)pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED);
	CHECK(mprotect(m + pg, RSIZE, PROT_READ | PROT_WRITE) == 0);
	region = m + pg;
	vmgpu_shm_params_default(&P);
	P.nchannels = 2;
	P.req_ring_size = 4096;
	P.cpl_ring_size = 4096;
	P.bulk_size = 64 << 10;
	P.heap_block_size = 64 << 10;
}

static inline int inside(const void *p, uint64_t len)
{
	const uint8_t *q = p;
	return q >= region && q <= region + RSIZE && len <= (uint64_t)(region + RSIZE - q);
}

struct in {
	const uint8_t *d;
	size_t n, i;
};
static uint64_t take(struct in *in, int bytes)
{
	uint64_t v = 0;
	for (int k = 0; k < bytes; k++)
		v |= (uint64_t)(in->i < in->n ? in->d[in->i++] : 0) << (8 * k);
	return v;
}

/* A guest claim written by hand (the fuzzer is the guest). */
static void fake_claim(const struct vmgpu_layout *l, uint32_t i, uint32_t gen, uint32_t version)
{
	struct vmgpu_chan_desc *d = (struct vmgpu_chan_desc *)(region + l->chan_table_off) + i;
	d->guest_version = version;
	atomic_store(&d->ctl, (uint64_t)VMGPU_CHAN_ACTIVE | ((uint64_t)gen << 32));
}

/* Write a record header at a ring offset, with any length and type. */
static void put_rec(const struct vmgpu_layout *l, uint32_t ch, int cpl, uint32_t off, uint32_t len, uint16_t type)
{
	uint8_t *blk = test_chan_block(region, l, ch);
	uint32_t size = cpl ? l->cpl_ring_size : l->req_ring_size;
	uint8_t *ring = blk + (cpl ? l->cpl_ring_off : l->req_ring_off);
	off &= (size - 1) & ~7u;
	struct vmgpu_rec_hdr *h = (struct vmgpu_rec_hdr *)(ring + off);
	h->type = type;
	atomic_store(&h->len, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	setup();
	struct in in = {data, size, 0};
	CHECK_EQ(vmgpu_region_format(region, RSIZE, &P, "fuzz"), 0);
	struct vmgpu_wait_opts o;
	vmgpu_wait_opts_default(&o);
	o.spin_ns = 0;
	o.peer_timeout_ns = take(&in, 1) & 1 ? 0 : 1000000000ull;
	struct vmgpu_host *h;
	CHECK_EQ(vmgpu_host_attach(region, RSIZE, &P, &o, &h), 0);
	const struct vmgpu_layout *l = vmgpu_host_layout(h);
	uint8_t buf[4096];
	for (int step = 0; step < 64 && in.i < in.n; step++) {
		uint32_t op = (uint32_t)take(&in, 1) % 12, ch = (uint32_t)take(&in, 1) % 2;
		struct vmgpu_hchan *c = vmgpu_host_chan(h, ch);
		switch (op) {
		case 0: /* hostile bytes anywhere in the region */
		{
			uint64_t off = take(&in, 4) % RSIZE;
			uint32_t n = (uint32_t)take(&in, 1) % 16;
			for (uint32_t k = 0; k < n && off + k < RSIZE; k++)
				region[off + k] = (uint8_t)take(&in, 1);
			break;
		}
		case 1: /* hostile bytes in the control structures, where it hurts */
		{
			uint64_t areas[] = {0, l->chan_table_off, l->chan_area_off, l->chan_area_off + l->chan_stride,
					    l->heap_map_off};
			uint64_t off = areas[take(&in, 1) % 5] + take(&in, 2) % 4096;
			uint64_t v = take(&in, 8);
			memcpy(region + off, &v, off + 8 <= RSIZE ? 8 : 0);
			break;
		}
		case 2:
			fake_claim(l, ch, (uint32_t)take(&in, 1) + 1,
				   take(&in, 1) & 1 ? (VMGPU_SHM_VERSION_MAJOR << 16) : (uint32_t)take(&in, 4));
			break;
		case 3:
			put_rec(l, ch, 0, (uint32_t)take(&in, 2), (uint32_t)take(&in, 4) % 8192,
				(uint16_t)(take(&in, 1) % 3));
			break;
		case 4:
			vmgpu_hchan_poll(c, vmgpu_now_ns() + take(&in, 4) * 1000);
			break;
		case 5: {
			uint16_t t;
			uint32_t cap = (uint32_t)take(&in, 2) % sizeof buf;
			int n = vmgpu_hchan_recv(c, buf, cap, &t, 0);
			CHECK(n < 0 || (uint32_t)n <= cap);
			break;
		}
		case 6: {
			uint32_t n = (uint32_t)take(&in, 2) % 3000;
			memset(buf, 0xAB, n);
			vmgpu_hchan_send(c, 1, buf, n, 0);
			break;
		}
		case 7: {
			uint64_t pos = take(&in, 8), len = take(&in, 4) | (take(&in, 1) & 1 ? 0 : take(&in, 8));
			void *p = vmgpu_hchan_bulk(c, pos, len);
			if (p) {
				CHECK(inside(p, len));
				if (len)
					((volatile uint8_t *)p)[len - 1] ^= 0;
			}
			break;
		}
		case 8:
			vmgpu_hchan_bulk_release(c, take(&in, 8));
			break;
		case 9: {
			uint64_t off = take(&in, 8), len = take(&in, 8);
			if (take(&in, 1) & 1)
				off = l->heap_off + off % (l->heap_size + 1), len %= l->heap_size + 2;
			void *p = vmgpu_host_heap(h, off, len);
			if (p) {
				CHECK(inside(p, len));
				if (len)
					((volatile uint8_t *)p)[len - 1] ^= 0;
			}
			break;
		}
		case 10:
			vmgpu_hchan_reclaim(c);
			break;
		case 11: {
			struct vmgpu_chan_info info;
			CHECK_EQ(vmgpu_region_chan_info(region, RSIZE, l, ch, &info), 0);
			CHECK(info.req_used <= l->req_ring_size && info.bulk_used <= l->bulk_size);
			/* and a host re-attach over a tampered header is refused or fine, never a crash */
			struct vmgpu_host *h2;
			if (vmgpu_host_attach(region, RSIZE, &P, &o, &h2) == 0)
				vmgpu_host_detach(h2);
			break;
		}
		}
	}
	vmgpu_host_detach(h);
	return 0;
}

#ifndef VMGPU_LIBFUZZER
int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 10;
	uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : (uint64_t)time(NULL);
	printf("fuzz_host: %.0f s, seed %llu\n", secs, (unsigned long long)seed);
	fflush(stdout);
	uint64_t end = vmgpu_now_ns() + (uint64_t)(secs * 1e9), s = seed | 1;
	long iters = 0;
	uint8_t data[2048];
	while (vmgpu_now_ns() < end) {
		size_t n = 16 + xorshift(&s) % (sizeof data - 16);
		for (size_t k = 0; k < n; k++)
			data[k] = (uint8_t)xorshift(&s);
		/* bias towards the record paths: claim, write a record, poll, receive */
		if (iters % 2) {
			uint8_t pre[] = {0, 2, 0, 1, 4, 0, 3, 0, (uint8_t)(s >> 8), (uint8_t)(s >> 16), 0, 0, 0, 1, 5, 0, 0, 16};
			memcpy(data + 1, pre, sizeof pre);
		}
		LLVMFuzzerTestOneInput(data, n);
		iters++;
	}
	printf("fuzz_host: %ld inputs, no crash, no access outside the region\n", iters);
	return 0;
}
#endif
