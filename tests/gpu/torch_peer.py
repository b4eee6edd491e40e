"""PyTorch tensors between two GPUs: made on cuda:0, copied to cuda:1 (contiguous: a peer or
host-staged copy; transposed: a copy kernel reading the peer's memory where peer access is on),
computed on there, copied back; several dtypes there and back.  Prints one line per result
(equalities and checksums); run natively and through vmgpu on a host with two GPUs."""

import sys

import torch

if torch.cuda.device_count() < 2:
    sys.exit(f"torch_peer.py needs two GPUs; this process sees {torch.cuda.device_count()}")

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

print("devices", torch.cuda.device_count())
print("can_access_peer", torch.cuda.can_device_access_peer(0, 1), torch.cuda.can_device_access_peer(1, 0))

a = torch.randn(1024, 1024, device="cuda:0")
b = a.to("cuda:1")
print("to_cuda1", b.device, torch.equal(a.cpu(), b.cpu()))

c = (b @ b.T).relu() + b
print("computed_on_cuda1", f"{c.double().sum().item():.6e}", f"{c[3, 7].item():.6e}")

back = c.to("cuda:0")
print("back_on_cuda0", back.device, torch.equal(back.cpu(), c.cpu()), f"{back.double().sum().item():.6e}")

t = a.t().to("cuda:1")  # not contiguous: a copy kernel, or a contiguous temporary where no peer access
print("transposed_to_cuda1", torch.equal(t.cpu(), a.t().cpu()))

stream = torch.cuda.Stream(device="cuda:1")
with torch.cuda.stream(stream):
    dst = torch.empty_like(a, device="cuda:1")
    dst.copy_(a, non_blocking=True)
stream.synchronize()
print("copy_non_blocking_on_a_stream", torch.equal(dst.cpu(), a.cpu()))

for dtype in (torch.float16, torch.bfloat16, torch.int64):
    x = (a * 100).to(dtype)
    y = x.to("cuda:1").mul(2).to("cuda:0")
    print("round_trip", dtype, torch.equal(y, x * 2), f"{y.double().sum().item():.6e}")

torch.cuda.synchronize(0)
torch.cuda.synchronize(1)
print("checksum", f"{(back.double().sum() + t.double().sum().to('cuda:0')).item():.6e}")
