"""Micro benchmarks, tpu (host driver) vs torch CPU eager, side by side in one process:
GEMM f32/bf16 at LLM shapes, elementwise and reduction bandwidth, per-op dispatch
overhead. `--scaling` runs only the subset used for the thread-scaling table; `--bw` only
the bandwidth table, printed (for A/B runs, e.g. TORCHTPU_STREAM_MIN_BYTES=0 against the
default)."""
import argparse

import torch
import torch.nn.functional as F

from _timing import bench, emit, progress, threads

# (name, M, K, N): tokens x d_in @ d_in x d_out of a d=1024 transformer, 512 tokens
GEMMS = [("qkv 512x1024x3072", 512, 1024, 3072), ("mlp_up 512x1024x4096", 512, 1024, 4096),
         ("mlp_down 512x4096x1024", 512, 4096, 1024), ("square 1024^3", 1024, 1024, 1024)]
N_BW = 1 << 24  # 16M elements: 64 MiB per f32 tensor, far beyond the caches


def gemm_rows(devices, dtypes, shapes):
    rows = []
    for name, M, K, N in shapes:
        for dt in dtypes:
            a32, b32 = torch.randn(M, K), torch.randn(K, N)
            row = {"op": f"matmul {name}", "dtype": str(dt).replace("torch.", "")}
            for dev in devices:
                a, b = a32.to(dt).to(dev), b32.to(dt).to(dev)
                # two warm-up runs: the first product of a process (the pool's threads
                # waking, fresh pages) measured 240-260 GFLOP/s where later ones of the same
                # shape ran 420+ (Zen 5, f32 qkv)
                t = bench(lambda: torch.mm(a, b), dev, warmup=2, reps=3)
                row[dev] = 2.0 * M * N * K / t  # FLOP/s
            progress(f"gemm {name} {dt}: " + ", ".join(f"{d} {row[d] / 1e9:.1f} GFLOP/s" for d in devices))
            rows.append(row)
    return rows


def bw_rows(devices, ops):
    """Bytes moved at the ideal (each input read once, output written once)."""
    x32, y32 = torch.randn(N_BW), torch.randn(N_BW)
    table = {
        "copy (clone)": (lambda x, y: x.clone(), 2),
        "add": (lambda x, y: x + y, 3),
        "mul": (lambda x, y: x * y, 3),
        "gelu": (lambda x, y: F.gelu(x), 2),
        "sum (all)": (lambda x, y: x.sum(), 1),
        "sum (rows of 4096)": (lambda x, y: x.view(-1, 4096).sum(1), 1),
        "softmax (rows of 4096)": (lambda x, y: torch.softmax(x.view(-1, 4096), 1), 2),
        "layer_norm (rows of 1024)": (lambda x, y: F.layer_norm(x.view(-1, 1024), (1024,)), 2),
        # random draws: the bytes of the output (dropout: its input too), not the mask
        "rand": (lambda x, y: torch.rand(N_BW, device=x.device), 1),
        "randn": (lambda x, y: torch.randn(N_BW, device=x.device), 1),
        "randint (int64 output)": (lambda x, y: torch.randint(0, 50257, (N_BW,), device=x.device), 2),
        "dropout (p=0.1, training)": (lambda x, y: F.dropout(x, 0.1), 2),
    }
    rows = []
    for name in ops:
        fn, tensors = table[name]
        row = {"op": name, "dtype": "float32"}
        for dev in devices:
            x, y = x32.to(dev), y32.to(dev)
            t = bench(lambda: fn(x, y), dev, warmup=1, reps=5)
            row[dev] = tensors * 4.0 * N_BW / t  # bytes/s
        progress(f"{name}: " + ", ".join(f"{d} {row[d] / 1e9:.3g} GB/s" for d in devices))
        rows.append(row)
    return rows


def dispatch_rows(devices, n=10_000):
    """A chain of tiny adds, per tpu eager mode (strict runs each op at once; defer_and_fuse
    records it into a graph first), against CPU eager measured once."""
    def loop_on(dev):
        a, b = torch.randn(16, device=dev), torch.randn(16, device=dev)

        def loop():
            c = a
            for _ in range(n):
                c = torch.add(c, b)
            return c
        return bench(loop, dev, warmup=1, reps=3) / n  # seconds per op
    cpu = loop_on("cpu") if "cpu" in devices else None
    rows = []
    if "tpu" in devices:
        import torchtpu
        for mode in ("strict", "defer_and_fuse"):
            with torchtpu.set_eager_mode(mode):
                rows.append({"op": f"add of 16-element tensors ({n:,} ops, one synchronize), tpu {mode}",
                             "tpu": loop_on("tpu"), "cpu": cpu})
    progress("dispatch: " + ", ".join(f"{r['op'].rsplit(' ', 1)[-1]} {r['tpu'] * 1e6:.1f} us/op" for r in rows)
             + (f", cpu {cpu * 1e6:.1f} us/op" if cpu else ""))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scaling", action="store_true")
    ap.add_argument("--bw", action="store_true", help="only the bandwidth table (A/B runs)")
    a = ap.parse_args()
    n = threads()
    devices = ["tpu", "cpu"]
    if a.scaling:
        progress(f"thread scaling subset with {n} thread(s)")
        out = {"threads": n,
               "gemm": gemm_rows(devices, [torch.float32, torch.bfloat16], [GEMMS[1]]),
               "bw": bw_rows(devices, ["add", "softmax (rows of 4096)", "sum (all)", "layer_norm (rows of 1024)"])}
        emit({"scaling": out})
        return
    bw_ops = ["copy (clone)", "add", "mul", "gelu", "sum (all)", "sum (rows of 4096)", "softmax (rows of 4096)",
              "layer_norm (rows of 1024)", "rand", "randn", "randint (int64 output)",
              "dropout (p=0.1, training)"]
    if a.bw:
        bw_rows(devices, bw_ops)  # printed as it goes; nothing emitted for the suite
        return
    out = {"threads": n,
           "gemm": gemm_rows(devices, [torch.float32, torch.bfloat16], GEMMS),
           "bw": bw_rows(devices, bw_ops),
           "dispatch": dispatch_rows(devices)}
    emit({"micro": out})


if __name__ == "__main__":
    main()
