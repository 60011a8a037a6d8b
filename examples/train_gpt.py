"""A GPT-style character-level transformer (embedding, layer norm, causal
scaled_dot_product_attention, GELU MLP, cross-entropy, AdamW) trained on text that ships
with Python itself (stdlib docstrings), so it runs offline. The README's main job:

    python examples/train_gpt.py            # trains on the tpu device, prints loss, tokens/s
"""
import argparse
import inspect
import json
import collections
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import pick_device, train


def corpus() -> str:
    text = "\n".join(inspect.getdoc(m) or "" for m in (json, collections, functools, inspect, argparse))
    return "".join(ch for ch in text if ord(ch) < 128)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=128, d=64, heads=4, layers=2, ctx=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def make_model(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(**kw)


def make_batches(batch=8, ctx=64):
    data = torch.tensor([ord(c) for c in corpus()], dtype=torch.long)

    def batches(step):
        g = torch.Generator().manual_seed(3000 + step)
        ix = torch.randint(0, len(data) - ctx - 1, (batch,), generator=g)
        x = torch.stack([data[i:i + ctx] for i in ix.tolist()])
        y = torch.stack([data[i + 1:i + ctx + 1] for i in ix.tolist()])
        return x, y
    return batches


def loss_fn(logits, y):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def run(device, steps=20, foreach=None, log_every=0, batch=8, ctx=64, **kw):
    return train(make_model(ctx=ctx, **kw), make_batches(batch, ctx), loss_fn,
                 lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1, foreach=foreach),
                 device, steps, log_every=log_every, items_per_step=batch * ctx)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="default: torch.accelerator.current_accelerator()")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d", type=int, default=64)
    a = ap.parse_args()
    dev = pick_device(a.device)
    print(f"training GPT (layers={a.layers}, d={a.d}) on {dev} for {a.steps} steps")
    losses = run(dev, a.steps, log_every=20, layers=a.layers, d=a.d)
    print(f"final loss {losses[-1]:.4f} (first {losses[0]:.4f})")
