"""ResNet-50 training throughput (synthetic data), for native vs vmgpu comparisons.

    python3 bench/torch_train.py [--steps 30] [--batch 64] [--bf16] [--no-autotune]
Prints `img_per_s=X`.
"""

import argparse
import time

import torch
import torchvision


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--no-autotune", action="store_true", help="no cuDNN autotuning (launch-bound small batches)")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = not a.no_autotune
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (a.batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"img_per_s={a.steps * a.batch / dt:.1f} loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
