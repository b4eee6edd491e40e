"""Triton kernels written by hand (not through torch.compile): a fused add-and-scale and a row
softmax, compiled by Triton and launched on PyTorch tensors with fixed data; prints checksums and
the largest difference from PyTorch (run natively and through vmgpu by
tests/gpu/test_remoting_gpu.py, the outputs must be equal)."""

import torch
import triton
import triton.language as tl


@triton.jit
def add_scale(x_ptr, y_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, (x + y) * scale, mask=mask)


@triton.jit
def row_softmax(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * cols + offs, e / tl.sum(e, axis=0), mask=mask)


def main() -> None:
    torch.manual_seed(0)
    n = 1_000_003
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    add_scale[(triton.cdiv(n, 1024),)](x, y, out, n, 0.5, BLOCK=1024)
    print(f"add_scale sum={out.double().sum().item():.6e} max_err={(out - (x + y) * 0.5).abs().max().item():.3g}")
    m = torch.randn(512, 700, device="cuda")
    sm = torch.empty_like(m)
    row_softmax[(m.shape[0],)](m, sm, m.shape[1], BLOCK=1024)
    ref = torch.softmax(m, dim=1)
    print(f"softmax sum={sm.double().sum().item():.6e} max_err={(sm - ref).abs().max().item():.3g}")


if __name__ == "__main__":
    main()
