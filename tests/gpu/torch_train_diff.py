"""A few training steps of a small CNN (convolutions, batch norm, pooling) and a small
transformer, with inputs staged through pinned host buffers (`pin_memory=True`, copied
with `non_blocking=True`). Prints one JSON line of per-step losses; the GPU suite runs it
natively and through vmgpu and compares the losses to float tolerance.

    python3 tests/gpu/torch_train_diff.py [--bf16]
"""

import argparse
import json

import torch


def cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.BatchNorm2d(64),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    )


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=512, d=128, heads=4, layers=2, seq=64):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(1, seq, d) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, idx):
        return self.head(self.blocks(self.tok(idx) + self.pos, mask=self.mask, is_causal=True))


def train(model, batches, loss_fn, bf16, steps=6):
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for i in range(steps):
        x_host, y_host = batches[i % len(batches)]
        x, y = x_host.cuda(non_blocking=True), y_host.cuda(non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator().manual_seed(0)
    images = [
        (torch.randn(16, 3, 32, 32, generator=g).pin_memory(), torch.randint(0, 10, (16,), generator=g).pin_memory())
        for _ in range(3)
    ]
    tokens = [torch.randint(0, 512, (8, 64), generator=g).pin_memory() for _ in range(3)]
    assert all(t.is_pinned() for t in tokens)
    torch.manual_seed(0)
    out = {"cnn": train(cnn(), images, torch.nn.functional.cross_entropy, a.bf16)}
    torch.manual_seed(0)
    out["transformer"] = train(
        TinyGPT(),
        [(t, t) for t in tokens],
        lambda logits, y: torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten()),
        a.bf16,
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
