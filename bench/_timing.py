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
    threads_for(device)
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


def best_per_call(fn, device, reps=5, calls=5):
    """Best over reps runs of the mean wall time (seconds) of `calls` back-to-back calls of
    fn, each run synchronized at its end; one warm-up call first."""
    threads_for(device)
    fn()
    sync(device)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def threads_for(device):
    """PyTorch's CPU intra-op threads for a run on device: threads() for CPU eager; beside
    the tpu host driver, what torchtpu sets at the first tpu allocation (1 unless
    TORCHTPU_CPU_THREADS or OMP_NUM_THREADS say otherwise: idle OpenMP threads spin on
    the runtime's cores). Set before each run, so neither side runs with the other's."""
    tpu = str(device).startswith("tpu")
    torch.set_num_threads(torchtpu._C._cpu_threads_beside_runtime() if tpu else threads())


def emit(obj):
    print("BENCH_JSON " + json.dumps(obj), flush=True)


def progress(msg):
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def threads():
    return int(os.environ.get("TORCHTPU_NUM_THREADS") or os.cpu_count() or 1)
