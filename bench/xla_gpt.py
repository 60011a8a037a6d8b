"""The suite's GPT training rows on PyTorch/XLA on CPU (PJRT_DEVICE=CPU): the lazy-tensor
system that a backend like torchtpu replaces, as an outside reference. Same model
(examples/train_gpt.py), sizes and AdamW as bench/models.py's GPT rows.

Runs only under the XLA venv's python (`bash scripts/setup_xla.sh` makes it; it has its own
torch), which torchtpu.bench does when that venv exists:

    PJRT_DEVICE=CPU <xla-venv>/bin/python bench/xla_gpt.py

Each step is what a PyTorch/XLA user writes: forward, backward, AdamW step, then
torch_xla.sync() (xm.mark_step()) to cut the traced graph and run it. The clock stops
after loss.item() and xm.wait_device_ops(), so a step's time includes its execution, not
only its tracing. The first step includes tracing and XLA compilation of the step graph;
the optimizer's first step builds its state, so the second step's graph differs and
compiles too. Per step the number of XLA compilations is recorded, and the steady step is
the median of the steps after the last one that compiled (XLA's persistent compilation
cache stays off, XLA_PERSISTENT_CACHE_PATH is cleared, so nothing carries over from earlier
runs). Per step the process CPU time is recorded too: it shows how many cores XLA kept busy.

Prints one line `BENCH_JSON {"models_xla": [...]}` (rows shaped like bench/models.py's)."""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.pop("XLA_PERSISTENT_CACHE_PATH", None)  # a cache hit would hide the first step's compilation

import torch  # noqa: E402

try:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
except ImportError as e:
    raise SystemExit(f"bench/xla_gpt.py needs the PyTorch/XLA venv ({e}): `bash scripts/setup_xla.sh` makes it "
                     "and prints its path; run this script with <that path>/bin/python") from None

from gpt_configs import GPT_CONFIGS, gpt_train_flops_per_token  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import train_gpt  # noqa: E402


def progress(msg):
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def compiles():
    """XLA compilations so far in this process (torch_xla's CompileTime metric)."""
    data = met.metric_data("CompileTime")
    return data[0] if data else 0


def step_sync():
    if hasattr(torch_xla, "sync"):  # torch_xla >= 2.6 spells xm.mark_step() this way
        torch_xla.sync()
    else:
        xm.mark_step()


def gpt_run(cfg, dev, steps, extra_steps):
    model = train_gpt.make_model(d=cfg["d"], heads=cfg["heads"], layers=cfg["layers"], ctx=cfg["ctx"]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = train_gpt.make_batches(cfg["batch"], cfg["ctx"])
    step_sync()  # parameters on the device before the clock starts, as for the other rows
    xm.wait_device_ops()
    times, cpu_times, compiled, losses = [], [], [], []
    for s in range(steps + extra_steps):
        # The configured steps, then more (at most extra_steps) until two ran without compiling.
        if s >= steps and len(compiled) - 1 - last_compiling(compiled) >= 2:
            break
        x, y = batches(s)
        x, y = x.to(dev), y.to(dev)
        c0 = compiles()
        t0, p0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        loss = train_gpt.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        step_sync()
        losses.append(loss.item())
        xm.wait_device_ops()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - p0)  # CPU seconds of all threads: how many cores XLA kept busy
        compiled.append(compiles() - c0)
        progress(f"  step {s}: {times[-1]:.2f} s (CPU time {cpu_times[-1]:.2f} s), {compiled[-1]} XLA "
                 f"compilation(s), loss {losses[-1]:.4f}")
    steady_times = times[last_compiling(compiled) + 1:]
    if not steady_times:
        raise SystemExit(f"{cfg['name']}: every step compiled ({compiled}); no steady state measured")
    steady = sorted(steady_times)[len(steady_times) // 2]
    tokens = cfg["batch"] * cfg["ctx"]
    return {"first_step_s": times[0], "steady_step_s": steady, "train_tokens_s": tokens / steady,
            "flops_per_token": gpt_train_flops_per_token(model, cfg), "step_times_s": times,
            "step_cpu_s": cpu_times, "step_compilations": compiled, "losses": losses}


def last_compiling(compiled):
    """Index of the last step that compiled (-1 if none did)."""
    return max((i for i, c in enumerate(compiled) if c), default=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=0, help="steps per model (default: bench/models.py's)")
    ap.add_argument("--extra-steps", type=int, default=3,
                    help="at most this many more steps when fewer than 2 ran without compiling")
    a = ap.parse_args()
    dev = torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()
    versions = {"torch": torch.__version__, "torch_xla": torch_xla.__version__,
                "pjrt_device": os.environ["PJRT_DEVICE"]}
    progress(f"PyTorch/XLA {versions['torch_xla']} (torch {versions['torch']}) on {dev}, "
             f"PJRT_DEVICE={versions['pjrt_device']}")
    rows = []
    for cfg in GPT_CONFIGS:
        steps = a.steps or cfg["steps"]
        progress(f"{cfg['name']} on cpu (pytorch/xla)")
        t0 = time.perf_counter()
        r = gpt_run(cfg, dev, steps, a.extra_steps)
        r.update(model=cfg["name"], device="cpu (pytorch/xla)", wall_s=time.perf_counter() - t0,
                 config={**{k: cfg[k] for k in ("d", "heads", "layers", "ctx", "batch")},
                         "steps": len(r["step_times_s"])}, **versions)
        progress(f"  first step {r['first_step_s']:.2f} s, steady {r['steady_step_s']:.2f} s/step, "
                 f"train {r['train_tokens_s']:.0f} tok/s")
        rows.append(r)
    print("BENCH_JSON " + json.dumps({"models_xla": rows}), flush=True)


if __name__ == "__main__":
    main()
