/* A guest process scribbles over the whole region header (magic, version,
 * geometry, features, limits, state): guests attached before keep working, and
 * once the host has re-published its header (every tick of its loop) a new
 * guest attaches, claims and is served.  Re-publishing an intact header writes
 * nothing. */
#include "common.h"

static void roundtrip(struct vmgpu_gchan *c)
{
	uint8_t buf[64] = "ping", in[64];
	uint16_t t;
	CHECK_EQ(vmgpu_gchan_send(c, 5, buf, 5, SEC), 0);
	CHECK_EQ(vmgpu_gchan_recv(c, in, sizeof in, &t, 5 * SEC), 5);
	CHECK(strcmp((char *)in, "ping") == 0 && t == 6);
}

/* Random bytes over the header page, 8 at a time (other threads read it). */
static void scribble(void *base, uint64_t *seed)
{
	uint64_t *w = base;
	for (size_t i = 0; i < VMGPU_PAGE / 8; i++)
		__atomic_store_n(&w[i], xorshift(seed), __ATOMIC_RELAXED);
}

/* The first n bytes of the shared header equal want (read 8 at a time, atomically). */
static int words_equal(void *base, const uint8_t *want, size_t n)
{
	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = __atomic_load_n((uint64_t *)((uint8_t *)base + i), __ATOMIC_RELAXED);
		if (memcmp(&v, want + i, 8) != 0)
			return 0;
	}
	return 1;
}

int main(void)
{
	watchdog(60);
	struct test_region r;
	test_region_create(&r, 32 << 20, NULL);
	uint8_t intact[VMGPU_PAGE];
	struct echo_host e;
	echo_host_start(&e, &r, 0);
	struct vmgpu_guest *old;
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &old), 0);
	struct vmgpu_gchan *a;
	test_claim(old, &a);
	roundtrip(a);
	usleep(30 * 1000);
	/* intact: nothing to rewrite */
	CHECK_EQ(vmgpu_host_republish(e.h), 0);

	uint64_t seed = 0x9e3779b97f4a7c15ull;
	for (int round = 0; round < 20; round++) {
		for (size_t i = 0; i < sizeof intact; i += 8) {
			uint64_t v = __atomic_load_n((uint64_t *)((uint8_t *)r.base + i), __ATOMIC_RELAXED);
			memcpy(intact + i, &v, 8);
		}
		scribble(r.base, &seed);
		/* the guest attached before keeps working meanwhile */
		roundtrip(a);
		/* a new guest gets in once the host has re-published (within its loop's ticks) */
		struct vmgpu_guest *g = NULL;
		uint64_t t0 = vmgpu_now_ns();
		while (vmgpu_guest_attach(r.base, r.size, NULL, &g) != 0) {
			CHECK(vmgpu_now_ns() - t0 < 5 * SEC);
			usleep(1000);
		}
		/* the attach may have come while the host was still rewriting later
		 * words: wait (bounded) until its whole part reads back intact */
		const size_t owned = offsetof(struct vmgpu_region_header, host_heartbeat);
		t0 = vmgpu_now_ns();
		while (!words_equal(r.base, intact, owned)) {
			CHECK(vmgpu_now_ns() - t0 < 5 * SEC);
			usleep(1000);
		}
		struct vmgpu_region_header *h = r.base;
		CHECK_EQ(__atomic_load_n(&h->magic, __ATOMIC_RELAXED), VMGPU_SHM_MAGIC);
		CHECK_EQ(__atomic_load_n(&h->version_minor, __ATOMIC_RELAXED), VMGPU_SHM_VERSION_MINOR);
		CHECK_EQ(__atomic_load_n(&h->features, __ATOMIC_RELAXED), VMGPU_FEATURES);
		CHECK_EQ(__atomic_load_n(&h->chans_per_owner, __ATOMIC_RELAXED), VMGPU_CHANS_PER_OWNER_DEFAULT);
		CHECK_EQ(atomic_load(&h->region_state), VMGPU_REGION_READY);
		struct vmgpu_gchan *b;
		test_claim(g, &b);
		roundtrip(b);
		roundtrip(a);
		vmgpu_gchan_close(b);
		vmgpu_guest_detach(g);
	}
	CHECK_EQ(e.lost, 0);
	vmgpu_gchan_close(a);
	echo_host_stop(&e);
	vmgpu_guest_detach(old);
	puts("t_republish: ok");
	return 0;
}
