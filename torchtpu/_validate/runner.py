"""Runs one model: CPU reference, then the same weights and inputs on tpu per eager mode.

Result (a JSON-able dict):
  {"id", "source", "status": "pass" | "fail" | "excluded", "reason" (excluded),
   "params", "modes": {mode: {"status", "cause", "detail", "fallback_ops", "max_err",
   "output", "seconds"}}, "train": {...} | None}
A mode passes only when every output matches within tolerance AND no op ran through the
CPU fallback. Causes: unsupported_op, cpu_fallback, mismatch, exception, timeout.

Besides the eager modes, the mode "compiled" runs `torch.compile(model, backend="tpu")`
(in defer_and_fuse, the default eager mode, which runs the compiled graphs). Where it
raises, the same model is compiled on CPU with PyTorch's own `aot_eager` backend (Dynamo
and AOTAutograd, no device): if that raises too, the mode is "excluded" (a limit of
torch.compile for this model, not of the tpu), with the CPU's error as its reason. A
compiled result that differs from CPU eager passes only where it matches that CPU-compiled
result (torch.compile itself changed it), with a note."""
from __future__ import annotations

import contextlib
import copy
import gc
import math
import os
import re
import time
import traceback

import torch

from .. import _tolerances
from . import models as M
from . import rng as RNG

MODES = ("strict", "defer_and_fuse")
COMPILED = "compiled"
# Whole-model outputs pass through tens of ops, each allowed the per-op tolerance of
# torchtpu/_tolerances.py; the model-level comparison allows this many per-op steps.
MODEL_TOL_FACTOR = 10.0
# The training step's float64 re-check runs only while the model has used less than this:
# it costs about one more CPU step, so it leaves 80 s of the per-model timeout (the pool
# passes --timeout as TORCHTPU_VALIDATE_TIMEOUT) for it. Sam3Tracker, the slowest model,
# reaches the re-check after about 175 s and ends at about 265 s.
RECHECK_BUDGET_S = float(os.environ.get("TORCHTPU_VALIDATE_TIMEOUT", "360")) - 80
# A ReLU input within this fraction of its tensor's largest |input| of zero (about 8 float32
# ulps of it) is a decision float32 rounding can take either way (_step64 with the tpu's
# decisions).
RELU_NEAR_ZERO = 1e-6


def tol(dtype):
    t = _tolerances.tol(dtype)
    return t["atol"] * MODEL_TOL_FACTOR, t["rtol"] * MODEL_TOL_FACTOR


# ----------------------------------------------------------------------------- trees

def flatten(out, prefix="out"):
    """[(path, tensor)] of every tensor in a (nested) ModelOutput/dict/tuple/list."""
    items = []
    if isinstance(out, torch.Tensor):
        items.append((prefix, out))
    elif isinstance(out, dict) or (hasattr(out, "keys") and hasattr(out, "__getitem__")):
        for k in list(out.keys()):
            items += flatten(out[k], f"{prefix}.{k}" if prefix != "out" else str(k))
    elif isinstance(out, (list, tuple)):
        for i, v in enumerate(out):
            items += flatten(v, f"{prefix}[{i}]")
    elif hasattr(out, "to_tuple"):
        items += flatten(out.to_tuple(), prefix)
    return items


