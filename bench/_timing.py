"""Timing helpers shared by the bench scripts: device-aware synchronization and a
best-of-N timer. Benchmarks print results; they never assert on timings."""
import json
import os
import sys
import time

import torch
import torchtpu  # noqa: F401  (registers the tpu device even with TORCH_DEVICE_BACKEND_AUTOLOAD=0)


def sync(device):
    if str(device).startswith("tpu"):
        torch.tpu.synchronize()


def bench(fn, device, warmup=1, reps=5, min_time=0.0):
    """Best wall time of fn() (seconds) over reps runs, each synchronized."""
    for _ in range(warmup):
        fn()
    sync(device)
    best = float("inf")
    t_start = time.perf_counter()
    for i in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
        if min_time and time.perf_counter() - t_start > min_time and i >= 1:
            break
    return best


def set_threads(n):
    """CPU eager runs with n intra-op threads; the tpu pool reads TORCHTPU_NUM_THREADS."""
    torch.set_num_threads(n)


def emit(obj):
    print("BENCH_JSON " + json.dumps(obj), flush=True)


def progress(msg):
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def threads():
    return int(os.environ.get("TORCHTPU_NUM_THREADS") or os.cpu_count() or 1)
