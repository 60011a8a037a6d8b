"""Huge pages for large device blocks (host driver), off vs on, alternating fresh
processes: the default (TORCHTPU_HUGE_PAGES=0) vs TORCHTPU_HUGE_PAGES=1.

Per process: page faults and time of a GPT training step (d=1024, or --d 512)'s first step (weights,
gradients, AdamW state and activations touched for the first time) and of a steady step;
first touch of a 256 MiB tensor allocated after the pool was emptied; copy and add
bandwidth over 64 MiB tensors.

    python bench/huge_pages.py [--rounds 2] [--d 512|1024]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, resource, sys, time, torch
sys.path.insert(0, os.path.join(sys.argv[1], "examples")); sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import torchtpu, train_gpt
from gpt_configs import GPT_CONFIGS
torchtpu.set_eager_mode("strict")
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
out = {}
cfg = next(c for c in GPT_CONFIGS if c["d"] == int(sys.argv[2]))
model = train_gpt.make_model(d=cfg["d"], heads=cfg["heads"], layers=cfg["layers"], ctx=cfg["ctx"]).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batches = train_gpt.make_batches(cfg["batch"], cfg["ctx"])
times = []
for s in range(3):
    x, y = (t.to("tpu") for t in batches(s))
    f0, t0 = faults(), time.perf_counter()
    opt.zero_grad(set_to_none=True)
    train_gpt.loss_fn(model(x), y).backward()
    opt.step()
    torch.tpu.synchronize()
    times.append((time.perf_counter() - t0, faults() - f0))
out["first_s"], out["first_faults"] = times[0]
out["steady_s"], out["steady_faults"] = min(times[1:])
del model, opt
torch.tpu.synchronize(); torch.tpu.empty_cache()
n = 64 << 20
f0, t0 = faults(), time.perf_counter()
t = torch.empty(n, device="tpu").fill_(1.0); torch.tpu.synchronize()
out["touch_s"], out["touch_faults"] = time.perf_counter() - t0, faults() - f0
del t
a, b, c = (torch.ones(16 << 20, device="tpu") for _ in range(3))
for name, f, nbytes in (("copy", lambda: c.copy_(a), 8), ("add", lambda: torch.add(a, b, out=c), 12)):
    f(); torch.tpu.synchronize(); ts = []
    for _ in range(15):
        t0 = time.perf_counter(); f(); torch.tpu.synchronize(); ts.append(time.perf_counter() - t0)
    out[name + "_gbs"] = nbytes * (16 << 20) / sorted(ts)[len(ts) // 2] / 1e9
print(json.dumps(out))
"""

# (label, key, digits, higher is better)
ROWS = [("GPT first step, s", "first_s", 2, False), ("  page faults in it", "first_faults", 0, False),
        ("GPT steady step, s", "steady_s", 3, False), ("  page faults in it", "steady_faults", 0, False),
        ("first touch of 256 MiB, s", "touch_s", 3, False), ("  page faults in it", "touch_faults", 0, False),
        ("copy 64 MiB, GB/s", "copy_gbs", 1, True), ("add 64 MiB, GB/s", "add_gbs", 1, True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--d", type=int, default=1024, choices=[512, 1024], help="the GPT config (bench/gpt_configs.py)")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = {"0": [], "1": []}
    for r in range(args.rounds):
        for huge in ("0", "1"):  # alternated: the machine's noise hits both alike
            env = dict(os.environ, TORCHTPU_HUGE_PAGES=huge)
            p = subprocess.run([sys.executable, "-c", CHILD, root, str(args.d)], env=env, capture_output=True, text=True,
                               check=True)
            res[huge].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r} huge={huge}: {res[huge][-1]}", file=sys.stderr, flush=True)
    print(f"Command: `python bench/huge_pages.py --rounds {args.rounds} --d {args.d}` (fresh process per run, "
          f"alternating; median over rounds; GPT d={args.d})\n")
    print("| measure | TORCHTPU_HUGE_PAGES=0, the default (each round) | TORCHTPU_HUGE_PAGES=1 (each round) | "
          "gain of huge pages (medians) |")
    print("|---|---:|---:|---:|")
    for label, key, digits, higher in ROWS:
        off, on = ([x[key] for x in res[h]] for h in ("0", "1"))
        a, b = statistics.median(off), statistics.median(on)
        gain = (b / a if higher else a / b) if a and b else float("nan")
        each = lambda v: ", ".join(f"{x:.{digits}f}" for x in v)
        print(f"| {label} | {each(off)} | {each(on)} | {gain:.2f}x |")


if __name__ == "__main__":
    main()
