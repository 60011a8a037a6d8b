"""Fused attention (F.scaled_dot_product_attention), tpu strict in two variants vs PyTorch's
CPU eager. --compare kernel (default): the AVX-512 head kernel (host/attn_avx512f32.c) vs
the generic path (TORCHTPU_ATTN_KERNEL=0); --compare scratch: large kernel scratch blocks
kept for reuse (base/alloc.c) vs given back to the C library on free
(TORCHTPU_SCRATCH_CACHE=0). Both settings are read once per process, so each variant runs
in its own worker process; the workers alternate for --rounds rounds and each case reports
its best time over all of them. Prints microseconds per call: forward (no grad) and
forward plus backward (autograd.grad of q, k, v).

    python bench/attention.py [--compare kernel|scratch] [--dtype float32|bfloat16] [--rounds 2] [--calls 20]
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

import torchtpu
from _timing import best_per_call

# (batch, heads, positions, head dim, causal, padding mask, what)
CASES = [(8, 4, 64, 32, True, False, "bench/modes.py GPT step"),
         (4, 8, 128, 64, True, False, "bench/modes.py attention inference"),
         (8, 12, 128, 64, False, False, "BERT-base-like"),
         (8, 12, 128, 64, False, True, "BERT-base-like, padding mask"),
         (1, 2, 1024, 64, False, False, "two long heads")]


# --compare: the two variants, the variable that selects them, its value for each
COMPARE = {"kernel": ("TORCHTPU_ATTN_KERNEL", {"kernel": "1", "generic": "0"}),
           "scratch": ("TORCHTPU_SCRATCH_CACHE", {"kept": "1", "freed": "0"})}


def worker(calls, with_cpu, dtype):
    torchtpu.set_eager_mode("strict")
    for B, H, T, E, causal, padded, _ in CASES:
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, T, E, dtype=dtype) for _ in range(3))
        g = torch.randn(B, H, T, E, dtype=dtype)
        mask = torch.arange(T).expand(B, 1, 1, T) < torch.randint(T // 2, T + 1, (B, 1, 1, 1)) if padded else None
        out = {}
        for dev in ("tpu", "cpu") if with_cpu else ("tpu",):
            Q, K, V = (t.to(dev).requires_grad_() for t in (q, k, v))
            G, M = g.to(dev), None if mask is None else mask.to(dev)

            def fwd():
                with torch.no_grad():
                    return F.scaled_dot_product_attention(Q, K, V, M, is_causal=causal)

            def fwd_bwd():
                o = F.scaled_dot_product_attention(Q, K, V, M, is_causal=causal)
                return torch.autograd.grad(o, (Q, K, V), G)
            out[dev] = (best_per_call(fwd, dev, calls=calls) * 1e6,
                        best_per_call(fwd_bwd, dev, calls=max(1, calls // 2)) * 1e6)
        print("BENCH_JSON " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--compare", choices=list(COMPARE), default="kernel")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # the variant a worker process runs
    a = ap.parse_args()
    var, values = COMPARE[a.compare]
    first, second = values
    if a.worker:
        worker(a.calls, with_cpu=a.worker == first, dtype=getattr(torch, a.dtype))
        return
    best = {}  # (case, variant) -> [fwd, fwd+bwd]
    for _ in range(a.rounds):
        for variant in (first, second):
            env = dict(os.environ, **{var: values[variant]})
            res = subprocess.run([sys.executable, __file__, "--worker", variant, "--calls", str(a.calls),
                                  "--compare", a.compare, "--dtype", a.dtype], env=env,
                                 check=True, capture_output=True, text=True).stdout
            rows = [json.loads(l[len("BENCH_JSON "):]) for l in res.splitlines() if l.startswith("BENCH_JSON ")]
            for c, row in enumerate(rows):
                for dev, t in row.items():
                    key = (c, variant if dev == "tpu" else "cpu")
                    best[key] = [min(x, y) for x, y in zip(best.get(key, t), t)]
    print(f"{a.dtype}, {var}: {first} = {values[first]}, {second} = {values[second]}")
    print(f"| case | pass | tpu {first} us | tpu {second} us | CPU eager us | {first} vs {second} | {first} vs CPU |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for c, (B, H, T, E, causal, _, what) in enumerate(CASES):
        for p, part in enumerate(("forward", "forward+backward")):
            kn, gn, cp = best[(c, first)][p], best[(c, second)][p], best[(c, "cpu")][p]
            print(f"| {B}x{H}x{T}x{E}{' causal' if causal else ''} ({what}) | {part} | {kn:.0f} | {gn:.0f} | "
                  f"{cp:.0f} | {gn / kn:.2f}x | {cp / kn:.2f}x |")


if __name__ == "__main__":
    main()