def tree_map(fn, x):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, dict):
        return {k: tree_map(fn, v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(tree_map(fn, v) for v in x)
    return x


def call(model, cand, rng_log=None):
    """model(*args, **kwargs) of an input candidate; with rng_log (a model whose forward
    draws random numbers), its random calls answered from the CPU reference's record."""
    _, args, kwargs = cand
    if rng_log is not None:
        return RNG.replay(lambda: model(*args, **kwargs), rng_log)
    return model(*args, **kwargs)


# ----------------------------------------------------------------------------- comparison

def compare(actual, expected, scale_by_max=()):
    """(ok, worst) where worst = {output, max_err, ratio, dtype} of the worst output.

    Paths starting with a prefix in `scale_by_max` (gradients) get the absolute tolerance
    scaled by the tensor's largest magnitude: a gradient is a sum over the batch and
    sequence whose order the backward kernels may change, so elements near zero carry the
    rounding error of the largest terms."""
    a_items = dict(flatten(actual))
    worst = {"output": None, "max_err": 0.0, "ratio": 0.0}
    ok = True
    for path, e in flatten(expected):
        a = a_items.get(path)
        if a is None:
            return False, {"output": path, "max_err": None, "ratio": math.inf, "why": "missing on tpu"}
        a = a.detach().cpu()
        e = e.detach()
        if a.shape != e.shape or a.dtype != e.dtype:
            return False, {"output": path, "max_err": None, "ratio": math.inf,
                           "why": f"tpu {a.dtype}{list(a.shape)} vs cpu {e.dtype}{list(e.shape)}",
                           "sized": a.dtype == e.dtype and a.dim() == e.dim()}
        if e.is_complex():
            a, e = torch.view_as_real(a), torch.view_as_real(e)
        if e.is_floating_point():
            atol, rtol = tol(e.dtype)
            if scale_by_max and path.startswith(scale_by_max) and e.numel():
                emax = float(e.double().abs().nan_to_num(0, 0, 0).max())
                atol = atol * max(1.0, emax)
            af, ef = a.double(), e.double()
            nan_mismatch = bool((af.isnan() != ef.isnan()).any())
            fin = ef.isfinite() & af.isfinite()
            inf_mismatch = bool(((~ef.isfinite()) & ~ef.isnan() & (af != ef)).any())
            err = (af - ef).abs().where(fin, torch.zeros((), dtype=torch.float64))
            bound = atol + rtol * ef.abs().where(fin, torch.zeros((), dtype=torch.float64))
            ratio = float((err / bound).max()) if err.numel() else 0.0
            max_err = float(err.max()) if err.numel() else 0.0
            if nan_mismatch or inf_mismatch:
                ratio = math.inf
        else:
            diff = (a != e)
            max_err = float(diff.sum())
            ratio = math.inf if max_err else 0.0
        if ratio > worst["ratio"] or worst["output"] is None:
            worst = {"output": path, "max_err": max_err, "ratio": ratio, "dtype": str(e.dtype)}
            if e.is_floating_point() and e.numel():
                worst["cpu_max"] = float(e.double().abs().nan_to_num(0, 0, 0).max())
        if ratio > 1.0:
            ok = False
    return ok, worst


# ----------------------------------------------------------------------------- classification

_OP_PATTERNS = [
    re.compile(r"Could not run '((?:aten|torchvision)::[\w.]+)' with arguments from the '(?:PrivateUse1|tpu|CPU)' backend"),
    re.compile(r"\"?(\w+)\"? not implemented for '(\w+)'"),
    re.compile(r"error in ([\w.:]+):"),
    re.compile(r"(aten::[\w.]+)"),
]


def classify_exception(e):
    msg = f"{type(e).__name__}: {e}"
    first = msg.strip().splitlines()[0][:300] if msg.strip() else type(e).__name__
    m = _OP_PATTERNS[0].search(msg)
    if m:
        return "unsupported_op", m.group(1), first
    m = _OP_PATTERNS[1].search(msg)
    if m and "tpu" in "".join(traceback.format_exception(e)).lower():
        return "unsupported_op", f"{m.group(1)} ({m.group(2)})", first
    if "not supported on tpu" in msg or "is not supported by the tpu" in msg:
        m = _OP_PATTERNS[2].search(msg)
        return "unsupported_op", (m.group(1) if m else first[:80]), first
    m = re.search(r"(\w+): unsupported (?:output |input )?dtype", msg)
    if m:
        return "unsupported_op", f"{m.group(1)} (dtype, e.g. complex)", first
    m = _OP_PATTERNS[2].search(msg)
    return "exception", (m.group(1) if m else None), first


def _is_random(model, cand, expected):
    try:
        torch.manual_seed(1)
        with torch.no_grad():
            again = call(model, cand)
    except Exception:
        return False
    a, e = dict(flatten(again)), flatten(expected)
    for path, t in e:
        u = a.get(path)
        if u is None or u.shape != t.shape or not torch.equal(u.nan_to_num(0), t.nan_to_num(0)):
            return True
    return False


def _device_alive():
    try:
        return float(torch.ones(4, device="tpu").sum().item()) == 4.0
    except Exception:
        return False


# ----------------------------------------------------------------------------- one model

def _fallbacks():
    import torchtpu
    return dict(torchtpu.fallback_report())


def _loss_of(out):
    loss = getattr(out, "loss", None) if not isinstance(out, (tuple, list, torch.Tensor)) else None
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    terms = [t.float().sum() for _, t in flatten(out) if t.is_floating_point() and t.requires_grad]
    if not terms:
        return None
    return torch.stack(terms).sum()


def _on_tpu(cand):
    """An input candidate (kind, args, kwargs) with its tensors moved to tpu."""
    return (cand[0], tree_map(lambda t: t.to("tpu"), cand[1]), tree_map(lambda t: t.to("tpu"), cand[2]))


def run_on_tpu(model, cand, expected, mode, train_ref=None, rng_log=None):
    """Runs the model on tpu in `mode`; returns a mode result dict."""
    import torchtpu
    res = {"status": "fail", "cause": None, "detail": None, "fallback_ops": {}}
    t0 = time.time()
    dev_model = None
    prev_mode = torchtpu.get_eager_mode()
    if mode == COMPILED and rng_log is not None:
        res.update(status="excluded", reason="its forward's random draws are replayed by a TorchFunctionMode "
                                             "(rng.py), which the compiled graph would not see")
        return res
    try:
        torchtpu.set_eager_mode("defer_and_fuse" if mode == COMPILED else mode)
        torchtpu.reset_fallback_report()
        dev_model = copy.deepcopy(model).to("tpu")
        broken = broken_ties(model, dev_model)
        if broken:
            res["ties_broken"] = broken
        dev_cand = _on_tpu(cand)
        run_model = dev_model
        if mode == COMPILED:
            torch._dynamo.reset()
            run_model = torch.compile(dev_model, backend="tpu")
        if train_ref is None:
            with torch.no_grad():
                out = call(run_model, dev_cand, rng_log)
            ok, worst = compare(out, expected)
            if not ok and mode == COMPILED and not worst.get("why"):
                ok = _matches_cpu_compiled(res, model, cand, out, worst, train=False)
            torch.tpu.synchronize()
            if not ok and (not worst.get("why") or worst.get("sized")):  # (the float64 re-check's)
                res["_tpu_out"] = {p: t.detach().cpu() for p, t in flatten(out)}
        else:
            out = call(run_model, dev_cand, rng_log)
            loss = _loss_of(out)
            loss.backward()
            grads = {n: p.grad for n, p in dev_model.named_parameters() if p.grad is not None}
            torch.tpu.synchronize()
            ok, worst = compare({"loss": loss.detach(), "grad": grads}, train_ref, scale_by_max=("grad.",))
            if not ok and mode == COMPILED and not worst.get("why"):
                ok = _matches_cpu_compiled(res, model, cand, {"loss": loss.detach(), "grad": grads}, worst, train=True)
            if not ok and not worst.get("why"):
                res["_tpu_out"] = {p: t.detach().cpu() for p, t in flatten({"loss": loss.detach(), "grad": grads})}
        res["fallback_ops"] = _fallbacks()
        res["max_err"] = worst.get("max_err")
        res["ratio"] = worst.get("ratio") if worst.get("ratio") != math.inf else "inf"
        res["output"] = worst.get("output")
        if not ok:
            res["cause"] = "mismatch"
            why = worst.get("why") or (f"max abs err {worst.get('max_err'):.3g} ({worst.get('ratio'):.3g}x "
                                       f"tolerance, {worst.get('dtype')}, largest |cpu| {worst.get('cpu_max', 0):.3g})")
            if res.get("ties_broken") and train_ref is not None:
                why += f"; Module.to('tpu') untied shared parameters {res['ties_broken'][0]}"
            res["detail"] = f"{worst.get('output')}: {why}"
        elif res["fallback_ops"]:
            res["cause"] = "cpu_fallback"
            res["detail"] = ", ".join(sorted(res["fallback_ops"]))
        else:
            res["status"] = "pass"
    except Exception as e:
        try:
            res["fallback_ops"] = _fallbacks()
        except Exception:
            pass
        cause, op, msg = classify_exception(e)
        res["cause"], res["op"], res["detail"] = cause, op, msg
        res["where"] = _where(e)
        if mode == COMPILED:
            res["detail"] += _cause_of(e)
            cpu_error = _cpu_compiled(model, cand, train_ref is not None)[0]
            if cpu_error:
                res.update(status="excluded", cause=None, reason=f"torch.compile fails on CPU too (aot_eager): {cpu_error}")
    finally:
        try:
            torchtpu.set_eager_mode(prev_mode)
        except Exception:
            pass
        del dev_model
        if mode == COMPILED:
            torch._dynamo.reset()
    res["seconds"] = round(time.time() - t0, 2)
    return res


def _cause_of(e):
    """' (from ...)': the error Dynamo met while tracing, which its own error names only in
    a later line ("RuntimeError when making fake tensor call ... Explanation: Dynamo failed
    to run FX node with fake tensors: call_function ...: got RuntimeError('...')"), or the
    chained cause; '' when there is neither."""
    m = re.search(r": got (\w+\(.*\))\s*$", str(e), re.M)
    if m:
        return f" (from {m.group(1)[:240]})"
    c = e.__cause__
    if c is None or not str(c).strip():
        return ""
    return f" (from {type(c).__name__}: {str(c).strip().splitlines()[0][:200]})"


def _cpu_compiled(model, cand, train):
    """torch.compile(model, backend="aot_eager") on CPU (Dynamo and AOTAutograd, PyTorch's
    own ops): (None, its forward (_cpu_forward), or with `train` its step (_cpu_step)), or
    (the first line of its error, None)."""
    torch._dynamo.reset()
    try:
        run = _cpu_step if train else _cpu_forward
        return None, run(model, cand, compile_backend="aot_eager")
    except Exception as e:
        return classify_exception(e)[2] + _cause_of(e), None
    finally:
        torch._dynamo.reset()


def _matches_cpu_compiled(res, model, cand, tpu_result, worst, train):
    """A compiled mismatch against CPU eager is re-judged against the same model compiled
    on CPU (aot_eager): where torch.compile itself changes the result (a model's branch on
    `torch.compiler.is_compiling()`, a decomposition that rounds otherwise), the tpu's
    compiled result is right when it matches CPU's compiled one within the tolerance. Sets
    the mode's note and returns True then."""
    _, ref = _cpu_compiled(model, cand, train)
    if ref is None:
        return False
    ok, w = compare(tpu_result, ref, **({"scale_by_max": ("grad.",)} if train else {}))
    if ok:
        res["note"] = (f"compiled on CPU too: {worst.get('output')} differs from CPU eager by "
                       f"{worst.get('max_err'):.3g} ({worst.get('ratio'):.3g}x tolerance), and torch.compile "
                       f"(aot_eager) on CPU gives the same result (the tpu's max error vs it "
                       f"{w.get('max_err'):.3g})")
    return ok


def _tie_groups(model):
    groups = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(n)
    return [g for g in groups.values() if len(g) > 1]


def broken_ties(cpu_model, dev_model):
    """Groups of parameter names shared on CPU but no longer shared after .to('tpu')."""
    params = dict(dev_model.named_parameters(remove_duplicate=False))
    out = []
    for g in _tie_groups(cpu_model):
        if len({id(params.get(n)) for n in g}) > 1:
            out.append(g)
    return out


def _where(e):
    tb = traceback.extract_tb(e.__traceback__)
    for fr in reversed(tb):
        if "/torch/" not in fr.filename and "/_validate/" not in fr.filename:
            return f"{fr.filename.split('site-packages/')[-1]}:{fr.lineno} in {fr.name}"
    return None


def run_model(model_id, modes=MODES, train=False):
    """Builds, runs and compares one model; restores the fallback policy it changes."""
    import torchtpu
    prev = torchtpu.get_fallback()
    torchtpu.set_fallback("allow")
    try:
        return _run_model(model_id, modes, train)
    finally:
        torchtpu.set_fallback(prev)


def _run_model(model_id, modes, train):
    result = {"id": model_id, "source": M.source_of(model_id), "status": "excluded",
              "modes": {}, "train": None}
    t0 = time.time()
    reasons = []
    rng_log = None
    for variant in range(M.variants(model_id)):
        try:
            built = M.build(model_id, variant)
        except M.SameAsBefore:
            continue
        except M.Excluded as e:
            reasons.append(str(e))
            continue
        except Exception as e:
            reasons.append(f"build failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        model = built.model
        # The tpu runs start from the model as built: a forward may cache tensors in plain
        # attributes (Mimi's codebooks cache `_embed`), which Module.to() does not move,
        # so a copy taken after the CPU run would feed CPU tensors to tpu ops.
        try:
            pristine = copy.deepcopy(model)
        except Exception:
            pristine = model
        # CPU reference: the first candidate input set that runs
        expected, cand, errs = None, None, []
        for c in built.candidates:
            try:
                torch.manual_seed(0)
                with torch.no_grad():
                    expected = call(model, c)
                if not flatten(expected):
                    errs.append((c[0], "forward returned no tensors"))
                    expected = None
                    continue
                cand = c
                break
            except Exception as e:
                errs.append((c[0], f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"))
        if cand is not None:
            if _is_random(model, cand, expected):
                rng_log = _replayable(model, cand)
                if rng_log is None:
                    result["reason"] = ("forward draws random numbers in eval mode (its CPU output "
                                        "changes with the seed) that the harness cannot replay "
                                        "(torchtpu/_validate/rng.py), so CPU and tpu cannot be compared")
                    return result
                # the reference is the recorded run (seed 0, as the first one)
                torch.manual_seed(0)
                with torch.no_grad():
                    expected = call(model, cand, rng_log)
                result["random_replayed"] = len(rng_log)
            break
        # the last input set's error, not counting generic last resorts (kind "last": image
        # pairs, video clips) whose shape errors would hide why the model's own inputs fail
        main = [m for k, m in errs if k != "last"] or [m for _, m in errs]
        reasons.append("CPU reference failed: " + (main[-1] if main else "no inputs"))
        del built, model, pristine
    else:
        result["reason"] = reasons[0] if len(set(reasons)) == 1 else " / ".join(dict.fromkeys(reasons))
        return result
    result["params"] = built.params
    if built.note:
        result["note"] = built.note
    if variant:
        result["variant"] = variant
    result["input"] = _describe(cand)
    result["cpu_seconds"] = round(time.time() - t0, 2)
    for mode in modes:
        torch.manual_seed(0)
        result["modes"][mode] = run_on_tpu(pristine, cand, expected, mode, rng_log=rng_log)
        if not _device_alive():
            result["device_dead"] = True
            break
    if any(m.get("cause") == "mismatch" for m in result["modes"].values()):
        _recheck_tie_order(model, cand, result, rng_log)
    if any(m.get("cause") == "mismatch" for m in result["modes"].values()):
        _recheck_in_float64(model, cand, expected, result, rng_log)
    if train and not result.get("device_dead"):
        result["train"] = _train(pristine, cand, modes, rng_log, recheck_by=t0 + RECHECK_BUDGET_S)
    for m in result["modes"].values():
        m.pop("_tpu_out", None)
    statuses = [m["status"] for m in result["modes"].values()]
    if result["train"] and "modes" in result["train"]:
        statuses += [m["status"] for m in result["train"]["modes"].values()]
    # a compiled run torch.compile cannot do on CPU either is excluded, not failed
    if statuses and all(s == "excluded" for s in statuses):
        result["status"] = "excluded"
        result["reason"] = next(m.get("reason") for m in result["modes"].values())
        result["seconds"] = round(time.time() - t0, 2)
        return result
    statuses = [s for s in statuses if s != "excluded"]
    result["status"] = "pass" if statuses and all(s == "pass" for s in statuses) else "fail"
    result["seconds"] = round(time.time() - t0, 2)
    return result


def _replayable(model, cand):
    """The record of the random calls of the model's forward (seed 0) when replaying it
    under another seed reproduces the recorded output bit for bit (every random number
    the output depends on was seen), else None."""
    try:
        torch.manual_seed(0)
        with torch.no_grad():
            out, log = RNG.record(lambda: call(model, cand))
        if not log:
            return None
        torch.manual_seed(1)
        with torch.no_grad():
            again = call(model, cand, log)
    except Exception:
        return None
    a = dict(flatten(again))
    for path, t in flatten(out):
        u = a.get(path)
        if u is None or u.shape != t.shape or u.dtype != t.dtype or not torch.equal(u.nan_to_num(0), t.nan_to_num(0)):
            return None
    return log


def _accept_rechecked(m, note):
    """A mode's mismatch cleared by a float64 re-check: it passes with the note, unless an op
    ran through the CPU fallback."""
    m["status"], m["cause"], m["note"], m["detail"] = "pass", None, note, None
    if m.get("fallback_ops"):
        m["status"], m["cause"] = "fail", "cpu_fallback"
        m["detail"] = ", ".join(sorted(m["fallback_ops"]))


class _TiesInIndexOrder(torch.overrides.TorchFunctionMode):
    """torch.topk, and torch.sort/argsort without stable=True, with equal values in index
    order, as the tpu's kernels order them (a stable sort's order). CPU's leave that order
    to their algorithms (topk: std::nth_element or std::partial_sort over (value, index)
    pairs; an unstable sort of many elements); PyTorch does not specify it. Counts the
    calls."""

    _SORTS = (torch.sort, torch.Tensor.sort, torch.argsort, torch.Tensor.argsort)

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("out") is None:
            if func in (torch.topk, torch.Tensor.topk):
                self.calls += 1
                return _topk_in_index_order(*args, **kwargs)
            if func in self._SORTS and not kwargs.get("stable"):
                self.calls += 1
                kw = dict(zip(("dim", "descending"), args[1:]), **kwargs)
                kw["stable"] = True
                return func(args[0], **kw)
        return func(*args, **kwargs)


def _topk_in_index_order(x, k, dim=-1, largest=True, sorted=True):
    v, i = torch.sort(x, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((v.narrow(dim, 0, k), i.narrow(dim, 0, k)))


def _recheck_tie_order(model, cand, result, rng_log=None):
    """A forward mismatch where the model calls topk or sort is re-judged against the CPU
    forward with their ties in index order (_TiesInIndexOrder): a model whose random init
    makes scores exactly equal (a zero-initialized MoE router, detection scores that all
    round to one value) selects other experts or boxes, or lists them in another order, on
    tpu only because PyTorch leaves the order of ties unspecified. The mode passes, with a
    note, when every output matches that forward within the usual tolerance."""
    modes = [m for m in result["modes"].values() if m.get("cause") == "mismatch" and m.get("_tpu_out")]
    if not modes:
        return
    tie_mode = _TiesInIndexOrder()
    try:
        torch.manual_seed(0)
        with torch.no_grad(), tie_mode:
            ref = dict(flatten(call(model, cand, rng_log)))
    except Exception:
        return
    if not tie_mode.calls:
        return
    for m in modes:
        if set(ref) != set(m["_tpu_out"]):
            continue
        if all(compare(m["_tpu_out"][p], ref[p])[0] for p in ref):
            _accept_rechecked(m, f"ties: {m['detail']}; the CPU forward with the equal values of topk and "
                                 f"sort in index order (as on tpu; PyTorch leaves their order unspecified, "
                                 f"{tie_mode.calls} call(s)) matches every output")


class _Float64Throughout(torch.overrides.TorchFunctionMode):
    """The float64 references' context: float32 the model asks for itself (a sine position
    table built with dtype=torch.float32, `.float()`, a factory at the default dtype) is
    float64 instead, so a float64 copy of the model does not fail on a mixed-dtype op
    (linear of a float64 weight and a float32 input). Ops that accept no float64 still fail
    (the re-check then does not apply)."""

    def __enter__(self):
        self._default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.set_default_dtype(self._default)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        return func(*args, **kwargs)


def _recheck_in_float64(model, cand, expected, result, rng_log=None):
    """A forward mismatch is re-judged against a float64 CPU reference: when the tpu's
    float32 error (vs float64) is within 2x the CPU's own float32 error on the worst
    output, the model is ill-conditioned (random-init activations that explode), not
    wrong on tpu; the mode then passes with a note. An output whose size the model decides
    by comparisons (keypoints over a threshold, detections after NMS) may differ in size
    only where the CPU's own float32 size differs from the float64 one too (float32
    cannot settle those comparisons), and by no more than the CPU's in each dim.

    The CPU's own error is the larger of its forward as the validation ran it (one thread)
    and its forward at PyTorch's default thread count (every core), run only when the
    first does not clear the mismatch, as _recheck_train_in_float64 does: the thread count
    splits long sums differently, and a model that amplifies rounding moves the CPU's
    float32 error with it (legacy_seresnet152: 1.51 at one thread, 7.00 at two, against a
    float64 forward whose largest output is 370; the tpu's 5.46)."""
    try:
        m64 = copy.deepcopy(model).double()
        to64 = lambda t: t.double() if t.is_floating_point() else t  # noqa: E731
        c64 = (cand[0], tree_map(to64, cand[1]), tree_map(to64, cand[2]))
        torch.manual_seed(0)
        with torch.no_grad(), _Float64Throughout():
            ref64 = dict(flatten(call(m64, c64, rng_log)))
        del m64
    except Exception:
        return
    cpu_runs = [dict(flatten(expected))]
    for mode, m in result["modes"].items():
        if m.get("cause") != "mismatch" or not m.get("_tpu_out"):
            continue
        verdict = _judge_forward(m["_tpu_out"], ref64, cpu_runs)
        if not verdict[0] and len(cpu_runs) == 1 and (os.cpu_count() or 1) > torch.get_num_threads():
            try:
                cpu_runs.append(dict(flatten(_cpu_forward(model, cand, rng_log, os.cpu_count()))))
            except Exception:
                pass
            else:
                verdict = _judge_forward(m["_tpu_out"], ref64, cpu_runs)
        ok, sized, compared, worst_tpu, worst_cpu = verdict
        if ok and sized:
            _accept_rechecked(m, f"ill-conditioned sizes: {m['detail']}; sizes float32 cannot settle: "
                                 f"{'; '.join(sized[:3])}" + (f" (+{len(sized) - 3} more)" if len(sized) > 3 else "")
                                 + (f"; the other outputs' max error vs float64 is {worst_tpu:.3g} on tpu, "
                                    f"{worst_cpu:.3g} on CPU float32" if compared else ""))
        elif ok:
            _accept_rechecked(m, f"ill-conditioned: {m['detail']}; vs a float64 reference the tpu's max "
                                 f"error is {worst_tpu:.3g}, the CPU float32's {worst_cpu:.3g}")
    for m in result["modes"].values():
        m.pop("_tpu_out", None)


def _judge_forward(tpu_out, ref64, cpu_runs):
    """_recheck_in_float64's verdict on one mode's outputs: (ok, sized outputs, compared
    count, the tpu's and the CPU's worst error vs float64). Sizes are judged against the
    first CPU run; an output's CPU error is the largest among the runs."""
    worst_tpu, worst_cpu = 0.0, 0.0
    sized, compared = [], 0
    for path, t in tpu_out.items():
        r = ref64.get(path)
        c = cpu_runs[0].get(path)
        if c is not None and r is not None and c.shape != t.shape:
            if c.shape == r.shape or not (t.dim() == c.dim() == r.dim()) or any(
                    abs(a - b) > abs(x - b) for a, x, b in zip(t.shape, c.shape, r.shape)):
                return False, sized, compared, worst_tpu, worst_cpu
            sized.append(f"{path} {list(t.shape)} (CPU float32 {list(c.shape)}, float64 {list(r.shape)})")
            continue
        if c is not None and not t.is_floating_point() and not t.is_complex():
            # integer outputs (labels, indices) have no float64 rounding to compare:
            # they must equal the CPU's exactly
            if c.shape != t.shape or not torch.equal(c, t):
                return False, sized, compared, worst_tpu, worst_cpu
            continue
        if r is None or c is None or r.shape != t.shape or not t.is_floating_point():
            return False, sized, compared, worst_tpu, worst_cpu
        et = _tolerances.max_error(t, r)
        ec = max(_tolerances.max_error(run[path], r)
                 for run in cpu_runs if path in run and run[path].shape == r.shape)
        worst_tpu, worst_cpu = max(worst_tpu, et), max(worst_cpu, ec)
        compared += 1
        if not _tolerances.within_cpu_error(et, ec, tol(c.dtype)[0]):
            return False, sized, compared, worst_tpu, worst_cpu
    return True, sized, compared, worst_tpu, worst_cpu


def _cpu_forward(model, cand, rng_log=None, threads=None, compile_backend=None):
    """The CPU float32 forward again, at `threads` intra-op threads (restored after);
    through torch.compile with `compile_backend`."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads or before)
        torch.manual_seed(0)
        with torch.no_grad():
            return call(torch.compile(model, backend=compile_backend) if compile_backend else model, cand, rng_log)
    finally:
        torch.set_num_threads(before)


def _cpu_step(model, cand, rng_log=None, threads=None, compile_backend=None):
    """The training step on CPU, on a copy of the model: {"loss", "grad": {name: grad}}, or
    None when the model has no differentiable float output. threads: torch's intra-op
    thread count for the step (restored after), which decides how long sums are split;
    compile_backend: the step through torch.compile with that backend."""
    ref_model = copy.deepcopy(model)
    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(0)
        run = torch.compile(ref_model, backend=compile_backend) if compile_backend else ref_model
        loss = _loss_of(call(run, cand, rng_log))
        if loss is None:
            return None
        loss.backward()
        return {"loss": loss.detach(), "grad": {n: p.grad for n, p in ref_model.named_parameters()
                                                if p.grad is not None}}
    finally:
        torch.set_num_threads(before)
        del ref_model


def _train(model, cand, modes, rng_log=None, recheck_by=math.inf):
    """One training step (eval-mode numerics: dropout off): loss and every gradient vs CPU."""
    try:
        ref = _cpu_step(model, cand, rng_log)
        if ref is None:
            return {"excluded": "no differentiable float output"}
    except Exception as e:
        return {"excluded": f"CPU backward failed: {type(e).__name__}: {str(e)[:200]}"}
    res = {"modes": {}}
    for mode in modes:
        torch.manual_seed(0)
        res["modes"][mode] = run_on_tpu(model, cand, None, mode, train_ref=ref, rng_log=rng_log)
    if any(m.get("cause") == "mismatch" for m in res["modes"].values()):
        if time.time() < recheck_by:
            _recheck_train_in_float64(model, cand, ref, res, rng_log)
        else:  # a float64 step of a model this slow would run past the per-model timeout
            for m in res["modes"].values():
                if m.get("cause") == "mismatch":
                    m["recheck"] = f"float64 re-check skipped: the model had used over {RECHECK_BUDGET_S:.0f} s"
    for m in res["modes"].values():
        m.pop("_tpu_out", None)
    return res


def _recheck_train_in_float64(model, cand, ref, res, rng_log=None):
    """The training step's analogue of _recheck_in_float64: a loss or gradient mismatch is
    re-judged against the same step run in float64 on CPU. The mode passes (with a note)
    only when, for the loss and every gradient, the tpu's float32 error vs float64 is at
    most 2x the CPU float32's own error plus the comparison's absolute tolerance (scaled by
    the gradient's largest magnitude, as compare() does): the CPU's float32 result is then
    no closer to the exact step than the tpu's (a ReLU whose input rounds to either side of
    zero, a sum of many terms in another order), so the difference says nothing about the
    tpu. A tpu gradient further from float64 than that still fails.

    The CPU's own error is the larger of its step as the validation ran it (one thread) and
    its step at PyTorch's default thread count (every core), computed only when the first
    does not clear the mismatch: where long sums are split differently by the thread count
    and the model amplifies rounding, the CPU's float32 error itself moves by orders of
    magnitude between the two (EfficientLoFTR's training step: 1.25e8 at one thread,
    5.29e10 at two, against a float64 step; the tpu's 5.28e10).

    Still failing, the tpu is then measured against the float64 step that takes the tpu's
    own relu/leaky_relu decisions where its input is within rounding of zero (_step64): one ReLU input
    at -2.4e-8 in float64 that rounds to +7.8e-9 sends a gradient down another path
    (vgg16's first convolution: bias gradient off by 0.5% against the CPU's 1e-6), which
    says nothing about the tpu's arithmetic."""
    try:
        ref64, _ = _step64(model, cand, rng_log)
    except Exception:
        return
    cpu_runs = [dict(flatten(ref))]
    for mode, m in res["modes"].items():
        if m.get("cause") != "mismatch" or not m.get("_tpu_out"):
            continue
        ok, worst = _judge_step(m["_tpu_out"], ref64, cpu_runs)
        if not ok and len(cpu_runs) == 1 and (os.cpu_count() or 1) > torch.get_num_threads():
            try:
                cpu_runs.append(dict(flatten(_cpu_step(model, cand, rng_log, threads=os.cpu_count()))))
            except Exception:
                pass
            else:
                ok, worst = _judge_step(m["_tpu_out"], ref64, cpu_runs)
        how = "vs the step in float64"
        # a ReLU whose input rounds to the other side of zero on tpu (seen by a TorchFunctionMode
        # in eager execution, so the compiled mode takes defer_and_fuse's decisions: its graph
        # computes the same ReLU inputs, up to the order of long sums)
        if not ok:
            try:
                eager = "defer_and_fuse" if mode == COMPILED else mode
                sub64, flips = _step64(model, cand, rng_log, _relu_decisions(model, cand, eager, rng_log))
            except Exception:
                flips = 0
            if flips:
                ok, worst = _judge_step(m["_tpu_out"], ref64, cpu_runs, tpu_ref=sub64)
                how = (f"vs the step in float64 with the tpu's relu/leaky_relu decisions at {flips} input(s) within "
                       f"{RELU_NEAR_ZERO:g} (relative) of zero")
        if not ok and worst[1] is not None:
            m["recheck"] = (f"{how}, the tpu's max error on {worst[1]} is {worst[2]:.3g}, "
                            f"the CPU float32's {worst[3]:.3g} ({worst[0]:.3g}x the allowed)")
        if ok:
            _accept_rechecked(m, f"float64 re-check: {m['detail']}; {how}, the tpu's max "
                                 f"error on {worst[1]} is {worst[2]:.3g}, the CPU float32's {worst[3]:.3g}")


_RELU_INPLACE = (torch.relu_, torch.Tensor.relu_)
_RELUS = (torch.nn.functional.relu, torch.relu, torch.Tensor.relu) + _RELU_INPLACE


class _ReluDecisions(torch.overrides.TorchFunctionMode):
    """The sign decisions of every relu and leaky_relu call (nn.ReLU, F.relu, torch.relu,
    F.leaky_relu, in place or not), by call order: input > 0, copied to the CPU. With
    `impose` (a list recorded on tpu), each input element whose sign differs from the
    recorded one and that lies within RELU_NEAR_ZERO of its tensor's largest |input| of
    zero takes the recorded decision (the output, and so the gradient, is the input's or
    slope times it); `flips` counts them. Other differences keep the run's own decision."""

    def __init__(self, impose=None):
        super().__init__()
        self.decisions = [] if impose is None else impose
        self.record = impose is None
        self.calls = 0
        self.flips = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaky = func is torch.nn.functional.leaky_relu
        if not (leaky or func in _RELUS) or not args or not torch.is_tensor(args[0]):
            return func(*args, **kwargs)
        x = args[0]
        i, self.calls = self.calls, self.calls + 1
        if self.record:
            self.decisions.append((x > 0).detach().cpu())
            return func(*args, **kwargs)
        seq = self.decisions
        if i >= len(seq) or seq[i].shape != x.shape:
            return func(*args, **kwargs)
        own = x > 0
        take = (seq[i] != own) & (x.abs() <= RELU_NEAR_ZERO * x.abs().max())
        if not bool(take.any()):
            return func(*args, **kwargs)
        self.flips += int(take.sum())
        named = dict(zip(("negative_slope", "inplace") if leaky else ("inplace",), args[1:]), **kwargs)
        slope = named.get("negative_slope", 0.01) if leaky else 0.0
        out = torch.where(torch.where(take, seq[i], own), x, x * slope)
        return x.copy_(out) if func in _RELU_INPLACE or named.get("inplace") else out


def _relu_decisions(model, cand, mode, rng_log=None):
    """The tpu's relu/leaky_relu decisions in the training step's forward in `mode`, in
    call order (_ReluDecisions; the run is deterministic, so these are the judged step's)."""
    import torchtpu
    dev_model = copy.deepcopy(model).to("tpu")
    rec = _ReluDecisions()
    prev = torchtpu.get_eager_mode()
    try:
        torchtpu.set_eager_mode(mode)
        dev_cand = _on_tpu(cand)
        torch.manual_seed(0)
        with torch.no_grad(), rec:
            call(dev_model, dev_cand, rng_log)
    finally:
        torchtpu.set_eager_mode(prev)
    return rec.decisions


def _step64(model, cand, rng_log=None, decisions=None):
    """(step, flips): the training step in float64 on CPU, flattened ("loss", "grad.*").
    With decisions (_relu_decisions), relu/leaky_relu inputs within rounding of zero take
    the tpu's decision (_ReluDecisions); flips counts them."""
    m64 = copy.deepcopy(model).double()
    imposed = _ReluDecisions(decisions) if decisions is not None else contextlib.nullcontext()
    to64 = lambda t: t.double() if t.is_floating_point() else t  # noqa: E731
    c64 = (cand[0], tree_map(to64, cand[1]), tree_map(to64, cand[2]))
    torch.manual_seed(0)
    with _Float64Throughout(), imposed:
        loss = _loss_of(call(m64, c64, rng_log))
        loss.backward()
    return dict(flatten({"loss": loss.detach().double(),
                         "grad": {n: p.grad for n, p in m64.named_parameters() if p.grad is not None}})), \
        imposed.flips if decisions is not None else 0


def _judge_step(tpu_out, ref64, cpu_runs, tpu_ref=None):
    """(ok, worst): whether every tpu loss/gradient is within 2x the CPU float32 error (the
    largest over cpu_runs) of the float64 step, plus the absolute tolerance; worst = (error
    / bound, path, tpu error, cpu error) of the output nearest its bound. tpu_ref: the
    float64 step the tpu is measured against (default ref64, which the CPU always is)."""
    worst = (0.0, None, 0.0, 0.0)
    ok = set(tpu_out) == set(cpu_runs[0])
    tpu_ref = ref64 if tpu_ref is None else tpu_ref
    for path, t in tpu_out.items():
        r, c, rt = ref64.get(path), cpu_runs[0].get(path), tpu_ref.get(path)
        if r is None or c is None or rt is None or r.shape != t.shape or rt.shape != t.shape or not t.is_floating_point():
            return False, worst
        atol = tol(c.dtype)[0]
        if path.startswith("grad.") and c.numel():
            atol *= max(1.0, float(c.double().abs().nan_to_num(0, 0, 0).max()))
        et = _tolerances.max_error(t, rt)
        ec = max(_tolerances.max_error(run[path], r)
                 for run in cpu_runs if path in run and run[path].shape == r.shape)
        bound = 2 * ec + atol
        if et / bound > worst[0]:
            worst = (et / bound, path, et, ec)
        if not _tolerances.within_cpu_error(et, ec, atol) or bool((t.isnan() != rt.isnan()).any()):
            ok = False
    return ok, worst


def _describe(cand):
    _, args, kwargs = cand
    parts = []
    for i, a in enumerate(args):
        parts.append(_shape(a))
    for k, v in kwargs.items():
        parts.append(f"{k}={_shape(v)}")
    return ", ".join(parts)


def _shape(x):
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_shape(v) for v in x) + "]"
    return repr(x)


def cleanup():
    gc.collect()
