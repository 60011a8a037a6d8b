"""Renders docs/validation.md from the JSON-lines results of `python -m torchtpu.validate`."""
from __future__ import annotations

import collections
import json
import os
import platform
import re
import subprocess
import time

from .runner import COMPILED, MODEL_TOL_FACTOR, MODES, RELU_NEAR_ZERO

SOURCES = ("transformers", "timm", "torchvision")
CAUSES = ("unsupported_op", "cpu_fallback", "mismatch", "exception", "timeout")
COMPILED_HEADING = '## torch.compile(backend="tpu")'


def _load(path):
    res = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            r.setdefault("source", {"hf": "transformers", "timm": "timm", "tv": "torchvision"}[r["id"].split("/")[0]])
            res[r["id"]] = r  # the last result for an id wins (reruns)
    return res


def git_build():
    """The checkout's commit (short hash, '-dirty' with uncommitted changes), or ''."""
    try:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        return subprocess.run(["git", "-C", root, "describe", "--always", "--dirty", "--abbrev=7"],
                              capture_output=True, text=True).stdout.strip()
    except Exception:
        return ""


def _versions():
    v = {}
    for mod in ("torch", "torchvision", "transformers", "timm"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:
            v[mod] = "not installed"
    v["python"] = platform.python_version()
    return v


def _pct(a, b):
    return f"{100.0 * a / b:.1f}%" if b else "-"


def _norm(msg):
    msg = re.sub(r"0x[0-9a-f]+", "0x…", msg or "")
    msg = re.sub(r"\d+", "N", msg)
    return msg[:160]


def _esc(s):
    return str(s).replace("|", "\\|").replace("\n", " ")[:300]


def _blocking_ops(m):
    """Ops that made one mode fail: the unsupported op, or the ops on the CPU fallback."""
    ops = set()
    fb = set(m.get("fallback_ops") or {}) if m.get("cause") in ("cpu_fallback", "unsupported_op") else set()
    op = m.get("op")
    if op and "complex dtypes" in op:
        op = "complex dtypes (tensors of complex dtype on tpu)"
    if m.get("cause") == "unsupported_op" and op:
        if "::" in op or not fb:
            ops.add(op)
        # else: a CPU kernel's message ("histogram_cpu" not implemented for 'Int') raised
        # inside the fallback of an op that is already in fallback_ops
    return ops | fb


def _compiled_section(w, path, order):
    """torch.compile(backend="tpu") on its sample (the results of `validate --compiled`):
    pass rates per source, the forward and the training step, failures listed whole.
    `order`: the enumeration in run order, whose two shards' run prefixes make the sample."""
    res = _load(path)
    if not res:
        return
    rs = list(res.values())
    prefix = []
    for shard in (order[0::2], order[1::2]):
        n = 0
        while n < len(shard) and shard[n] in res:
            n += 1
        prefix.append(n)
    mode = lambda r: r.get("modes", {}).get(COMPILED, {})  # noqa: E731
    train_mode = lambda r: ((r.get("train") or {}).get("modes") or {}).get(COMPILED)  # noqa: E731
    tested = [r for r in rs if mode(r).get("status") not in (None, "excluded")]
    no_ref = [r for r in rs if not mode(r)]  # the CPU reference failed: no tpu run
    no_dynamo = [r for r in rs if mode(r).get("status") == "excluded"]
    builds = collections.Counter(r.get("build") or "not recorded" for r in rs)
    w(COMPILED_HEADING)
    w("")
    if order and len(rs) >= len(order):
        run = (f"on all {len(order):,} enumerated models: `python -m torchtpu.validate --compiled "
               "--shard 0/2` and `--shard 1/2` (results in `build/validation/compiled.jsonl`). ")
    else:
        run = (f"on {len(rs):,} of the {len(order):,} enumerated models, a uniform sample: `python -m "
               f"torchtpu.validate --compiled --shard 0/2 --limit {prefix[0]}` and `--shard 1/2 --limit "
               f"{prefix[1]}` (each shard's first models in its stable shuffle; results in "
               "`build/validation/compiled.jsonl`). ")
    w(f"The same models, inputs and comparison with `torch.compile(model, backend=\"tpu\")` "
      f"(Dynamo and AOTAutograd; the graphs run in defer_and_fuse), {run}The compiled mode passes only with every output "
      "(and, where run, the loss and every gradient) within tolerance and no op on the CPU "
      "fallback; the float64 and tie-order re-checks apply as in eager mode, and a result that "
      "differs from CPU eager passes where it matches the same model compiled on CPU "
      "(`torch.compile(backend=\"aot_eager\")`): torch.compile itself changed the result "
      "there, on CPU as on tpu. A model is "
      "excluded when its CPU reference fails, when `torch.compile` with PyTorch's own "
      "`aot_eager` backend fails on CPU too (a limit of torch.compile, not of the tpu), or "
      "when its eval forward draws random numbers (the eager modes replay the CPU's draws "
      "through a TorchFunctionMode, torchtpu/_validate/rng.py). Builds: "
      + ", ".join(f"{b} ({n})" for b, n in builds.most_common()) + ".")
    w("")
    w("| source | run | excluded (CPU reference) | excluded (compiled mode, reasons below) | tested | compiled pass |")
    w("|---|---:|---:|---:|---:|---:|")
    for s in list(SOURCES) + ["total"]:
        pick = (lambda r: True) if s == "total" else (lambda r, s=s: r["source"] == s)  # noqa: E731
        t = [r for r in tested if pick(r)]
        p = sum(mode(r).get("status") == "pass" for r in t)
        name = f"**{s}**" if s == "total" else s
        w(f"| {name} | {sum(pick(r) for r in rs)} | {sum(pick(r) for r in no_ref)} | "
          f"{sum(pick(r) for r in no_dynamo)} | {len(t)} | {p} ({_pct(p, len(t))}) |")
    w("")
    tm = [train_mode(r) for r in tested if train_mode(r)]
    if tm:
        p = sum(m.get("status") == "pass" for m in tm)
        t64 = sum((m.get("note") or "").startswith("float64 re-check") for m in tm)
        excl = sum(m.get("status") == "excluded" for m in tm)
        w(f"Training step, compiled, on {len(tm)} of them: {p} pass ({_pct(p, len(tm))})"
          + (f", {t64} after the float64 re-check" if t64 else "")
          + (f", {excl} excluded (the compiled backward fails on CPU too)" if excl else "") + ".")
        w("")
    noted = collections.defaultdict(list)
    for r in tested:
        for what, m in (("", mode(r)), (" (train step)", train_mode(r))):
            if m and m.get("status") == "pass" and m.get("note"):
                noted[m["note"].split(":")[0]].append(r["id"] + what)
    if noted:
        w("Passing after a re-check: " + "; ".join(f"{k} ({len(v)}): {', '.join(sorted(v))}"
                                                   for k, v in sorted(noted.items())) + ".")
        w("")
    failing = []
    for r in tested:
        for what, m in (("forward", mode(r)), ("train step", train_mode(r))):
            if m and m.get("status") not in ("pass", "excluded"):
                failing.append((r["id"], what, m))
    if failing:
        w("| model | run | cause | detail |")
        w("|---|---|---|---|")
        for mid, what, m in sorted(failing, key=lambda x: x[:2]):
            detail = m.get("detail") or ""
            if m.get("fallback_ops"):
                detail += " (CPU fallback: " + ", ".join(sorted(m["fallback_ops"])) + ")"
            w(f"| {mid} | {what} | {m.get('cause')} | {_esc(detail)[:240]} |")
        w("")
    if no_dynamo:
        groups = collections.Counter(_norm(mode(r).get("reason", ""))[:140] for r in no_dynamo)
        w("Excluded from the compiled mode: torch.compile fails on CPU too, or the forward's random "
          "draws are replayed by a TorchFunctionMode the compiled graph would not see (grouped, "
          "numbers as N):")
        w("")
        w("| reason | models |")
        w("|---|---:|")
        for reason, n in groups.most_common(15):
            w(f"| {_esc(reason)} | {n} |")
        w("")


def _splice_compiled(out_path, compiled_path, order):
    """Replaces the compiled section of an existing report (up to the next "## " heading),
    keeping every eager section as it was: for a compiled run on a checkout whose eager
    results file is absent (results live under build/, which a fresh clone lacks)."""
    with open(out_path) as f:
        lines = f.read().split("\n")
    new = []
    _compiled_section(new.append, compiled_path, order)
    if not new:
        return
    if COMPILED_HEADING in lines:
        start = lines.index(COMPILED_HEADING)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    else:  # no compiled section yet: it goes before the failures, as render() places it
        start = end = next((i for i, l in enumerate(lines) if l == "## Failures by cause"), len(lines))
    with open(out_path, "w") as f:
        f.write("\n".join(lines[:start] + new + lines[end:]))


def _enumeration():
    """(run order, models enumerated per source); empty where the model zoos cannot load."""
    try:
        from . import models
        from ..validate import run_order
        order = run_order(models.enumerate_models())
        return order, collections.Counter(models.source_of(i) for i in order)
    except Exception:
        return [], {}


def render(results_path, out_path, enumerated=None, compiled_path=None):
    """Writes the report from the eager results (and the compiled ones). Without eager
    results but with an existing report, only its compiled section is re-rendered."""
    res = _load(results_path) if os.path.exists(results_path) else {}
    order = []
    if not res and compiled_path and os.path.exists(compiled_path) and os.path.exists(out_path):
        _splice_compiled(out_path, compiled_path, _enumeration()[0])
        return
    if enumerated is None:
        order, enumerated = _enumeration()
    rs = list(res.values())
    by_src = collections.defaultdict(list)
    for r in rs:
        by_src[r["source"]].append(r)
    tested = [r for r in rs if r["status"] != "excluded"]
    excluded = [r for r in rs if r["status"] == "excluded"]
    dates = sorted({r.get("date", "") for r in rs if r.get("date")})
    L = []
    w = L.append
    w("# Validation: real model architectures on tpu")
    w("")
    w("Generated by `python -m torchtpu.validate --report` from "
      f"`{os.path.relpath(results_path, os.path.dirname(os.path.abspath(out_path)) + '/..')}`. "
      "Every model is built tiny with random weights (nothing downloaded), run on PyTorch "
      "CPU as the reference, then with the same weights and inputs on `tpu` in each eager "
      "mode; every output tensor is compared with the per-dtype tolerance table of "
      f"`torchtpu/_tolerances.py` scaled by {MODEL_TOL_FACTOR:g} for whole models. **A mode passes "
      "only when all outputs match and no op ran through the CPU fallback.** A model whose "
      "CPU reference cannot be built or run is *excluded* (not a tpu failure).")
    w("")
    w(f"Run dates: {', '.join(dates) or '-'}; rendered {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
    w("Versions: " + ", ".join(f"{k} {v}" for k, v in _versions().items()) + ".")
    builds = collections.Counter(r.get("build") or "not recorded" for r in rs)
    w("torchtpu builds (git) of the results shown: " + ", ".join(
        f"{b} ({n} model{'s' if n != 1 else ''})" for b, n in builds.most_common()) + ".")
    w("")
    # ---------------------------------------------------------------- coverage
    w("Reproduce: `python -m torchtpu.validate --shard 0/2` and `--shard 1/2` in two "
      "processes (one worker subprocess each, one thread, the default --timeout of 360 s per "
      "model), then "
      "`python -m torchtpu.validate --report`. `--sample ci` is the ~50-model CI sample "
      "(tests/test_validation_sample.py).")
    w("")
    w("## Coverage")
    w("")
    w("| source | enumerated | run | fraction run | excluded | tested |")
    w("|---|---:|---:|---:|---:|---:|")
    tot_e = tot_r = tot_x = tot_t = 0
    for s in SOURCES:
        e = enumerated.get(s, 0)
        run = len(by_src[s])
        x = sum(r["status"] == "excluded" for r in by_src[s])
        w(f"| {s} | {e} | {run} | {_pct(run, e)} | {x} | {run - x} |")
        tot_e, tot_r, tot_x, tot_t = tot_e + e, tot_r + run, tot_x + x, tot_t + run - x
    w(f"| **total** | **{tot_e}** | **{tot_r}** | **{_pct(tot_r, tot_e)}** | **{tot_x}** | **{tot_t}** |")
    w("")
    w("*enumerated*: transformers task-head classes in the auto mappings, `timm.list_models()`, "
      "torchvision classification/segmentation/detection/video/optical-flow models. "
      "*run*: models with a result in this report (a run that stops early leaves the rest "
      "unreached; the run order is a stable pseudo-random shuffle, so a partial run is a "
      "uniform sample). *tested*: run and not excluded; pass rates below are of tested models.")
    w("")
    # ---------------------------------------------------------------- pass rates
    w("## Pass rate")
    w("")
    w("| source | tested | " + " | ".join(f"{m} pass" for m in MODES) + " | all modes pass (and the train step, where run) |")
    w("|---|---:|" + "---:|" * (len(MODES) + 1))
    for s in list(SOURCES) + ["total"]:
        t = [r for r in (tested if s == "total" else [r for r in by_src[s] if r["status"] != "excluded"])]
        cells = []
        for m in MODES:
            p = sum(r.get("modes", {}).get(m, {}).get("status") == "pass" for r in t)
            cells.append(f"{p} ({_pct(p, len(t))})")
        allp = sum(r["status"] == "pass" for r in t)
        name = f"**{s}**" if s == "total" else s
        w(f"| {name} | {len(t)} | " + " | ".join(cells) + f" | {allp} ({_pct(allp, len(t))}) |")
    w("")
    ill = [r["id"] for r in tested if any((m.get("note") or "").startswith("ill-conditioned")
                                           for m in r.get("modes", {}).values())]
    if ill:
        sized = sorted(r["id"] for r in tested if any((m.get("note") or "").startswith("ill-conditioned sizes")
                                                      for m in r.get("modes", {}).values()))
        w(f"{len(ill)} model(s) pass only after a float64 re-check: their float32 outputs differ "
          "from CPU beyond the tolerance, but the CPU's own float32 result (the larger error of "
          "its forward at one thread and at every core, which split long sums differently) is as "
          "far from a float64 CPU reference as the tpu's (random-init activations that explode): "
          + ", ".join(sorted(ill)[:20]) + ("…" if len(ill) > 20 else "") + "."
          + (f" Of these, {len(sized)} ({', '.join(sized)}) have outputs whose size the model "
             "decides by comparisons (keypoints over a threshold, matches): the CPU's own "
             "float32 size already differs from the float64 one, and the tpu's differs from "
             "float64's by no more than the CPU's." if sized else ""))
        w("")
    ties = sorted(r["id"] for r in tested if any((m.get("note") or "").startswith("ties:")
                                                 for m in r.get("modes", {}).values()))
    if ties:
        w(f"{len(ties)} model(s) pass only after a tie-order re-check: their random init makes "
          "scores exactly equal (a zero-initialized MoE router, detection scores that all round "
          "to one value), where CPU's topk and unstable sort order the ties by their selection "
          "algorithms and the tpu in index order, which PyTorch leaves unspecified; every output "
          "matches the CPU forward with topk/sort ties in index order: " + ", ".join(ties) + ".")
        w("")
    trained = [r for r in tested if r.get("train") and r["train"].get("modes")]
    if trained:
        w(f"Training step (forward + backward, loss and every gradient vs CPU; eval-mode "
          f"numerics) on a sample of {len(trained)} tested models:")
        w("")
        for m in MODES:
            p = sum(r["train"]["modes"].get(m, {}).get("status") == "pass" for r in trained)
            w(f"- {m}: {p}/{len(trained)} pass ({_pct(p, len(trained))})")
        w("")
        t64 = [r["id"] for r in trained if any((m.get("note") or "").startswith("float64 re-check")
                                               for m in r["train"]["modes"].values())]
        if t64:
            w(f"{len(t64)} of them pass the training step only after a float64 re-check (as for "
              "outputs above): the step is run again in float64 on CPU, and a loss or gradient "
              "mismatch is accepted only when, for the loss and every gradient, the tpu's float32 "
              "error vs float64 is at most 2x the CPU float32's own error (the larger of its step "
              "at the validation's one thread and at every core, which split long sums differently) "
              "plus the comparison's absolute tolerance (scaled by the gradient's largest magnitude). "
              "Where that fails, the tpu is measured against the float64 step that takes the tpu's "
              f"own decision at relu/leaky_relu inputs within {RELU_NEAR_ZERO:g} of their tensor's largest |input| of zero "
              "(an input at -2.4e-8 that rounds to +7.8e-9 sends the gradient down another path); "
              "the CPU stays measured against the plain float64 step. Such differences "
              "come from a ReLU whose input rounds to either side of zero or a long sum in "
              "another order, where the CPU's float32 is no closer to the exact step; a tpu "
              "gradient further from float64 than that still fails (tests/test_validation_runner.py): "
              + ", ".join(sorted(t64)[:20]) + ("…" if len(t64) > 20 else "") + ".")
            w("")
    rnd = sorted(r["id"] for r in tested if r.get("random_replayed"))
    if rnd:
        w(f"{len(rnd)} model(s) draw random numbers in their eval-mode forward (VITS's noise, "
          "ViLT's patch sampling, Informer's sampled keys, ...). For these the CPU reference "
          "records every random call of the forward (torch.randn, rand_like, multinomial, "
          "Tensor.normal_, ...; torchtpu/_validate/rng.py) and the tpu runs replay the recorded "
          "tensors, moved to the device, instead of drawing; a call that differs from the record "
          "fails the run, and a model whose CPU output a replay under another seed does not "
          "reproduce bit for bit stays excluded. So what is validated there is everything the "
          "forward computes from its random numbers, not the device's random number generator "
          "(tests/test_ops_random.py covers that): " + ", ".join(rnd) + ".")
        w("")
    if compiled_path and os.path.exists(compiled_path):
        _compiled_section(w, compiled_path, order)
    # ---------------------------------------------------------------- causes
    w("## Failures by cause")
    w("")
    w("A model counts once per mode, under the cause of its first failing check "
      "(an exception, else a mismatch, else CPU fallback).")
    w("")
    w("| cause | " + " | ".join(MODES) + " |")
    w("|---|" + "---:|" * len(MODES))
    for c in CAUSES:
        cells = [str(sum(r.get("modes", {}).get(m, {}).get("cause") == c for r in tested)) for m in MODES]
        w(f"| {c} | " + " | ".join(cells) + " |")
    w("")
    # ---------------------------------------------------------------- ops
    op_models = collections.defaultdict(set)
    only_op = collections.Counter()
    for r in tested:
        if r["status"] == "pass":
            continue
        blocking = set()
        other = False
        for m in list(r.get("modes", {}).values()) + list(((r.get("train") or {}).get("modes") or {}).values()):
            if m.get("status") == "pass":
                continue
            ops = _blocking_ops(m)
            if not ops:
                other = True
            blocking |= ops
        for op in blocking:
            op_models[op].add(r["id"])
        if len(blocking) == 1 and not other:
            only_op[next(iter(blocking))] += 1
    w("## Ops whose support would fix the most models")
    w("")
    if op_models:
        w("*blocked*: failing models that use the op on the CPU fallback or fail with it "
          "unsupported; *fixed alone*: models for which it is the only problem.")
        w("")
        w("| op | models blocked | fixed alone |")
        w("|---|---:|---:|")
        for op, ms in sorted(op_models.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:30]:
            w(f"| `{_esc(op)}` | {len(ms)} | {only_op.get(op, 0)} |")
    else:
        w("No failing model used the CPU fallback or an unsupported op.")
    w("")
    # ---------------------------------------------------------------- exceptions, mismatches
    exc = collections.defaultdict(list)
    for r in tested:
        for mode, m in r.get("modes", {}).items():
            if m.get("cause") in ("exception", "unsupported_op", "timeout"):
                exc[(m["cause"], _norm(m.get("detail")))].append(f"{r['id']} ({mode})")
    if exc:
        w("## Exceptions, grouped by message")
        w("")
        w("| cause | message (numbers as N) | count | examples |")
        w("|---|---|---:|---|")
        for (c, msg), ids in sorted(exc.items(), key=lambda kv: -len(kv[1]))[:40]:
            w(f"| {c} | {_esc(msg)} | {len(ids)} | {_esc(', '.join(ids[:3]))} |")
        w("")
    mism = [(r["id"], mode, m) for r in tested for mode, m in r.get("modes", {}).items()
            if m.get("cause") == "mismatch"]
    mism += [(r["id"], mode + " (train)", m) for r in trained for mode, m in r["train"]["modes"].items()
             if m.get("cause") == "mismatch"]
    if mism:
        w("## Numerical mismatches")
        w("")
        w("| model | mode | output | detail |")
        w("|---|---|---|---|")
        for mid, mode, m in sorted(mism, key=lambda x: x[0]):
            w(f"| {mid} | {mode} | `{_esc(m.get('output'))}` | {_esc(m.get('detail'))} |")
        w("")
    # ---------------------------------------------------------------- failing models
    failing = [r for r in tested if r["status"] != "pass"]
    if failing:
        w("## Failing models")
        w("")
        w("| model | " + " | ".join(MODES) + " | train |")
        w("|---|" + "---|" * (len(MODES) + 1))
        for r in sorted(failing, key=lambda r: r["id"]):
            cells = []
            for m in MODES:
                mm = r.get("modes", {}).get(m, {})
                cells.append("pass" if mm.get("status") == "pass" else
                             f"{mm.get('cause')}: {_esc(mm.get('detail'))[:120]}" if mm else "-")
            t = (r.get("train") or {}).get("modes") or {}
            tc = ", ".join(f"{m}: {v.get('status') if v.get('status') == 'pass' else v.get('cause')}"
                           for m, v in t.items()) or "-"
            w(f"| {r['id']} | " + " | ".join(cells) + f" | {tc} |")
        w("")
    # ---------------------------------------------------------------- excluded
    w("## Excluded models")
    w("")
    w("Not tpu failures: the tiny model could not be built, its CPU reference failed, or it "
      "is too large for a CPU reference after shrinking. Grouped reasons first, then the list.")
    w("")
    groups = collections.Counter(_norm(r.get("reason", ""))[:90] for r in excluded)
    w("| reason (numbers as N) | models |")
    w("|---|---:|")
    for reason, n in groups.most_common(25):
        w(f"| {_esc(reason)} | {n} |")
    w("")
    w("<details><summary>All excluded models</summary>")
    w("")
    w("| model | reason |")
    w("|---|---|")
    for r in sorted(excluded, key=lambda r: r["id"]):
        w(f"| {r['id']} | {_esc(r.get('reason'))} |")
    w("")
    w("</details>")
    w("")
    with open(out_path, "w") as f:
        f.write("\n".join(L))
