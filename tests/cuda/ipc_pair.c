/*
 * Two processes of one guest sharing device memory and an event by CUDA IPC, as NCCL does:
 *   ipc_pair GPU_A GPU_B [nodata]
 * The process forks before cuInit.  A (on GPU_A) fills a 1 MiB block, makes an interprocess event
 * and sends both handles through a pipe; B (on GPU_B) opens them (peer access enabled lazily where
 * the GPUs differ), checks it reads A's bytes, overwrites the block, records the opened event and
 * tells A; A waits on its event and checks it reads B's bytes.  "nodata" skips the two byte checks
 * (the simulated backend does not share bytes between processes).  Prints one line per step,
 * "<step> <CUresult>", and exits 0 only if every step succeeded.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pair_steps.h"

#define N (1u << 20)

static int all(const unsigned char *b, unsigned char v)
{
	for (unsigned i = 0; i < N; i++)
		if (b[i] != v)
			return 0;
	return 1;
}

static int io(int fd, void *buf, size_t n, int out)
{
	for (size_t done = 0; done < n;) {
		ssize_t k = out ? write(fd, (char *)buf + done, n - done) : read(fd, (char *)buf + done, n - done);
		if (k <= 0)
			return -1;
		done += (size_t)k;
	}
	return 0;
}

static int opener(int gpu, int in, int out, int data)
{
	CUipcMemHandle mh;
	CUipcEventHandle eh;
	CUdeviceptr p;
	CUevent ev;
	static unsigned char buf[N];
	char go = 0;
	if (io(in, &mh, sizeof mh, 0) || io(in, &eh, sizeof eh, 0) || context(gpu, "B"))
		return 1;
	if (step("B", "open_mem", cuIpcOpenMemHandle(&p, mh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) ||
	    step("B", "open_event", cuIpcOpenEventHandle(&ev, eh)) || step("B", "read", cuMemcpyDtoH(buf, p, N)))
		return 1;
	if (data) {
		int ok = 1;
		for (unsigned i = 0; i < N; i++)
			ok &= buf[i] == (unsigned char)(i * 7 + 3);
		step("B", "reads_a_bytes", ok ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
	}
	step("B", "overwrite", cuMemsetD8Async(p, 0x5a, N, NULL));
	step("B", "record", cuEventRecord(ev, NULL));
	step("B", "sync", cuCtxSynchronize());
	go = 1;
	if (io(out, &go, 1, 1) || io(in, &go, 1, 0))
		return 1;
	step("B", "close_mem", cuIpcCloseMemHandle(p));
	step("B", "destroy_event", cuEventDestroy(ev));
	return failed;
}

int main(int argc, char **argv)
{
	int gpu_a = argc > 1 ? atoi(argv[1]) : 0, gpu_b = argc > 2 ? atoi(argv[2]) : 0;
	int data = !(argc > 3 && !strcmp(argv[3], "nodata"));
	int a2b[2], b2a[2];
	if (pipe(a2b) || pipe(b2a))
		return 2;
	pid_t child = fork();
	if (child < 0)
		return 2;
	if (child == 0)
		_exit(opener(gpu_b, a2b[0], b2a[1], data));

	static unsigned char buf[N];
	CUdeviceptr p;
	CUevent ev;
	CUipcMemHandle mh;
	CUipcEventHandle eh;
	char go = 0;
	int status = 0;
	for (unsigned i = 0; i < N; i++)
		buf[i] = (unsigned char)(i * 7 + 3);
	if (context(gpu_a, "A") || step("A", "alloc", cuMemAlloc(&p, N)) || step("A", "fill", cuMemcpyHtoD(p, buf, N)) ||
	    step("A", "event", cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)) ||
	    step("A", "export_mem", cuIpcGetMemHandle(&mh, p)) || step("A", "export_event", cuIpcGetEventHandle(&eh, ev)) ||
	    io(a2b[1], &mh, sizeof mh, 1) || io(a2b[1], &eh, sizeof eh, 1) || io(b2a[0], &go, 1, 0)) {
		close(a2b[1]);
		waitpid(child, &status, 0);
		return 1;
	}
	step("A", "wait_event", cuStreamWaitEvent(NULL, ev, 0));
	step("A", "read", cuMemcpyDtoH(buf, p, N));
	if (data)
		step("A", "reads_b_bytes", all(buf, 0x5a) ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
	if (io(a2b[1], &go, 1, 1))
		failed = 1;
	waitpid(child, &status, 0);
	step("A", "opener_exit", WIFEXITED(status) ? (CUresult)WEXITSTATUS(status) : CUDA_ERROR_UNKNOWN);
	step("A", "free", cuMemFree(p));
	step("A", "destroy_event", cuEventDestroy(ev));
	printf("ipc_pair %s\n", failed ? "FAILED" : "ok");
	return failed;
}
