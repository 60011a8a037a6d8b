"""How much of a foreach AdamW step over many small parameters is PyTorch's own Python:
the step with every `torch._foreach_*` replaced by a function that returns at once (the
optimizer's Python, its CPU step counters and `.item()`s remain), against the real step
in strict and in defer_and_fuse. Each measurement runs in a fresh process; the three
alternate for --rounds rounds. Prints ms per step (median of 7 x 20 steps).

    python bench/optimizer_floor.py [--rounds 3] [--n 200]
"""
import argparse
import os
import subprocess
import sys
import time


def measure(mode, n):
    import torch
    import torchtpu
    torchtpu.set_eager_mode("strict" if mode == "floor" else mode)
    torch.manual_seed(0)
    params = [torch.randn(64, 64).to("tpu").requires_grad_() for _ in range(n)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3)  # foreach, the default on tpu
    for _ in range(3):
        opt.step()
    torch.tpu.synchronize()
    if mode == "floor":
        for name in [k for k in dir(torch) if k.startswith("_foreach_")]:
            # in-place forms return None, functional ones their first list (Adam reads it)
            setattr(torch, name, (lambda *a, **k: None) if name.endswith("_") else (lambda *a, **k: a[0]))
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(20):
            opt.step()
        params[0].sum().item()
        times.append((time.perf_counter() - t0) / 20)
    return sorted(times)[3]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--one", choices=["floor", "strict", "defer_and_fuse"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(f"{measure(a.one, a.n) * 1e3:.3f}")
        return
    print(f"AdamW foreach over {a.n} parameters of 64x64, ms per step\n")
    print("| round | PyTorch's Python (foreach ops return at once) | strict | defer_and_fuse |")
    print("|---|---:|---:|---:|")
    for r in range(a.rounds):
        row = []
        for mode in ("floor", "strict", "defer_and_fuse"):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", mode, "--n", str(a.n)],
                                 stdout=subprocess.PIPE, text=True, check=True).stdout.split()
            row.append(out[-1])
        print(f"| {r + 1} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
