"""bf16 GEMM, tpu (host driver) vs PyTorch CPU (oneDNN) in one process, at the GEMM
bench's LLM shapes: GFLOP/s and % of the measured bf16 peak (bench/peak.c's AMX
tdpbf16ps loop where the CPU has AMX, else its vdpbf16ps loop; 1 core x threads). Each
shape alternates tpu and cpu five times and keeps each side's best, so a burst of load
from other processes lands on both; the load average is printed with the table (above
the core count, read the tpu / cpu ratio, not the %). Prints a Markdown table; run it
once per thread count:

    TORCHTPU_NUM_THREADS=1 python bench/gemm_bf16.py
    TORCHTPU_NUM_THREADS=2 python bench/gemm_bf16.py
"""
import os
import sys

import torch

from _timing import bench, progress, threads
from machine import run_peak
from micro import GEMMS


def main():
    n = threads()
    peak = run_peak(["-march=native"]) or {}
    # the machine's bf16 peak: the AMX loop's where the CPU has AMX, else vdpbf16ps's
    amx = peak.get("amx_bf16_flops_1", 0.0)
    per_core = max(peak.get("bf16_flops_1", 0.0), amx)
    source = "AMX tdpbf16ps" if amx and amx >= per_core else "vdpbf16ps"
    limit = per_core * n
    rows = []
    for name, M, K, N in GEMMS:
        a32, b32 = torch.randn(M, K), torch.randn(K, N)
        best = {"tpu": 0.0, "cpu": 0.0}
        for _ in range(5):
            for dev in best:
                a, b = a32.to(torch.bfloat16).to(dev), b32.to(torch.bfloat16).to(dev)
                t = bench(lambda: torch.mm(a, b), dev, warmup=1, reps=3)
                best[dev] = max(best[dev], 2.0 * M * N * K / t)
        progress(f"{name}: tpu {best['tpu'] / 1e9:.1f}, cpu {best['cpu'] / 1e9:.1f} GFLOP/s")
        rows.append((name, best))
    load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"\n{n} thread(s); bf16 peak {limit / 1e9:.1f} GFLOP/s ({source} loop, {per_core / 1e9:.1f} per core x {n}); "
          f"load average {load} on {os.cpu_count()} cores\n")
    print("| shape (M x K x N) | tpu GFLOP/s | tpu % of bf16 peak | cpu GFLOP/s | cpu % of bf16 peak | tpu / cpu |")
    print("|---|---|---|---|---|---|")
    for name, b in rows:
        pct = (lambda x: f"{100 * x / limit:.0f}%") if limit else (lambda x: "n/a")
        print(f"| {name} | {b['tpu'] / 1e9:.1f} | {pct(b['tpu'])} | {b['cpu'] / 1e9:.1f} | {pct(b['cpu'])} | "
              f"{b['tpu'] / b['cpu']:.2f}x |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
