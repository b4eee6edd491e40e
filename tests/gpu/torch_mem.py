"""A training job whose memory is known: one 19456x19456 fp32 linear layer (1.41 GiB) under
Adam.  At its peak (Adam's first step) weights, gradients, two moments and one temporary are
alive: 5 x 1.41 GiB = 7.05 GiB, about 7.6 GB (measured on the H100: 21760 wide it asked for
5 x 1.77 GiB).  Prints "trained PEAK_BYTES", or "oom" on a CUDA out-of-memory error."""

import torch

n = 19456
try:
    model = torch.nn.Linear(n, n, bias=False).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(64, n, device="cuda")
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    torch.cuda.synchronize()
    print("trained", torch.cuda.max_memory_allocated())
except torch.OutOfMemoryError as e:
    print("oom", str(e).splitlines()[0][:200])
