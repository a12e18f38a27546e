#!/usr/bin/env python3
"""A short training run with flashjit as a transformer's attention, against PyTorch SDPA.

A small causal language model (6 layers, d_model 384, 6 heads of 64, GQA 6:2, sequences of
512 tokens, batch 16, bf16 autocast) is trained from the same initial weights on the same
batches twice per dropout setting: once with flashjit.flash_attn_func as its attention
(through flashjit's backward), once with torch's scaled_dot_product_attention. The data
is a fixed random Markov chain over 256 tokens (each token has 4 likely successors), so
the loss falls from ln 256 = 5.55 toward the chain's entropy rate. Writes the loss per
step (CSV), a plot, and a summary line per run:

    python3 bench/train_loss.py [--steps 300] [--dropouts 0,0.1] [--out DIR]

With dropout the two runs draw different patterns (flashjit's Philox stream is not
PyTorch's), so their curves agree within noise; without it they differ only by rounding.
"""
import argparse
import csv
import math
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
import flashjit  # noqa: E402

VOCAB, SEQ, BATCH, LAYERS, D_MODEL, HEADS, KV_HEADS = 256, 512, 16, 6, 384, 6, 2
HEAD_DIM = D_MODEL // HEADS


class Block(torch.nn.Module):
    def __init__(self, attention, dropout):
        super().__init__()
        self.attention, self.dropout = attention, dropout
        self.norm1, self.norm2 = torch.nn.LayerNorm(D_MODEL), torch.nn.LayerNorm(D_MODEL)
        self.qkv = torch.nn.Linear(D_MODEL, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.proj = torch.nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D_MODEL, 4 * D_MODEL), torch.nn.GELU(),
                                       torch.nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        q = q.view(b, s, HEADS, HEAD_DIM)
        k, v = (t.view(b, s, KV_HEADS, HEAD_DIM) for t in (k, v))
        p = self.dropout if self.training else 0.0
        if self.attention == "flashjit":
            o = flashjit.flash_attn_func(q, k, v, dropout_p=p, causal=True)
        else:
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), dropout_p=p, is_causal=True,
                                               enable_gqa=True).transpose(1, 2)
        x = x + self.proj(o.reshape(b, s, D_MODEL))
        return x + self.mlp(self.norm2(x))


class Model(torch.nn.Module):
    def __init__(self, attention, dropout):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL)
        torch.nn.init.normal_(self.embed.weight, std=0.02)  # it is the output head too
        self.pos = torch.nn.Parameter(torch.randn(SEQ, D_MODEL) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(attention, dropout) for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(D_MODEL)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[:tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.t()  # tied output head


def markov_batches(steps, seed=1):
    """The same `steps` batches for every run: a random chain over VOCAB tokens in which
    each token is followed by one of 4 successors (probabilities 0.55, 0.25, 0.15, 0.05)."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.stack([torch.randperm(VOCAB, generator=g)[:4] for _ in range(VOCAB)])
    weights = torch.tensor([0.55, 0.25, 0.15, 0.05])
    entropy = -(weights * weights.log()).sum().item()
    batches = []
    for _ in range(steps):
        tokens = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(VOCAB, (BATCH,), generator=g)
        picks = torch.multinomial(weights, BATCH * SEQ, replacement=True,
                                  generator=g).view(BATCH, SEQ)
        for t in range(SEQ):
            tokens[:, t + 1] = successors[tokens[:, t], picks[:, t]]
        batches.append(tokens)
    return batches, entropy


def train(attention, dropout, init, batches):
    torch.manual_seed(1234)  # the dropout draws of every run start from one generator state
    model = Model(attention, dropout).cuda()
    model.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30))
    losses, start = [], time.perf_counter()
    for tokens in batches:
        tokens = tokens.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses, (time.perf_counter() - start) / len(batches)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dropouts", default="0,0.1")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches, entropy = markov_batches(args.steps)
    torch.manual_seed(0)
    init = Model("sdpa", 0.0).state_dict()
    columns = {}
    for dropout in (float(x) for x in args.dropouts.split(",")):
        for attention in ("flashjit", "sdpa"):
            losses, step_s = train(attention, dropout, init, batches)
            columns[f"{attention} dropout={dropout}"] = losses
            tail = sum(losses[-50:]) / 50
            print(f"{attention:8s} dropout={dropout}: loss {losses[0]:.3f} -> {losses[-1]:.3f} "
                  f"(mean of the last 50 steps {tail:.4f}); {step_s * 1e3:.1f} ms per step",
                  flush=True)
        a, b = columns[f"flashjit dropout={dropout}"], columns[f"sdpa dropout={dropout}"]
        print(f"dropout={dropout}: largest |flashjit - sdpa| over the steps "
              f"{max(abs(x - y) for x, y in zip(a, b)):.4f}, over the last 50 "
              f"{max(abs(x - y) for x, y in zip(a[-50:], b[-50:])):.4f}", flush=True)
    print(f"entropy rate of the data: {entropy:.4f} nats (ln {VOCAB} = {math.log(VOCAB):.3f})")
    with open(out / "train_loss.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *columns])
        for step in range(args.steps):
            w.writerow([step + 1, *(f"{columns[c][step]:.5f}" for c in columns)])
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, losses in columns.items():
        ax.plot(range(1, args.steps + 1), losses, label=name, linewidth=1,
                linestyle="-" if name.startswith("flashjit") else "--")
    ax.axhline(entropy, color="gray", linewidth=0.8, linestyle=":", label="entropy rate")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats)")
    ax.set_title(f"{torch.cuda.get_device_name()}: a {LAYERS}-layer causal LM, flashjit vs "
                 "PyTorch SDPA attention")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "train_loss.png", dpi=120)


if __name__ == "__main__":
    main()
