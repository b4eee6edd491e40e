"""A kernel that reads and writes pinned host memory through cuMemHostGetDevicePointer (zero
copy), through the driver API with ctypes; prints what a program sees.  Run natively and through
vmgpu: the output must be the same (tests/gpu/test_guest_addresses_gpu.py)."""

import ctypes
import struct
import sys

PTX = sys.argv[1]
N = 4096
cu = ctypes.CDLL("libcuda.so.1")


def ok(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: {r}")


ok(cu.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
pins, dptrs = [], []
for _ in range(3):
    p = ctypes.c_void_p()
    ok(cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(N * 4), ctypes.c_uint(0x2)), "cuMemHostAlloc")
    d = ctypes.c_uint64()
    ok(cu.cuMemHostGetDevicePointer_v2(ctypes.byref(d), p, ctypes.c_uint(0)), "cuMemHostGetDevicePointer")
    pins.append(p)
    dptrs.append(d)
# with unified addressing the device address of pinned memory is the program's own pointer
print("device pointer is the host pointer:", all(d.value == p.value for d, p in zip(dptrs, pins, strict=True)))
a = (ctypes.c_float * N).from_address(pins[0].value)
b = (ctypes.c_float * N).from_address(pins[1].value)
c = (ctypes.c_float * N).from_address(pins[2].value)
for i in range(N):
    a[i], b[i], c[i] = float(i), float(2 * i), -1.0
mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
ok(cu.cuModuleLoadData(ctypes.byref(mod), open(PTX, "rb").read() + b"\0"), "cuModuleLoadData")
ok(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"vadd"), "cuModuleGetFunction")
n = ctypes.c_int(N)
args = (ctypes.c_void_p * 4)(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in (*dptrs, n)])
ok(cu.cuLaunchKernel(fn, (N + 255) // 256, 1, 1, 256, 1, 1, 0, None, args, None), "cuLaunchKernel")
ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
print("kernel on pinned memory:", all(c[i] == 3.0 * i for i in range(N)))
# a copy from the device address of pinned memory, as a program may do
d = ctypes.c_uint64()
ok(cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(N * 4)), "cuMemAlloc")
ok(cu.cuMemcpy(d, dptrs[2], ctypes.c_size_t(N * 4)), "cuMemcpy")
back = (ctypes.c_float * N)()
ok(cu.cuMemcpyDtoH_v2(back, d, ctypes.c_size_t(N * 4)), "cuMemcpyDtoH")
print("copy from its device address:", struct.pack(f"{N}f", *back) == struct.pack(f"{N}f", *c))
