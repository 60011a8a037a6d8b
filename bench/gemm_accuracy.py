"""Rounding error of f32 matrix products and convolutions, tpu vs PyTorch's CPU eager:
each case runs in float32 on both devices and in float64 on CPU, and prints the rms and
max error of each float32 result against the float64 one, and the tpu's rms error over
the CPU's. Covers each path of the AVX-512 f32 GEMM (packed; few rows with B read in
place; dot products), a weight gradient's long K, and 3x3 convolutions through Winograd
F(2x2, 3x3) (128+ channels) and through im2col. Fixed seeds.

    python bench/gemm_accuracy.py           # the error table
    python bench/gemm_accuracy.py --speed   # tpu GFLOP/s of the matmul cases (strict mode)

--speed is for A/B runs of two builds, each a copy of the torchtpu package put first on
PYTHONPATH, alternating in fresh processes (docs/benchmarks.md, "GEMM accuracy").
"""
import argparse
import math

import torch
import torch.nn.functional as F

import torchtpu
from _timing import best_per_call

MATMUL = [  # M, N, K, B transposed, path
    (512, 1024, 1024, False, "packed"),
    (256, 256, 4096, False, "packed"),
    (4, 1024, 4096, False, "few rows"),
    (4, 1024, 4096, True, "dot products"),
    (64, 27, 65536, True, "dot products (a 3x3 stem's weight gradient)"),
]
CONV = [  # input, out channels, path
    ((4, 256, 14, 14), 256, "Winograd"),
    ((4, 512, 14, 14), 512, "Winograd"),
    ((4, 128, 28, 28), 128, "Winograd"),
    ((4, 64, 56, 56), 64, "im2col"),
]


def errors(cpu, tpu, ref):
    d = [(x.double() - ref) for x in (cpu, tpu)]
    rms = [e.pow(2).mean().sqrt().item() for e in d]
    mx = [e.abs().max().item() for e in d]
    return rms, mx


def row(name, path, cpu, tpu, ref):
    (rc, rt), (mc, mt) = errors(cpu, tpu, ref)
    return f"| {name} | {path} | {rc:.3g} | {rt:.3g} | {rt / rc:.2f}x | {mc:.3g} | {mt:.3g} |"


def speed():
    torchtpu.set_eager_mode("strict")
    dev = torch.device("tpu")
    out = []
    for M, N, K, bt, path in MATMUL + [(6, 1024, 1024, False, "few rows")]:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(M, K, generator=g).to(dev)
        b = (torch.randn(N, K, generator=g).t() if bt else torch.randn(K, N, generator=g)).to(dev)
        t = best_per_call(lambda: a @ b, dev, reps=5, calls=10)
        out.append(f"{M}x{K}@{K}x{N}{'T' if bt else ''} {2 * M * N * K / t / 1e9:.0f}")
    print("tpu GFLOP/s:", "; ".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", action="store_true", help="time the matmul cases on tpu instead")
    if ap.parse_args().speed:
        return speed()
    print("| case | path | CPU rms err | tpu rms err | tpu / CPU | CPU max err | tpu max err |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for M, N, K, bt, path in MATMUL:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(M, K, generator=g)
        b = (torch.randn(N, K, generator=g).t() if bt else torch.randn(K, N, generator=g)) / math.sqrt(K)
        ref = a.double() @ b.double()
        tpu = (a.to("tpu") @ b.to("tpu")).cpu()
        print(row(f"matmul {M}x{K} @ {K}x{N}{' (B transposed)' if bt else ''}", path, a @ b, tpu, ref))
    for xs, co, path in CONV:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(*xs, generator=g)
        w = torch.randn(co, xs[1], 3, 3, generator=g) / (3 * math.sqrt(xs[1]))
        ref = F.conv2d(x.double(), w.double(), padding=1)
        tpu = F.conv2d(x.to("tpu"), w.to("tpu"), padding=1).cpu()
        print(row(f"conv2d 3x3 {tuple(xs)} -> {co}", path, F.conv2d(x, w, padding=1), tpu, ref))


if __name__ == "__main__":
    main()
