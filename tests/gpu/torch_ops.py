"""PyTorch eager on the GPU, deterministic: add, matmul, conv2d, a small MLP's backward.
Prints one line per result (sums and a few values); run natively and through vmgpu."""

import torch

torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"

a = torch.randn(512, 512, device=dev)
b = torch.randn(512, 512, device=dev)
print("add", f"{(a + b).sum().item():.6e}")
print("matmul", f"{(a @ b).sum().item():.6e}", f"{(a @ b)[3, 7].item():.6e}")
conv = torch.nn.Conv2d(3, 16, 3, padding=1).to(dev)
x = torch.randn(8, 3, 32, 32, device=dev)
y = conv(x)
print("conv2d", f"{y.sum().item():.6e}", f"{y[1, 2, 3, 4].item():.6e}")
mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(dev)
opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
inp = torch.randn(32, 64, device=dev)
target = torch.randint(0, 10, (32,), device=dev)
for step in range(5):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(mlp(inp), target)
    loss.backward()
    opt.step()
    print("mlp step", step, f"{loss.item():.6e}", f"{mlp[0].weight.grad.norm().item():.6e}")
free, total = torch.cuda.mem_get_info()
print("total_memory", torch.cuda.get_device_properties(0).total_memory, total)
