"""Eager modes side by side: strict vs defer_and_fuse on tpu, with PyTorch's CPU eager as
the outside reference, in one run. Reports steady-state time per iteration (median),
speedup of defer_and_fuse over strict, and peak device memory per mode.

    python bench/modes.py [--quick] [--write docs/benchmarks.md]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import torchtpu  # noqa: E402
import train_gpt  # noqa: E402
from _timing import threads_for  # noqa: E402


def gpt_train(device, quick):
    torch.manual_seed(0)
    d, layers, batch, ctx = (64, 2, 4, 32) if quick else (128, 4, 8, 64)
    model = train_gpt.make_model(d=d, layers=layers, ctx=ctx).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 128, (batch, ctx)).to(device)
    y = torch.randint(0, 128, (batch, ctx)).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = train_gpt.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def gelu_ln_mlp(device, quick):
    torch.manual_seed(0)
    d = 256 if quick else 512
    net = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))]).to(device)
    x = torch.randn(64, d).to(device)

    def step():
        with torch.no_grad():
            h = x
            for i in range(0, len(net), 3):  # elementwise-heavy: extra pointwise work per layer
                h = net[i + 2](F.gelu(net[i](h)) * torch.sigmoid(h) + 0.5 * h)
            return h.sum()
    return step


def attention_inference(device, quick):
    torch.manual_seed(0)
    b, h, t, e = (2, 4, 64, 32) if quick else (4, 8, 128, 64)
    q, k, v = (torch.randn(b, h, t, e).to(device) for _ in range(3))

    def step():
        with torch.no_grad():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return (o * 0.5 + 1).square().mean()
    return step


def optimizer_many_params(device, quick, fused=None, shape=(64, 64), n=None):
    torch.manual_seed(0)
    n = n or (50 if quick else 200)
    params = [torch.randn(*shape).to(device).requires_grad_() for _ in range(n)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, fused=fused)  # default: foreach on tpu, loop on CPU

    def step():
        opt.step()
        return params[0]
    return step


WORKLOADS = {"GPT training step (fwd+bwd+AdamW)": gpt_train,
             "GELU/LayerNorm MLP (inference)": gelu_ln_mlp,
             "attention inference": attention_inference,
             "AdamW step over many params": optimizer_many_params,
             "AdamW fused=True over many params": lambda d, q: optimizer_many_params(d, q, fused=True),
             # A model's worth of parameters (16.8M, about GPT-2 small's blocks at d=1024 / 4):
             # the state no longer fits in cache, so each pass over it is a pass over memory.
             "AdamW step, 16.8M params (16 x 1024x1024)":
                 lambda d, q: optimizer_many_params(d, q, shape=(256, 256) if q else (1024, 1024), n=16)}


def measure(make, device, mode, iters, quick):
    threads_for(device)
    ctx = torchtpu.set_eager_mode(mode) if device.type == "tpu" else None
    try:
        step = make(device, quick)
        for _ in range(3):  # warm-up: first plans, caches, pool
            r = step()
            _sync(r, device)
        if device.type == "tpu":
            torch.tpu.synchronize()
            torch.tpu.reset_peak_memory_stats()
            base = torch.tpu.memory_allocated()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            r = step()
            _sync(r, device)
            times.append(time.perf_counter() - t0)
        peak = torch.tpu.max_memory_allocated() - base if device.type == "tpu" else None
        return statistics.median(times), peak
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)


def fusable_share(make, quick):
    """Share of one step's kernel time (debug mode: launch-blocking, per-op timing) spent
    in ops defer_and_fuse can fuse. Fusion can at best remove that time, so
    1 / (1 - share) bounds its speedup over strict from fusion alone."""
    with torchtpu.set_eager_mode("debug"):
        step = make(torch.device("tpu"), quick)
        for _ in range(2):
            _sync(step(), torch.device("tpu"))
        torchtpu.trace(clear=True)
        for _ in range(5):  # one step's share varied from 13% to 40% between runs
            _sync(step(), torch.device("tpu"))
        tr = torchtpu.trace(clear=True)
    total = sum(e["us"] for e in tr)
    return sum(e["us"] for e in tr if e["fusable"]) / total if total else 0.0


def _sync(r, device):
    if device.type == "tpu":
        r.sum().item() if r.dim() else r.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes, few iterations")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--write", default=None, help="replace the 'Eager modes' section of this Markdown file")
    ap.add_argument("--only", default=None, help="run the workloads whose name contains this (A/B runs)")
    a = ap.parse_args()
    if a.only and a.write:
        ap.error("--write records every workload: drop --only")
    iters = a.iters or (5 if a.quick else 15)
    rows = []
    for name, make in WORKLOADS.items():
        if a.only and a.only not in name:
            continue
        s, ps = measure(make, torch.device("tpu"), "strict", iters, a.quick)
        d, pd = measure(make, torch.device("tpu"), "defer_and_fuse", iters, a.quick)
        c, _ = measure(make, torch.device("cpu"), None, iters, a.quick)
        share = fusable_share(make, a.quick)
        rows.append((name, s, d, c, ps, pd, share))
        print(f"{name}: strict {s*1e3:.2f} ms, defer_and_fuse {d*1e3:.2f} ms ({s/d:.2f}x), "
              f"CPU eager {c*1e3:.2f} ms; peak MiB strict {ps/2**20:.2f} defer {pd/2**20:.2f}; "
              f"fusable share of kernel time {share:.0%}", flush=True)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    cmd = ("python bench/modes.py" + (" --quick" if a.quick else "") + (f" --iters {a.iters}" if a.iters else "") +
           (f" --write {os.path.relpath(a.write, root)}" if a.write else ""))
    lines = ["## Eager modes", "", f"Command: `{cmd}` (steady-state median of {iters} iterations after 3 "
             "warm-up iterations; one process, same machine, so read the ratios).", "",
             "| workload | strict ms | defer_and_fuse ms | defer vs strict | CPU eager ms | defer vs CPU | "
             "peak MiB strict | peak MiB defer | fusable share | fusion bound |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s, d, c, ps, pd, share in rows:
        lines.append(f"| {name} | {s*1e3:.2f} | {d*1e3:.2f} | {s/d:.2f}x | {c*1e3:.2f} | {c/d:.2f}x | "
                     f"{ps/2**20:.2f} | {pd/2**20:.2f} | {share:.0%} | "
                     f"{f'{1 / (1 - share):.2f}x' if share < 0.99 else 'unbounded'} |")
    lines += ["", "*fusable share*: of one step's kernel time in debug mode (launch-blocking, timed per "
              "op), the part spent in ops that defer_and_fuse can run inside fused groups "
              "(`torchtpu.trace()`'s `fusable`). Removing that time entirely would give *fusion bound* "
              "= 1 / (1 - share) over strict; GEMMs, attention and the other single kernels run the "
              "same code in both modes. The bound counts kernel time only: defer_and_fuse can exceed "
              "it where strict also pays per-op costs outside the kernels (hand-off to the queue "
              "thread, output allocation)."]
    if a.write:  # the same rows as a plot, next to the report (docs/plots/modes.png)
        from torchtpu import _bench_plots
        plots = os.path.join(os.path.dirname(os.path.abspath(a.write)), "plots")
        os.makedirs(plots, exist_ok=True)
        _bench_plots.save(_bench_plots.modes_figure([
            {"name": name, "strict_s": s, "defer_s": d, "cpu_s": c, "peak_strict": ps, "peak_defer": pd}
            for name, s, d, c, ps, pd, _ in rows]), os.path.join(plots, "modes.png"))
        lines += ["", "![Eager modes: speed over strict and peak device memory](plots/modes.png)"]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.write:
        _replace_section(a.write, "## Eager modes", text)


def _replace_section(path, heading, text):
    """Replaces the text from heading to the next heading of any level (a section's
    subsections stay), or appends the section."""
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if heading not in old:
        open(path, "w").write(old.rstrip() + "\n\n" + text)
        return
    start = old.index(heading)
    nxt = old.find("\n#", start + len(heading))
    open(path, "w").write(old[:start] + text + ("\n" + old[nxt + 1:] if nxt >= 0 else ""))


if __name__ == "__main__":
    main()
