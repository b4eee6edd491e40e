/*
 * Two processes of one guest sharing VMM memory through a file descriptor, as NCCL's cuMem path
 * does:
 *   vmm_fd_pair GPU_A GPU_B [nodata]
 * The process forks before cuInit.  A (on GPU_A) makes a 2 MiB handle exportable as a descriptor
 * (cuMemCreate with requestedHandleTypes = POSIX_FILE_DESCRIPTOR), maps it, fills it, exports the
 * descriptor and sends it to B over a Unix socket (SCM_RIGHTS).  B (on GPU_B) imports it, reads
 * its properties, maps it and gives its own GPU access, checks it reads A's bytes, overwrites the
 * memory and tells A; A checks it reads B's bytes.  Each frees as NCCL does (the handle retained
 * from the address, then released twice).  "nodata" skips the two byte checks (the simulated
 * backend does not share bytes between processes).  Prints one line per step, "<who> <step>
 * <CUresult>", and exits 0 only if every step succeeded.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pair_steps.h"

#define N (2u << 20)

static int send_fd(int sock, int fd)
{
	char b = 'f';
	struct iovec iov = {&b, 1};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof u);
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof fd);
	return sendmsg(sock, &mh, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock)
{
	char b;
	struct iovec iov = {&b, 1};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	if (recvmsg(sock, &mh, 0) != 1)
		return -1;
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	int fd = -1;
	if (c && c->cmsg_type == SCM_RIGHTS)
		memcpy(&fd, CMSG_DATA(c), sizeof fd);
	return fd;
}

static int sync_byte(int sock, int out)
{
	char b = 's';
	return (out ? write(sock, &b, 1) : read(sock, &b, 1)) == 1 ? 0 : -1;
}

/* Reserve, map and give gpu read-write access to handle h's N bytes. */
static int map(const char *who, CUmemGenericAllocationHandle h, int gpu, CUdeviceptr *p)
{
	CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, gpu}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	if (step(who, "reserve", cuMemAddressReserve(p, N, 0, 0, 0)) || step(who, "map", cuMemMap(*p, N, 0, h, 0)) ||
	    step(who, "access", cuMemSetAccess(*p, N, &a, 1)))
		return -1;
	return 0;
}

/* As NCCL frees: the handle retained from the address, released, unmapped, released again. */
static void unmap(const char *who, CUdeviceptr p)
{
	CUmemGenericAllocationHandle h;
	step(who, "retain", cuMemRetainAllocationHandle(&h, (void *)(p + 4096)));
	step(who, "release_retained", cuMemRelease(h));
	step(who, "unmap", cuMemUnmap(p, N));
	step(who, "release", cuMemRelease(h));
	step(who, "address_free", cuMemAddressFree(p, N));
}

static int importer(int gpu, int sock, int data)
{
	static unsigned char buf[N];
	int fd = recv_fd(sock);
	if (fd < 0 || context(gpu, "B"))
		return 1;
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop;
	CUdeviceptr p;
	if (step("B", "import", cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
							     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)))
		return 1;
	close(fd);
	if (step("B", "properties", cuMemGetAllocationPropertiesFromHandle(&prop, h)))
		return 1;
	step("B", "properties_device",
	     prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
	if (map("B", h, gpu, &p) || step("B", "read", cuMemcpyDtoH(buf, p, N)))
		return 1;
	if (data) {
		int ok = 1;
		for (unsigned i = 0; i < N; i++)
			ok &= buf[i] == (unsigned char)(i * 7 + 3);
		step("B", "reads_a_bytes", ok ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
	}
	step("B", "overwrite", cuMemsetD8(p, 0x5a, N));
	step("B", "sync", cuCtxSynchronize());
	if (sync_byte(sock, 1) || sync_byte(sock, 0))
		return 1;
	unmap("B", p); /* its last release is the import's hold */
	return failed;
}

int main(int argc, char **argv)
{
	int gpu_a = argc > 1 ? atoi(argv[1]) : 0, gpu_b = argc > 2 ? atoi(argv[2]) : 0;
	int data = !(argc > 3 && !strcmp(argv[3], "nodata"));
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return 2;
	pid_t child = fork();
	if (child < 0)
		return 2;
	if (child == 0) {
		close(sv[0]);
		_exit(importer(gpu_b, sv[1], data));
	}
	close(sv[1]);
	static unsigned char buf[N];
	for (unsigned i = 0; i < N; i++)
		buf[i] = (unsigned char)(i * 7 + 3);
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
				    .location = {CU_MEM_LOCATION_TYPE_DEVICE, gpu_a}};
	size_t gran = 0;
	CUmemGenericAllocationHandle h;
	CUdeviceptr p;
	int fd = -1, status = 0;
	if (context(gpu_a, "A") ||
	    step("A", "granularity", cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) ||
	    step("A", "granularity_divides", gran && N % gran == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN) ||
	    step("A", "create", cuMemCreate(&h, N, &prop, 0)) || map("A", h, gpu_a, &p) ||
	    step("A", "fill", cuMemcpyHtoD(p, buf, N)) ||
	    step("A", "export", cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) ||
	    send_fd(sv[0], fd) || sync_byte(sv[0], 0)) {
		close(sv[0]);
		waitpid(child, &status, 0);
		return 1;
	}
	close(fd);
	step("A", "read", cuMemcpyDtoH(buf, p, N));
	if (data) {
		int ok = 1;
		for (unsigned i = 0; i < N; i++)
			ok &= buf[i] == 0x5a;
		step("A", "reads_b_bytes", ok ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
	}
	if (sync_byte(sv[0], 1))
		failed = 1;
	waitpid(child, &status, 0);
	step("A", "importer_exit", WIFEXITED(status) ? (CUresult)WEXITSTATUS(status) : CUDA_ERROR_UNKNOWN);
	unmap("A", p); /* its last release is cuMemCreate's hold */
	printf("vmm_fd_pair %s\n", failed ? "FAILED" : "ok");
	return failed;
}
