"""PyTorch CUDA graphs: torch.cuda.CUDAGraph capture and replay, and
torch.cuda.graphs.make_graphed_callables for a training step.  Deterministic; prints
results; run natively and through vmgpu."""

import torch

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)).to(dev)
static_in = torch.randn(64, 128, device=dev)

# warm up on a side stream, as the PyTorch documentation does before capture
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        model(static_in)
torch.cuda.current_stream().wait_stream(s)

g = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(g):
    static_out = model(static_in)
for i in range(3):
    static_in.copy_(torch.full((64, 128), float(i) / 10, device=dev))
    g.replay()
    print("replay", i, f"{static_out.sum().item():.6e}")

mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4)).to(dev)
opt = torch.optim.SGD(mlp.parameters(), lr=0.05)
x = torch.randn(16, 32, device=dev, requires_grad=False)
y = torch.randn(16, 4, device=dev)
graphed = torch.cuda.make_graphed_callables(mlp, (x,))
for step in range(4):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(graphed(x), y)
    loss.backward()
    opt.step()
    print("graphed step", step, f"{loss.item():.6e}")
