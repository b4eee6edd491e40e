"""A small Hugging Face transformer (GPT-2 architecture, random weights from a fixed seed, no
download): greedy generation of 24 tokens from a fixed prompt, then two AdamW training steps on a
fixed batch; prints the generated token ids and the losses rounded (run natively and through
vmgpu by tests/gpu/test_remoting_gpu.py, the outputs must be equal)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    config = GPT2Config(vocab_size=512, n_positions=128, n_embd=128, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(config).cuda().eval()
    prompt = torch.tensor([[1, 17, 42, 99, 7, 250]], device="cuda")
    with torch.no_grad():
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False, pad_token_id=0
        )
    print("generated", out[0, prompt.shape[1] :].tolist())

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(1)).cuda()
    for step in range(2):
        loss = model(batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step} loss {loss.item():.5f}")


if __name__ == "__main__":
    main()
