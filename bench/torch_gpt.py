"""GPT-style transformer: training tokens/s, and inference replayed as a CUDA graph.

    python3 bench/torch_gpt.py [--layers 6] [--d 768] [--seq 512] [--batch 8]
Prints `train_tokens_per_s=X graph_infer_tokens_per_s=X`.
"""

import argparse
import time

import torch


class GPT(torch.nn.Module):
    def __init__(self, layers, d, heads, vocab, seq):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(1, seq, d))
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        return self.head(self.blocks(x, mask=self.mask, is_causal=True))


def timed(fn, steps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    torch.manual_seed(0)
    vocab = 8192
    model = GPT(a.layers, a.d, 12, vocab, a.seq).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, vocab, (a.batch, a.seq), device="cuda")

    def train_step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        loss.backward()
        opt.step()

    for _ in range(5):
        train_step()
    train = a.steps * a.batch * a.seq / timed(train_step, a.steps)

    model.eval()
    static = idx.clone()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model(static)
    infer = a.steps * a.batch * a.seq / timed(g.replay, a.steps)
    print(f"train_tokens_per_s={train:.0f} graph_infer_tokens_per_s={infer:.0f}")


if __name__ == "__main__":
    main()
