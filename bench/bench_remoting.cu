// Remoting micro-benchmarks: one unchanged CUDA runtime program, run natively and
// through vmgpu by bench/run_remoting.py.  Prints key=value lines (times in us,
// rates in GB/s); the runner turns them into vmgpu/native ratios.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

__global__ void empty() {}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char **argv) {
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    int launches = (int)(200000 * scale), syncs = (int)(20000 * scale), small = (int)(20000 * scale);
    CK(cudaFree(0));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    empty<<<1, 1, 0, s>>>();
    CK(cudaStreamSynchronize(s));

    double t0 = now_us();
    for (int i = 0; i < launches; i++) empty<<<1, 1, 0, s>>>();
    double t1 = now_us();
    CK(cudaStreamSynchronize(s));
    printf("launch_async_us=%.3f\n", (t1 - t0) / launches);

    t0 = now_us();
    for (int i = 0; i < syncs; i++) { empty<<<1, 1, 0, s>>>(); CK(cudaStreamSynchronize(s)); }
    printf("launch_sync_us=%.3f\n", (now_us() - t0) / syncs);

    int *d4, h4 = 7;
    CK(cudaMalloc(&d4, 4));
    t0 = now_us();
    for (int i = 0; i < small; i++) CK(cudaMemcpy(d4, &h4, 4, cudaMemcpyHostToDevice));
    printf("memcpy4_htod_us=%.3f\n", (now_us() - t0) / small);
    t0 = now_us();
    for (int i = 0; i < small; i++) CK(cudaMemcpy(&h4, d4, 4, cudaMemcpyDeviceToHost));
    printf("memcpy4_dtoh_us=%.3f\n", (now_us() - t0) / small);

    int allocs = (int)(2000 * scale);
    t0 = now_us();
    for (int i = 0; i < allocs; i++) { void *p; CK(cudaMalloc(&p, 1 << 20)); CK(cudaFree(p)); }
    printf("alloc_free_1m_us=%.3f\n", (now_us() - t0) / allocs);
    /* 64 sizes in turn (256 KiB .. 16 MiB): no freed block is ever of the next one's size */
    t0 = now_us();
    for (int i = 0; i < allocs; i++) { void *p; CK(cudaMalloc(&p, (size_t)(i % 64 + 1) << 18)); CK(cudaFree(p)); }
    printf("alloc_free_mixed_us=%.3f\n", (now_us() - t0) / allocs);

    int dev = 0, v = 0, queries = (int)(1000000 * scale);
    t0 = now_us();
    for (int i = 0; i < queries; i++) { CK(cudaGetDevice(&dev)); CK(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, dev)); }
    printf("local_query_us=%.4f\n", (now_us() - t0) / queries);

    size_t big = (size_t)(256 << 20);
    void *dbig, *pageable = malloc(big), *pinned;
    memset(pageable, 1, big);
    CK(cudaMalloc(&dbig, big));
    CK(cudaMallocHost(&pinned, big));
    memset(pinned, 1, big);
    const char *names[4] = {"htod_pageable_gbs", "dtoh_pageable_gbs", "htod_pinned_gbs", "dtoh_pinned_gbs"};
    for (int k = 0; k < 4; k++) {
        void *h = k < 2 ? pageable : pinned;
        int htod = (k % 2) == 0, reps = 5;
        CK(cudaMemcpy(htod ? dbig : h, htod ? h : dbig, big, htod ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
        t0 = now_us();
        for (int r = 0; r < reps; r++)
            CK(cudaMemcpy(htod ? dbig : h, htod ? h : dbig, big, htod ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
        printf("%s=%.2f\n", names[k], (double)big * reps / ((now_us() - t0) * 1e3));
    }
    CK(cudaFreeHost(pinned));
    CK(cudaFree(dbig));
    return 0;
}
