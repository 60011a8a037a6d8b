"""Model benchmarks from the examples, tpu vs CPU eager (and, with --compile, torch.compile:
Inductor on CPU and backend="tpu"): GPT training / prefill / decode tokens/s at d=512 and d=1024, images/s of the
example CNN and of torchvision's ResNet-18 (eager only: batch 16 at 128x128, SGD), first-step and steady-state step time, peak device memory, MFU against the FMA peak.

`--peak FLOPS` is the machine's all-core f32 peak (from bench/machine.py) for MFU."""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
import torchvision

from _timing import emit, progress, sync, threads_for
from gpt_configs import GPT_CONFIGS, gpt_train_flops_per_token

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import train_cnn  # noqa: E402
import train_gpt  # noqa: E402


def step_times(model, opt, batches, loss_fn, dev, steps):
    threads_for(dev)
    times = []
    for s in range(steps):
        x, y = batches(s)
        x, y = x.to(dev), y.to(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        sync(dev)
        times.append(time.perf_counter() - t0)
    return times


def compiled_or_eager(model, dev, compiled):
    """torch.compile with Inductor on CPU, with torchtpu's backend on tpu."""
    if not compiled:
        return model
    return torch.compile(model, backend="tpu" if dev == "tpu" else "inductor")


def gpt_run(cfg, dev, compiled=False, dtype=torch.float32):
    model = train_gpt.make_model(d=cfg["d"], heads=cfg["heads"], layers=cfg["layers"], ctx=cfg["ctx"])
    model = model.to(dev, dtype)
    fwd = compiled_or_eager(model, dev, compiled)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = train_gpt.make_batches(cfg["batch"], cfg["ctx"])
    if dev == "tpu":
        torch.tpu.reset_peak_memory_stats()
    times = step_times(fwd, opt, batches, train_gpt.loss_fn, dev, cfg["steps"])
    tokens = cfg["batch"] * cfg["ctx"]
    steady = sorted(times[1:])[len(times[1:]) // 2]
    res = {"first_step_s": times[0], "steady_step_s": steady, "train_tokens_s": tokens / steady,
           "flops_per_token": gpt_train_flops_per_token(model, cfg)}
    with torch.no_grad():
        x, _ = batches(100)
        x = x.to(dev)
        fwd(x)
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(2):
            fwd(x)
        sync(dev)
        res["prefill_tokens_s"] = 2 * tokens / (time.perf_counter() - t0)
        if not compiled:
            # Greedy decode, batch 1, no KV cache (the example model has none): each token
            # reruns the forward over the growing context.
            ctx = x[:1, :32]
            t0 = time.perf_counter()
            for _ in range(16):
                nxt = model(ctx)[:, -1].argmax(-1, keepdim=True)
                ctx = torch.cat([ctx, nxt], 1)
            ctx.cpu()
            res["decode_tokens_s"] = 16 / (time.perf_counter() - t0)
    if dev == "tpu":
        res["peak_mem_bytes"] = torch.tpu.max_memory_allocated()
    return res


def cnn_times(dev, steps, batch=64, compiled=False):
    """Step times of a fresh CNN and optimizer (the first includes its warm-up)."""
    model = train_cnn.make_model().to(dev)
    fwd = compiled_or_eager(model, dev, compiled)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return step_times(fwd, opt, lambda s: train_cnn.batches(s, batch), F.cross_entropy, dev, steps)


def resnet_times(dev, steps, batch=16, compiled=False):
    """Step times of a fresh torchvision ResNet-18 (100 classes) on one fixed batch of
    128x128 images, SGD with momentum."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=100).to(dev)
    fwd = compiled_or_eager(model, dev, compiled)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, 128, 128), torch.randint(0, 100, (batch,))
    return step_times(fwd, opt, lambda s: (x, y), F.cross_entropy, dev, steps)


def cnn_rows(devs, times_fn=cnn_times, model="CNN (train_cnn.py, batch 64, 16x16)", rounds=3, steps=60, batch=64):
    """Steps of ~5 ms are at the mercy of a burst of load from other processes, so the
    devices alternate for `rounds` rounds of `steps` steps and each row is the median of
    all its steady steps (every round's first step left out); first step: round one's."""
    times = {label: [] for _, _, label in devs}
    first = {}
    for rnd in range(rounds):
        for dev, comp, label in devs:
            if dev == "tpu" and rnd == 0:
                torch.tpu.reset_peak_memory_stats()
            t = times_fn(dev, steps, batch, comp)
            first.setdefault(label, t[0])
            times[label] += t[1:]
    rows = []
    for dev, _, label in devs:
        steady = sorted(times[label])[len(times[label]) // 2]
        r = {"first_step_s": first[label], "steady_step_s": steady, "images_s": batch / steady,
             "model": model, "device": label}
        if dev == "tpu":
            r["peak_mem_bytes"] = torch.tpu.max_memory_allocated()
        rows.append(r)
        progress(f"{model} on {label}: {r['images_s']:.0f} images/s")
    return rows


LABELS = {("tpu", False): "tpu", ("cpu", False): "cpu", ("tpu", True): "tpu (compiled)",
          ("cpu", True): "cpu (inductor)"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile only: Inductor on CPU and backend=\"tpu\"")
    ap.add_argument("--cnn-only", action="store_true", help="only the CNN rows (tpu and CPU eager)")
    ap.add_argument("--gpt-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the GPT models' parameters and activations (the CNN stays float32); "
                         "MFU is still against the f32 peak")
    a = ap.parse_args()
    rows = []
    devs = [("tpu", True), ("cpu", True)] if a.compile else [("tpu", False), ("cpu", False)]
    dtype = getattr(torch, a.gpt_dtype)
    for cfg in [] if a.cnn_only else GPT_CONFIGS:
        name = cfg["name"] + ("" if dtype == torch.float32 else f" {a.gpt_dtype}")
        for dev, comp in devs:
            label = LABELS[dev, comp]
            progress(f"{name} on {label}")
            t0 = time.perf_counter()
            r = gpt_run(cfg, dev, comp, dtype)
            r.update(model=name, device=label, wall_s=time.perf_counter() - t0,
                     config={k: cfg[k] for k in ("d", "heads", "layers", "ctx", "batch", "steps")})
            progress(f"  train {r['train_tokens_s']:.0f} tok/s, steady {r['steady_step_s']:.2f} s/step")
            rows.append(r)
    rows += cnn_rows([(dev, comp, LABELS[dev, comp]) for dev, comp in devs])
    if not a.compile:
        rows += cnn_rows([(dev, False, dev) for dev, _ in devs], resnet_times,
                         "ResNet-18 (torchvision, batch 16, 128x128)", rounds=2, steps=6, batch=16)
    emit({"models_compile" if a.compile else "models": rows})


if __name__ == "__main__":
    main()
