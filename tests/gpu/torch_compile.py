"""torch.compile (Inductor, Triton kernels) on a small function: prints its largest difference from
eager PyTorch, and the same for mode="reduce-overhead" (CUDA graphs).  Run natively and through
vmgpu by tests/gpu/test_remoting_gpu.py (the outputs must be equal)."""

import torch


def f(x, y):
    return torch.nn.functional.gelu(x @ y) + x.sum(1, keepdim=True) * 0.5


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 256, device="cuda")
    y = torch.randn(256, 256, device="cuda")
    ref = f(x, y)
    for mode in ("default", "reduce-overhead"):
        g = torch.compile(f, mode=mode)
        for _ in range(3):
            out = g(x, y)
        torch.cuda.synchronize()
        print(f"{mode} max_err={(out - ref).abs().max().item():.3g}")


if __name__ == "__main__":
    main()
