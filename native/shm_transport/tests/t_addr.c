/* The ABI holds offsets only: a guest process that maps the region at another
 * address (as a VM maps its ivshmem BAR) talks to the host unchanged, heap
 * offsets included.  The region here is a real /dev/shm file, as for containers. */
#include "common.h"

#define NAME_FMT "/dev/shm/vmgpu-t_addr-%d"

static int guest(const char *path, uint64_t size, uintptr_t host_addr)
{
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	/* occupy the range the host used, so our mapping lands elsewhere */
	void *hold = mmap((void *)host_addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(hold != MAP_FAILED);
	void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(base != MAP_FAILED);
	CHECK((uintptr_t)base != host_addr);
	struct vmgpu_guest *g;
	struct vmgpu_gchan *c;
	CHECK_EQ(vmgpu_guest_attach(base, size, NULL, &g), 0);
	test_claim(g, &c);
	for (int i = 0; i < 100; i++) {
		uint64_t off;
		CHECK_EQ(vmgpu_guest_heap_alloc(c, 4096, &off), 0);
		snprintf(vmgpu_guest_ptr(g, off), 64, "record %d at offset %llu", i, (unsigned long long)off);
		uint64_t msg[2] = {off, (uint64_t)(uintptr_t)base};
		CHECK_EQ(vmgpu_gchan_send(c, 1, msg, sizeof msg, SEC), 0);
		uint64_t ok = 0;
		uint16_t t;
		CHECK_EQ(vmgpu_gchan_recv(c, &ok, sizeof ok, &t, 5 * SEC), sizeof ok);
		CHECK_EQ(ok, 1);
		CHECK_EQ(vmgpu_guest_heap_free(c, off), 0);
	}
	vmgpu_gchan_close(c);
	vmgpu_guest_detach(g);
	return 0;
}

int main(void)
{
	watchdog(60);
	char path[128];
	snprintf(path, sizeof path, NAME_FMT, getpid());
	uint64_t size = 32 << 20;
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0) {
		printf("t_addr: skip: cannot create %s: %s\n", path, strerror(errno));
		return 77;
	}
	CHECK(ftruncate(fd, (off_t)size) == 0);
	void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(base != MAP_FAILED);
	struct vmgpu_shm_params p;
	vmgpu_shm_params_default(&p);
	p.nchannels = 2;
	p.bulk_size = 64 << 10;
	CHECK_EQ(vmgpu_region_format(base, size, &p, "t_addr"), 0);
	struct vmgpu_host *h;
	CHECK_EQ(vmgpu_host_attach(base, size, &p, NULL, &h), 0);

	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		munmap(base, size); /* the child has only its own mapping */
		_exit(guest(path, size, (uintptr_t)base));
	}
	int served = 0, saw_other_addr = 0;
	uint64_t deadline = vmgpu_now_ns() + 30 * SEC;
	while (served < 100 && vmgpu_now_ns() < deadline) {
		vmgpu_host_beat(h);
		for (uint32_t i = 0; i < 2; i++) {
			struct vmgpu_hchan *c = vmgpu_host_chan(h, i);
			int ev = vmgpu_hchan_poll(c, vmgpu_now_ns());
			if (ev != VMGPU_HC_OPENED && ev != VMGPU_HC_SERVING)
				continue;
			uint64_t msg[2];
			uint16_t t;
			if (vmgpu_hchan_recv(c, msg, sizeof msg, &t, 10 * MS) != sizeof msg)
				continue;
			char want[64];
			snprintf(want, sizeof want, "record %d at offset %llu", served, (unsigned long long)msg[0]);
			const char *s = vmgpu_host_heap(h, msg[0], sizeof want);
			uint64_t ok = s && strcmp(s, want) == 0;
			saw_other_addr |= msg[1] != (uint64_t)(uintptr_t)base;
			CHECK_EQ(vmgpu_hchan_send(c, 2, &ok, sizeof ok, SEC), 0);
			served++;
		}
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	unlink(path);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK_EQ(served, 100);
	CHECK(saw_other_addr);
	vmgpu_host_detach(h);
	puts("t_addr: ok");
	return 0;
}
