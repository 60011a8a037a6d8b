"""The benchmark suite: `python -m torchtpu.bench` runs bench/*.py side by side (tpu
host driver vs torch CPU eager, each script in a fresh process so thread counts take
effect) and writes docs/benchmarks.md with the command, the machine, the tables and
PNG plots of them (docs/plots/, torchtpu/_bench_plots.py); `--from-json` renders the
report again from a run's raw numbers (build/benchmarks.json) without measuring.

Sections: machine limits (bench/peak.c), micro benchmarks (bench/micro.py), thread
scaling (1 vs all threads), models (bench/models.py, plus torch.compile when it compiles in
time: Inductor on CPU and backend "tpu", plus PyTorch/XLA on CPU via bench/xla_gpt.py when scripts/setup_xla.sh has made its
venv). Results are ratios and rates for people to read; nothing here is a test."""
import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import time

from torchtpu import _bench_plots

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")


def run_script(name, args=(), env=None, timeout=None, python=sys.executable):
    """Runs bench/<name>; returns (parsed BENCH_JSON dict or None, reason if it failed)."""
    cmd = [python, os.path.join(BENCH, name), *args]
    full_env = dict(os.environ, **(env or {}))
    shown = cmd[1:] if python == sys.executable else cmd
    print(f"[bench] {' '.join(shown)}" + (f"  ({env})" if env else ""), flush=True)
    try:
        p = subprocess.run(cmd, cwd=BENCH, env=full_env, stdout=subprocess.PIPE, stderr=None, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"did not finish within {timeout} s"
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            out.update(json.loads(line[len("BENCH_JSON "):]))
    if p.returncode != 0 or not out:
        return None, f"exit code {p.returncode}"
    return out, None


def xla_python():
    """The PyTorch/XLA venv's python if scripts/setup_xla.sh has made it (same path rule:
    TORCHTPU_XLA_VENV, else the cache dir keyed by the hash of scripts/requirements-xla.txt)."""
    venv = os.environ.get("TORCHTPU_XLA_VENV")
    if not venv:
        with open(os.path.join(ROOT, "scripts", "requirements-xla.txt"), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        venv = os.path.join(cache, "torchtpu", f"xla-venv-{digest}")
    python = os.path.join(venv, "bin", "python")
    return python if os.path.isfile(os.path.join(venv, ".complete")) and os.path.isfile(python) else None


def g(x, unit=1e9, nd=1):
    return f"{x / unit:.{nd}f}"


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"


def load_avg():
    try:
        return " / ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def compiling_s(x):
    return sum(t for t, c in zip(x["step_times_s"], x["step_compilations"]) if c)


def xla_section(L, r, by):
    """The GPT rows against PyTorch/XLA on CPU (bench/xla_gpt.py in its own venv)."""
    L.append("### tpu vs PyTorch/XLA on CPU\n")
    xla = r.get("models_xla")
    if not xla:
        why = r.get("xla_skipped") or "its venv does not exist"
        L.append(f"PyTorch/XLA (`PJRT_DEVICE=CPU`), the system this kind of backend replaces: not run ({why}). "
                 "`bash scripts/setup_xla.sh` creates its venv (its own torch and torch_xla, several GB); "
                 "the next `python -m torchtpu.bench` then adds its GPT rows.\n")
        return
    x0 = xla[0]
    L.append(f"Rows \"cpu (pytorch/xla)\": `bench/xla_gpt.py`, the same model, sizes and AdamW on "
             f"torch_xla {x0['torch_xla']} (torch {x0['torch']}, its own venv from `scripts/setup_xla.sh`), "
             f"`PJRT_DEVICE={x0['pjrt_device']}`, a `torch_xla.sync()` per step and the clock stopped after "
             "`loss.item()` and `xm.wait_device_ops()`. Its first step includes tracing and XLA compilation; "
             "its steady step is the median of the steps after the last one that compiled (XLA compilations "
             "per step: " + "; ".join(
                 f"{x['model']} {x['step_compilations']}, {compiling_s(x):.1f} s in the steps that compiled"
                 for x in xla) + "). "
             "Issue 6's target: tpu first step at least 10x shorter than PyTorch/XLA's, steady step at "
             "least as fast.\n")
    L.append("| model | first step tpu / pytorch/xla s | first step vs PyTorch/XLA (times shorter) | "
             "steady step tpu / pytorch/xla s | steady step vs PyTorch/XLA (speed) |")
    L.append("|---|---|---|---|---|")
    for x in xla:
        t = by.get((x["model"], "tpu"))
        if not t:
            continue
        L.append(f"| {x['model']} | {t['first_step_s']:.2f} / {x['first_step_s']:.2f} | "
                 f"{ratio(x['first_step_s'], t['first_step_s'])} | {t['steady_step_s']:.2f} / "
                 f"{x['steady_step_s']:.2f} | {ratio(x['steady_step_s'], t['steady_step_s'])} |")
    L.append("")


def write_report(path, cmd, r, started, elapsed, loads):
    m = r["machine"]
    peak = m["flops_all"]
    plots, no_plots = _bench_plots.write_plots(r, os.path.join(os.path.dirname(os.path.abspath(path)), "plots"))
    L = []

    def plot(name):  # a figure's link under its table
        if name in plots:
            L.append(f"![{plots[name][1]}](plots/{plots[name][0]})\n")

    L.append("# Benchmarks\n")
    L.append("Recorded results of the benchmark suite. Regenerate with:\n")
    L.append(f"```\n{cmd}\n```\n")
    L.append(f"Run {started} ({elapsed / 60:.1f} min). Every script runs in its own process; tpu is the "
             "host driver (libtpurt on the CPU), cpu is PyTorch's CPU eager on the same cores. Ratios are "
             "tpu / cpu: above 1 means the tpu device is faster (for times: lower is better, the ratio "
             "is still speed).\n")
    if no_plots:
        L.append(f"No plots in this run: {no_plots}.\n")
    L.append("## Machine\n")
    L.append("| | |\n|---|---|")
    L.append(f"| CPU (lscpu) | {m['model']} |")
    L.append(f"| cores | {m['cores']} |")
    L.append(f"| RAM | {m['ram_gib']:.1f} GiB |")
    L.append(f"| Python / torch | {platform.python_version()} / {r.get('torch', '?')} |")
    L.append(f"| load average (1/5/15 min) at start, end | {loads[0]}; {loads[1]} |")
    L.append(f"| peak f32, 1 core (FMA loop, `cc -O3 {m['peak_flags']}`, {m['vector_width']}-wide) | "
             f"{g(m['flops_1'])} GFLOP/s |")
    L.append(f"| peak f32, all cores | {g(peak)} GFLOP/s |")
    if m.get("bf16_flops_all"):
        L.append(f"| peak bf16, 1 core / all (vdpbf16ps loop, `cc -O3 -march=native`) | "
                 f"{g(m['bf16_flops_1'])} / {g(m['bf16_flops_all'])} GFLOP/s |")
    if m.get("amx_bf16_flops_all"):
        L.append(f"| peak bf16, 1 core / all (AMX tdpbf16ps loop) | "
                 f"{g(m['amx_bf16_flops_1'])} / {g(m['amx_bf16_flops_all'])} GFLOP/s |")
    bf16_peak = _bench_plots.bf16_peak(m)
    L.append(f"| memory bandwidth copy, 1 core / all | {g(m['copy_1'])} / {g(m['copy_all'])} GB/s |")
    L.append(f"| memory bandwidth triad, 1 core / all | {g(m['triad_1'])} / {g(m['triad_all'])} GB/s |")
    L.append("")
    L.append("A load average above the core count means other processes shared the cores during the "
             "run: absolute numbers are then lower bounds and noisier; tpu and cpu rows were measured "
             "back to back, so their ratios are the more stable figure.\n")
    if "micro" in r:
        mi = r["micro"]
        L.append(f"## Micro benchmarks ({mi['threads']} threads)\n")
        L.append("### GEMM (`torch.mm`)\n")
        L.append("| shape (M x K x N) | dtype | tpu GFLOP/s | tpu % of peak | cpu GFLOP/s | cpu % of peak | tpu / cpu |")
        L.append("|---|---|---|---|---|---|---|")
        for row in mi["gemm"]:
            lim = _bench_plots.gemm_peak(m, row["dtype"])
            L.append(f"| {row['op'].replace('matmul ', '')} | {row['dtype']} | {g(row['tpu'])} | "
                     f"{100 * row['tpu'] / lim:.0f}% | {g(row['cpu'])} | {100 * row['cpu'] / lim:.0f}% | "
                     f"{ratio(row['tpu'], row['cpu'])} |")
        if bf16_peak:
            L.append("\n% of peak: f32 rows against the f32 peak, bf16 rows against the bf16 peak (AMX's "
                     "where the CPU has it, else vdpbf16ps's). bf16 on tpu runs libtpurt's AVX512-BF16 kernel "
                     "(`runtime/src/host/gemm_avx512bf16.c`); `bench/gemm_bf16.py` compares it with "
                     "PyTorch CPU at 1 and all threads.\n")
        else:
            L.append("\nNo AVX512-BF16 here: bf16 on tpu widens to f32 and calls sgemm (the pinned "
                     "OpenBLAS has no sbgemm); % of peak is against the f32 peak.\n")
        plot("gemm")
        L.append("### Bandwidth-bound ops (16M f32 elements, ideal bytes: inputs read once, output written once)\n")
        L.append("| op | tpu GB/s | tpu % of copy bw | cpu GB/s | cpu % of copy bw | tpu / cpu |")
        L.append("|---|---|---|---|---|---|")
        for row in mi["bw"]:
            L.append(f"| {row['op']} | {g(row['tpu'])} | {100 * row['tpu'] / m['copy_all']:.0f}% | "
                     f"{g(row['cpu'])} | {100 * row['cpu'] / m['copy_all']:.0f}% | {ratio(row['tpu'], row['cpu'])} |")
        L.append("\nThe tpu device allocates from its caching pool; CPU eager gets fresh pages from the OS "
                 "for each 64 MiB result, so its elementwise numbers include page-fault time.\n")
        plot("bandwidth")
        L.append("### Per-op dispatch overhead\n")
        L.append("| loop | tpu us/op | cpu us/op | tpu / cpu (speed) |")
        L.append("|---|---|---|---|")
        for row in mi["dispatch"]:
            L.append(f"| {row['op']} | {row['tpu'] * 1e6:.2f} | {row['cpu'] * 1e6:.2f} | {ratio(row['cpu'], row['tpu'])} |")
        L.append("")
        plot("dispatch")
    if "scaling" in r:
        s1, sn = r["scaling"]
        L.append(f"## Thread scaling (1 vs {sn['threads']} threads)\n")
        L.append("`TORCHTPU_NUM_THREADS` sizes the tpu pool (and OpenBLAS); `torch.set_num_threads` the CPU "
                 "side. Speedup = rate with all threads / rate with 1; each is the best of three alternating "
                 "runs.\n")
        L.append(f"| op | tpu 1 thread | tpu {sn['threads']} threads | tpu speedup | cpu 1 thread | "
                 f"cpu {sn['threads']} threads | cpu speedup |")
        L.append("|---|---|---|---|---|---|---|")
        for key, unit in (("gemm", "GFLOP/s"), ("bw", "GB/s")):
            for a, b in zip(s1[key], sn[key]):
                name = f"{a['op']} {a['dtype']}" if key == "gemm" else a["op"]
                L.append(f"| {name} ({unit}) | {g(a['tpu'])} | {g(b['tpu'])} | {b['tpu'] / a['tpu']:.2f}x | "
                         f"{g(a['cpu'])} | {g(b['cpu'])} | {b['cpu'] / a['cpu']:.2f}x |")
        L.append("")
        plot("scaling")
    if "models" in r:
        rows = _bench_plots.model_rows(r)
        L.append("## Models\n")
        L.append("GPT = `examples/train_gpt.py`'s model (char vocab 128) with the sizes below; training "
                 "steps include AdamW; MFU = achieved training FLOP/s (6 x weights + attention per token) "
                 "/ all-core f32 peak. Decode is greedy, batch 1, from a 32-token prompt, and reruns the "
                 "full forward per token (the example model has no KV cache).\n")
        L.append("| model | device | train tok/s | prefill tok/s | decode tok/s | first step s | steady step s | MFU | peak device memory |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for x in rows:
            if "train_tokens_s" not in x:
                continue
            mfu = x["train_tokens_s"] * x["flops_per_token"] / peak
            mem = f"{x['peak_mem_bytes'] / 2**20:.0f} MiB" if "peak_mem_bytes" in x else "-"
            dec = f"{x['decode_tokens_s']:.1f}" if "decode_tokens_s" in x else "-"
            pre = f"{x['prefill_tokens_s']:.0f}" if "prefill_tokens_s" in x else "-"
            c = x["config"]
            L.append(f"| {x['model']} (layers {c['layers']}, ctx {c['ctx']}, batch {c['batch']}) | {x['device']} | "
                     f"{x['train_tokens_s']:.0f} | {pre} | {dec} | {x['first_step_s']:.2f} | "
                     f"{x['steady_step_s']:.2f} | {100 * mfu:.1f}% | {mem} |")
        L.append("")
        plot("models")
        L.append("| model | device | images/s | first step s | steady step s | peak device memory |")
        L.append("|---|---|---|---|---|---|")
        for x in rows:
            if "images_s" not in x:
                continue
            mem = f"{x['peak_mem_bytes'] / 2**20:.0f} MiB" if "peak_mem_bytes" in x else "-"
            L.append(f"| {x['model']} | {x['device']} | {x['images_s']:.0f} | {x['first_step_s']:.3f} | "
                     f"{x['steady_step_s']:.3f} | {mem} |")
        L.append("")
        L.append("### tpu / cpu eager ratios\n")
        L.append("| model | train | prefill | decode | steady step |")
        L.append("|---|---|---|---|---|")
        by = {(x["model"], x["device"]): x for x in rows}
        for (model, dev), x in by.items():
            if dev != "tpu" or (model, "cpu") not in by:
                continue
            c = by[(model, "cpu")]
            if "train_tokens_s" in x:
                L.append(f"| {model} | {ratio(x['train_tokens_s'], c['train_tokens_s'])} | "
                         f"{ratio(x['prefill_tokens_s'], c['prefill_tokens_s'])} | "
                         f"{ratio(x['decode_tokens_s'], c['decode_tokens_s'])} | "
                         f"{ratio(c['steady_step_s'], x['steady_step_s'])} |")
            else:
                L.append(f"| {model} | {ratio(x['images_s'], c['images_s'])} | - | - | "
                         f"{ratio(c['steady_step_s'], x['steady_step_s'])} |")
        L.append("")
        compiled_section(L, by)
        xla_section(L, r, by)
    if r.get("compile_skipped"):
        L.append(f"torch.compile (Inductor on CPU, backend \"tpu\"): skipped — {r['compile_skipped']}.\n")
    with open(path, "w") as f:
        f.write("\n".join(L))


def compiled_section(L, by):
    """torch.compile(backend="tpu") against tpu eager, from the same run."""
    pairs = [(m, x, by[(m, "tpu")]) for (m, d), x in by.items() if d == "tpu (compiled)" and (m, "tpu") in by]
    if not pairs:
        return
    L.append("### torch.compile(backend=\"tpu\") vs tpu eager\n")
    L.append("Rows \"tpu (compiled)\": `bench/models.py --compile`. Dynamo and AOTAutograd capture the "
             "forward and backward as ATen graphs, which run through the same IR nodes as eager "
             "execution in defer_and_fuse (no code generation, `torchtpu/compile.py`); the optimizer "
             "step stays eager. What compiling removes is the model's Python (module calls); the "
             "per-op dispatch of the ATen graph remains.\n")
    L.append("| model | compiled / eager steady step speed | first step s, compiled | first step s, eager |")
    L.append("|---|---|---|---|")
    for m, c, e in pairs:
        L.append(f"| {m} | {ratio(e['steady_step_s'], c['steady_step_s'])} | {c['first_step_s']:.2f} | "
                 f"{e['first_step_s']:.2f} |")
    L.append("")


def main():
    ap = argparse.ArgumentParser(description="torchtpu benchmark suite")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--skip-compile", action="store_true",
                    help="skip the torch.compile models (Inductor on CPU, backend \"tpu\")")
    ap.add_argument("--compile-timeout", type=int, default=240)
    ap.add_argument("--skip-xla", action="store_true", help="skip the PyTorch/XLA CPU rows")
    ap.add_argument("--xla-timeout", type=int, default=300)
    ap.add_argument("--from-json", metavar="PATH",
                    help="measure nothing: render the report and plots again from a run's raw numbers "
                         "(the build/benchmarks.json that every run writes)")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        write_report(args.out, saved["cmd"], saved, saved["started"], saved["elapsed_s"], saved["loads"])
        print(f"[bench] wrote {args.out} from {args.from_json}")
        return
    import torch
    cmd = ("python -m torchtpu.bench" + (" --skip-compile" if args.skip_compile else "")
           + (" --skip-xla" if args.skip_xla else ""))
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
        cmd = "TORCH_DEVICE_BACKEND_AUTOLOAD=0 " + cmd
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    loads = [load_avg()]
    t0 = time.perf_counter()
    cores = os.cpu_count() or 1
    r = {"torch": torch.__version__}
    # "scaling x2": 1 vs all threads; "pytorch/xla": only when scripts/setup_xla.sh made its venv
    steps = ["machine", "micro", "scaling x2", "models", "compile", "pytorch/xla"]
    for i, step in enumerate(steps):
        print(f"[bench] step {i + 1}/{len(steps)}: {step}", flush=True)
        if step == "machine":
            out, why = run_script("machine.py")
            if not out:
                raise SystemExit(f"bench/machine.py failed: {why}")
            r.update(out)
        elif step == "micro":
            out, why = run_script("micro.py")
            r.update(out or {})
        elif step == "scaling x2":
            # 1 and all threads alternate three times and each keeps its best rates, so a
            # burst of load from other processes does not land on one side only.
            best = {}
            for rep in range(3):
                for n in (1, cores):
                    out, why = run_script("micro.py", ["--scaling"], env={"TORCHTPU_NUM_THREADS": str(n)})
                    if not out:
                        continue
                    cur = best.setdefault(n, out["scaling"])
                    for key in ("gemm", "bw"):
                        for kept, new in zip(cur[key], out["scaling"][key]):
                            for dev in ("tpu", "cpu"):
                                kept[dev] = max(kept[dev], new[dev])
            if len(best) == 2:
                r["scaling"] = [best[1], best[cores]]
        elif step == "models":
            out, why = run_script("models.py")
            r.update(out or {})
        elif step == "compile":
            if args.skip_compile:
                r["compile_skipped"] = "--skip-compile given"
                continue
            out, why = run_script("models.py", ["--compile"], timeout=args.compile_timeout)
            if out:
                r.update(out)
            else:
                r["compile_skipped"] = f"`bench/models.py --compile` {why} (compilation on this machine)"
        elif step == "pytorch/xla":
            python = xla_python()
            if args.skip_xla or not python:
                r["xla_skipped"] = "--skip-xla given" if args.skip_xla else "its venv does not exist"
                continue
            out, why = run_script("xla_gpt.py", python=python, env={"PJRT_DEVICE": "CPU"},
                                  timeout=args.xla_timeout)
            if out:
                r.update(out)
            else:
                r["xla_skipped"] = f"`bench/xla_gpt.py` {why}"
    loads.append(load_avg())
    r.update(cmd=cmd, started=started, elapsed_s=time.perf_counter() - t0, loads=loads)
    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    with open(os.path.join(ROOT, "build", "benchmarks.json"), "w") as f:  # raw numbers, untracked
        json.dump(r, f, indent=1)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_report(args.out, cmd, r, started, r["elapsed_s"], loads)
    print(f"[bench] wrote {args.out}")


if __name__ == "__main__":
    main()
