"""bf16 reductions and optimizer steps, tpu (host driver) vs PyTorch CPU in one process:
the sums that used to pack a float copy of the whole tensor, the foreach AdamW chain that
defer_and_fuse runs as fused groups, and `_fused_adamw_` over lists of small parameters
(a cost per list position). Each row alternates tpu and CPU and keeps each side's best
(reductions) or median (optimizer steps). Prints Markdown tables:

    python bench/bf16_ops.py
"""
import statistics
import time

import torch

import torchtpu
from _timing import bench, sync, threads_for

REDUCTIONS = [
    ("x.sum(), 16M", (16 << 20,), lambda x: x.sum()),
    ("[4, 4M].sum(-1)", (4, 4 << 20), lambda x: x.sum(-1)),
    ("vector_norm, 16M", (16 << 20,), lambda x: torch.linalg.vector_norm(x)),
    ("x.var(), 16M", (16 << 20,), lambda x: x.var()),
    ("[2048, 4096].sum(-1)", (2048, 4096), lambda x: x.sum(-1)),
    ("[2048, 4096].mean(-1)", (2048, 4096), lambda x: x.mean(-1)),
    ("[2048, 4096].var(-1)", (2048, 4096), lambda x: x.var(-1)),
    ("vector_norm(dim=-1), [2048, 4096]", (2048, 4096), lambda x: torch.linalg.vector_norm(x, dim=-1)),
]


def reductions():
    print("| op (bf16) | tpu ms | PyTorch CPU ms | tpu / cpu (speed) |\n|---|---:|---:|---:|")
    for name, shape, f in REDUCTIONS:
        x = torch.randn(shape).bfloat16()
        best = {}
        for _ in range(3):
            for dev in ("tpu", "cpu"):
                xd = x.to(dev)
                t = bench(lambda: f(xd), dev, warmup=1, reps=5)
                best[dev] = min(best.get(dev, t), t)
        print(f"| {name} | {best['tpu'] * 1e3:.2f} | {best['cpu'] * 1e3:.2f} | {best['cpu'] / best['tpu']:.2f}x |")


def adamw_foreach(dtype, n=16, steps=12):
    """Median step time (ms) of AdamW (foreach on tpu, PyTorch's default on CPU) over n
    1024x1024 parameters, and on tpu the median graph run time from explain()."""
    out = {}
    for dev in ("tpu", "cpu"):
        threads_for(dev)
        torch.manual_seed(0)
        params = [torch.randn(1024, 1024).to(dev, dtype).requires_grad_() for _ in range(n)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3)
        for _ in range(3):
            opt.step()
        sync(dev)
        walls, runs = [], []
        for _ in range(steps):
            torchtpu.explain(clear=True)
            t0 = time.perf_counter()
            opt.step()
            params[0].view(-1)[0].item()
            walls.append(time.perf_counter() - t0)
            runs.append(sum(c["run_us"] for c in torchtpu.explain()) / 1e3)
        out[dev] = statistics.median(walls) * 1e3
        if dev == "tpu":
            out["graph"] = statistics.median(runs) if torchtpu.get_eager_mode() == "defer_and_fuse" else float("nan")
    return out


def fused_adamw_lists(dev, n, numel, calls=10, reps=20):
    """Per-call time (ms) of torch._fused_adamw_ over n parameters of numel elements."""
    threads_for(dev)
    P, G = [torch.randn(numel, device=dev) for _ in range(n)], [torch.randn(numel, device=dev) for _ in range(n)]
    M, V = [torch.zeros(numel, device=dev) for _ in range(n)], [torch.zeros(numel, device=dev) for _ in range(n)]
    S = [torch.ones((), device=dev) for _ in range(n)]

    def step():
        torch._fused_adamw_(P, G, M, V, [], S, lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8,
                            amsgrad=False, maximize=False)
    for _ in range(3):
        step()
    sync(dev)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        sync(dev)
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times) * 1e3


def main():
    reductions()
    print("\n| AdamW, 16 x 1024x1024 | tpu step ms | tpu graph run ms | PyTorch CPU step ms |\n|---|---:|---:|---:|")
    for dtype in (torch.bfloat16, torch.float32):
        r = adamw_foreach(dtype)
        print(f"| {str(dtype).replace('torch.', '')} | {r['tpu']:.1f} | {r['graph']:.1f} | {r['cpu']:.1f} |")
    print("\n| _fused_adamw_ parameters | tpu ms | CPU ms | tpu us / parameter | CPU us / parameter |\n"
          "|---|---:|---:|---:|---:|")
    for n, numel in ((200, 4096), (200, 16), (2000, 16)):
        t = {dev: fused_adamw_lists(dev, n, numel) for dev in ("tpu", "cpu")}
        print(f"| {n} x {numel} | {t['tpu']:.2f} | {t['cpu']:.2f} | {t['tpu'] * 1e3 / n:.1f} | {t['cpu'] * 1e3 / n:.1f} |")


if __name__ == "__main__":
    main()
