"""cuda-python (cuda.bindings): a kernel compiled at run time with NVRTC to PTX, loaded with
cuModuleLoadData and launched with cuLaunchKernel through the driver bindings, its result copied
back and checked on the host; prints the check and a checksum (run natively and through vmgpu by
tests/gpu/test_remoting_gpu.py, the outputs must be equal)."""

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

SOURCE = b"""
extern "C" __global__ void saxpy(float a, const float *x, const float *y, float *out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""


def ok(result):
    err, *rest = result
    if isinstance(err, nvrtc.nvrtcResult):
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    else:
        assert err == cu.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest


def main() -> None:
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    major = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))

    prog = ok(nvrtc.nvrtcCreateProgram(SOURCE, b"saxpy.cu", 0, [], []))
    ok(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=compute_{major}{minor}".encode()]))
    size = ok(nvrtc.nvrtcGetPTXSize(prog))
    ptx = b" " * size
    ok(nvrtc.nvrtcGetPTX(prog, ptx))
    module = ok(cu.cuModuleLoadData(ptx))
    kernel = ok(cu.cuModuleGetFunction(module, b"saxpy"))

    n = 1 << 20
    x = np.arange(n, dtype=np.float32) / n
    y = np.ones(n, dtype=np.float32)
    out = np.zeros(n, dtype=np.float32)
    stream = ok(cu.cuStreamCreate(0))
    dx, dy, dout = (ok(cu.cuMemAlloc(a.nbytes)) for a in (x, y, out))
    ok(cu.cuMemcpyHtoDAsync(dx, x.ctypes.data, x.nbytes, stream))
    ok(cu.cuMemcpyHtoDAsync(dy, y.ctypes.data, y.nbytes, stream))
    args = [np.array([2.5], dtype=np.float32)] + [np.array([int(p)], dtype=np.uint64) for p in (dx, dy, dout)]
    args.append(np.array([n], dtype=np.uint32))
    params = np.array([a.ctypes.data for a in args], dtype=np.uint64)
    ok(cu.cuLaunchKernel(kernel, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, params.ctypes.data, 0))
    ok(cu.cuMemcpyDtoHAsync(out.ctypes.data, dout, out.nbytes, stream))
    ok(cu.cuStreamSynchronize(stream))
    print(
        f"saxpy correct={bool(np.array_equal(out, np.float32(2.5) * x + y))} sum={float(out.sum(dtype=np.float64)):.6e}"
    )
    for p in (dx, dy, dout):
        ok(cu.cuMemFree(p))
    ok(cu.cuStreamDestroy(stream))
    ok(cu.cuModuleUnload(module))
    ok(cu.cuDevicePrimaryCtxRelease(dev))


if __name__ == "__main__":
    main()
