// A guest that saturates the GPU for the isolation benchmark (an unchanged CUDA program).
//   isolation MODE SECONDS [WINDOW_MS [START_NS]]
// MODE: gemm (a 1024^3 tiled matmul per launch), tiny (empty kernels, a sync per 1000),
// graph (a CUDA graph of 20 short kernels per replay), sync (a short kernel, then
// cudaStreamSynchronize, every time).  Prints "iters N" and the completed iterations per
// window of WINDOW_MS (default 100): "windows a b c ...", with the start as "t0 <CLOCK_MONOTONIC ns>".
// With START_NS (CLOCK_MONOTONIC) the timed part begins then, after the warm-up: guests
// started together measure the same stretch of time.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static long long now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000ll + t.tv_nsec;
}

#define T 32
__global__ void gemm(const float *a, const float *b, float *c, int n) {
    __shared__ float sa[T][T], sb[T][T];
    int r = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
    float acc = 0;
    for (int k0 = 0; k0 < n; k0 += T) {
        sa[threadIdx.y][threadIdx.x] = a[r * n + k0 + threadIdx.x];
        sb[threadIdx.y][threadIdx.x] = b[(k0 + threadIdx.y) * n + col];
        __syncthreads();
        for (int k = 0; k < T; k++) acc += sa[threadIdx.y][k] * sb[k][threadIdx.x];
        __syncthreads();
    }
    c[r * n + col] = acc;
}

__global__ void tiny(int *p) {
    if (threadIdx.x == 0 && p) p[0] += 1;
}

__global__ void spin(float *p, int iters) {  // a few tens of microseconds of work
    float x = threadIdx.x;
    for (int i = 0; i < iters; i++) x = x * 0.999f + 1.0f;
    p[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: isolation gemm|tiny|graph|sync SECONDS [WINDOW_MS]\n");
        return 2;
    }
    const char *mode = argv[1];
    double secs = atof(argv[2]);
    long long win = (argc > 3 ? atoll(argv[3]) : 100) * 1000000ll;
    const int n = 1024;
    float *a, *b, *c, *s;
    int *cnt;
    CK(cudaMalloc(&a, n * n * 4)); CK(cudaMalloc(&b, n * n * 4)); CK(cudaMalloc(&c, n * n * 4));
    CK(cudaMalloc(&s, 132 * 256 * 4)); CK(cudaMalloc(&cnt, 4));
    CK(cudaMemset(a, 0, n * n * 4)); CK(cudaMemset(b, 0, n * n * 4));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraphExec_t ge = nullptr;
    if (!strcmp(mode, "graph")) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < 20; i++) spin<<<132, 256, 0, st>>>(s, 2000);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
    }
    // one iteration: what each mode counts as a unit of work
    auto iterate = [&]() {
        if (!strcmp(mode, "gemm")) {
            for (int i = 0; i < 4; i++) gemm<<<dim3(n / T, n / T), dim3(T, T), 0, st>>>(a, b, c, n);
        } else if (!strcmp(mode, "tiny")) {
            for (int i = 0; i < 1000; i++) tiny<<<1, 32, 0, st>>>(cnt);
        } else if (!strcmp(mode, "graph")) {
            CK(cudaGraphLaunch(ge, st));
        } else if (!strcmp(mode, "sync")) {
            spin<<<132, 256, 0, st>>>(s, 2000);
        } else {
            fprintf(stderr, "unknown mode %s\n", mode);
            exit(2);
        }
        CK(cudaStreamSynchronize(st));
    };
    iterate();  // warm-up: modules loaded, graph uploaded
    long long start = argc > 4 ? atoll(argv[4]) : 0;
    while (now_ns() < start) {
        timespec d = {0, 200000};
        nanosleep(&d, nullptr);
    }
    long long t0 = now_ns(), end = t0 + (long long)(secs * 1e9);
    std::vector<long long> windows((size_t)((end - t0) / win) + 1, 0);
    long long iters = 0;
    while (now_ns() < end) {
        iterate();
        iters++;
        size_t w = (size_t)((now_ns() - t0) / win);
        if (w < windows.size()) windows[w]++;
    }
    printf("t0 %lld\niters %lld\nwindows", t0, iters);
    for (long long w : windows) printf(" %lld", w);
    printf("\n");
    return 0;
}
