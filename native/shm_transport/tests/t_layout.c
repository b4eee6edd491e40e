/* Geometry, formatting, and refusing regions we do not speak. */
#include "common.h"

int main(void)
{
	watchdog(30);
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	struct vmgpu_layout l;

	/* every area inside the region, page aligned, in order, heap block aligned */
	uint64_t sizes[] = {80ull << 20, 100ull << 20, 256ull << 20, 1ull << 30};
	for (unsigned k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		CHECK_EQ(vmgpu_layout_compute(sizes[k], &p, &l), 0);
		CHECK(l.chan_table_off == VMGPU_PAGE);
		CHECK(l.heap_map_off >= l.chan_table_off + p.nchannels * sizeof(struct vmgpu_chan_desc));
		CHECK(l.chan_area_off >= l.heap_map_off + l.heap_blocks * sizeof(struct vmgpu_heap_block));
		CHECK(l.heap_off >= l.chan_area_off + (uint64_t)p.nchannels * l.chan_stride);
		CHECK(l.heap_off % p.heap_block_size == 0);
		CHECK(l.heap_off + l.heap_size <= sizes[k]);
		CHECK(l.chan_area_off % VMGPU_PAGE == 0 && l.chan_stride % VMGPU_PAGE == 0);
		/* the heap takes what is left, give or take one block and the map */
		CHECK(sizes[k] - (l.heap_off + l.heap_size) < 2 * p.heap_block_size + VMGPU_PAGE);
	}
	/* min size round-trips */
	uint64_t min = vmgpu_region_min_size(&p, 16 << 20);
	CHECK(min > 0);
	CHECK_EQ(vmgpu_layout_compute(min, &p, &l), 0);
	CHECK(l.heap_size >= 16 << 20);
	/* too small, bad params */
	CHECK_EQ(vmgpu_layout_compute(1 << 20, &p, &l), -ENOSPC);
	CHECK(strstr(vmgpu_shm_errmsg(), "too small"));
	struct vmgpu_shm_params bad = p;
	bad.req_ring_size = 5000;
	CHECK_EQ(vmgpu_layout_compute(128 << 20, &bad, &l), -EINVAL);
	CHECK(strstr(vmgpu_shm_errmsg(), "power of two"));
	bad = p;
	bad.nchannels = 0;
	CHECK_EQ(vmgpu_layout_compute(128 << 20, &bad, &l), -EINVAL);
	bad = p;
	bad.wait_mode = 9;
	CHECK_EQ(vmgpu_layout_compute(128 << 20, &bad, &l), -EINVAL);

	/* format, then both sides attach */
	struct test_region r;
	test_region_create(&r, 128 << 20, &p);
	struct vmgpu_region_header *h = r.base;
	CHECK(h->magic == VMGPU_SHM_MAGIC && h->version_major == VMGPU_SHM_VERSION_MAJOR);
	CHECK(strcmp(h->name, "test") == 0);
	struct vmgpu_host *host;
	struct vmgpu_guest *g;
	CHECK_EQ(vmgpu_host_attach(r.base, r.size, &r.p, NULL, &host), 0);
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &g), 0);
	CHECK(memcmp(vmgpu_guest_layout(g), vmgpu_host_layout(host), sizeof l) == 0);
	vmgpu_guest_detach(g);
	vmgpu_host_detach(host);

	/* the host takes its geometry from its own params, never from the region */
	struct vmgpu_shm_params other = p;
	other.nchannels = 8;
	CHECK_EQ(vmgpu_host_attach(r.base, r.size, &other, NULL, &host), -EINVAL);
	CHECK(strstr(vmgpu_shm_errmsg(), "nchannels"));
	/* a guest that tampered with the geometry is refused by the host, and by a new guest */
	h->heap_off += 4096;
	CHECK_EQ(vmgpu_host_attach(r.base, r.size, &r.p, NULL, &host), -EINVAL);
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &g), -EINVAL);
	h->heap_off -= 4096;
	h->region_size = r.size * 2; /* claims more than is mapped */
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &g), -EINVAL);
	h->region_size = r.size;

	/* another major version: both sides refuse, with a sentence that says so */
	h->version_major = VMGPU_SHM_VERSION_MAJOR + 1;
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &g), -EPROTONOSUPPORT);
	CHECK(strstr(vmgpu_shm_errmsg(), "speaks ABI 2."));
	CHECK_EQ(vmgpu_host_attach(r.base, r.size, &r.p, NULL, &host), -EPROTONOSUPPORT);
	h->version_major = VMGPU_SHM_VERSION_MAJOR;
	/* a newer minor version is fine */
	h->version_minor = VMGPU_SHM_VERSION_MINOR + 3;
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &g), 0);
	vmgpu_guest_detach(g);
	/* not formatted */
	h->magic = 0;
	CHECK_EQ(vmgpu_guest_attach(r.base, r.size, NULL, &g), -EINVAL);
	CHECK(strstr(vmgpu_shm_errmsg(), "not a vmgpu region"));
	puts("t_layout: ok");
	return 0;
}
