/*
 * Host functions on streams (cuLaunchHostFunc, cuStreamAddCallback), natively and through vmgpu:
 *   hostfn          on two streams, 300 functions each (more than the guest library has slots),
 *                   each after a memset and a copy into pinned memory: it must see the value of
 *                   the work queued before it, and run in order; prints "hostfn ok ..." or what
 *                   went wrong, and the answers to a NULL function and to callback flags
 *   hostfn stuck    one function that sleeps 3 s: prints the answer of the stream's
 *                   synchronisation after it ("stuck R"; through vmgpu with a shorter
 *                   VMGPU_HOST_FUNC_TIMEOUT_S on the forwarder, CUDA_ERROR_LAUNCH_TIMEOUT)
 *   hostfn capture  a host function queued on a stream being captured ("capture R")
 *   hostfn fork     a function run in the parent, then a child forked after it runs one of its
 *                   own ("child Q R RAN": its queueing, its stream's synchronisation, whether it ran)
 */
#include <cuda.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N 300

struct check {
	volatile unsigned *seen; /* pinned: what the copy before the function brought back */
	unsigned want;
	int *next;               /* this stream's next expected index */
	int index, *errors;
};

static struct check checks[2][N];
static int next_of[2], errors, ran;

static void CUDA_CB hostfn(void *arg)
{
	struct check *c = arg;
	if (*c->seen != c->want || *c->next != c->index)
		(*c->errors)++;
	(*c->next)++;
	__atomic_add_fetch(&ran, 1, __ATOMIC_RELAXED);
}

static void CUDA_CB callback(CUstream s, CUresult status, void *arg)
{
	(void)s;
	if (status != CUDA_SUCCESS)
		errors++;
	hostfn(arg);
}

static void CUDA_CB sleepy(void *arg)
{
	(void)arg;
	sleep(3);
}

static void CUDA_CB mark(void *arg)
{
	*(volatile int *)arg = 1;
}

/* A child forked after the parent ran a host function runs its own (the guest library's
 * callback thread and heap words are the parent's, not the child's). */
static int forked(CUstream s)
{
	static int parent_ran, child_ran;
	if (cuLaunchHostFunc(s, mark, &parent_ran) || cuStreamSynchronize(s) || !parent_ran)
		return 1;
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		CUdevice dev;
		CUcontext ctx;
		CUstream cs;
		if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
		    cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING))
			_exit(3);
		CUresult q = cuLaunchHostFunc(cs, mark, &child_ran);
		CUresult r = cuStreamSynchronize(cs);
		printf("child %d %d %d\n", (int)q, (int)r, child_ran);
		fflush(stdout);
		_exit(0);
	}
	int st = 0;
	return pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "order";
	CUdevice dev;
	CUcontext ctx;
	CUstream s[2];
	CUdeviceptr d;
	unsigned *pinned;
	if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
	    cuStreamCreate(&s[0], CU_STREAM_NON_BLOCKING) || cuStreamCreate(&s[1], CU_STREAM_NON_BLOCKING) ||
	    cuMemAlloc(&d, 2 * N * sizeof(unsigned)) || cuMemHostAlloc((void **)&pinned, 2 * N * sizeof(unsigned), 0)) {
		fprintf(stderr, "hostfn: CUDA setup failed\n");
		return 1;
	}
	if (!strcmp(mode, "stuck")) {
		CUresult q = cuLaunchHostFunc(s[0], sleepy, NULL);
		printf("queued %d stuck %d\n", (int)q, (int)cuStreamSynchronize(s[0]));
		return 0;
	}
	if (!strcmp(mode, "fork"))
		return forked(s[0]);
	if (!strcmp(mode, "capture")) {
		if (cuStreamBeginCapture(s[0], CU_STREAM_CAPTURE_MODE_RELAXED))
			return 1;
		printf("capture %d\n", (int)cuLaunchHostFunc(s[0], sleepy, NULL));
		CUgraph g;
		cuStreamEndCapture(s[0], &g);
		return 0;
	}
	for (int i = 0; i < N; i++)
		for (int k = 0; k < 2; k++) {
			unsigned v = 1000u * (unsigned)k + (unsigned)i;
			CUdeviceptr slot = d + (CUdeviceptr)((k * N + i) * sizeof(unsigned));
			checks[k][i] = (struct check){&pinned[k * N + i], v, &next_of[k], i, &errors};
			if (cuMemsetD32Async(slot, v, 1, s[k]) ||
			    cuMemcpyDtoHAsync((void *)&pinned[k * N + i], slot, sizeof(unsigned), s[k]) ||
			    (k ? cuStreamAddCallback(s[k], callback, &checks[k][i], 0)
			       : cuLaunchHostFunc(s[k], hostfn, &checks[k][i]))) {
				printf("queue failed at %d on stream %d\n", i, k);
				return 1;
			}
		}
	CUresult r0 = cuStreamSynchronize(s[0]), r1 = cuStreamSynchronize(s[1]);
	printf("hostfn ok=%d ran=%d errors=%d sync=%d,%d\n", ran == 2 * N && !errors, ran, errors, (int)r0, (int)r1);
	printf("null_fn %d bad_flags %d\n", (int)cuLaunchHostFunc(s[0], NULL, NULL),
	       (int)cuStreamAddCallback(s[0], callback, &checks[0][0], 1));
	return 0;
}
