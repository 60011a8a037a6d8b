"""OpInfo conformance runner: PyTorch's own OpInfo samples on "tpu" vs CPU.

Shared by the pytest suite (tests/opinfo/test_opinfo.py) and the sweep command
(`python -m torchtpu.ops_report`). Sample inputs are generated on CPU and copied to tpu
with the same strides, so both sides see identical data. Each sample of each variant
(`op`: the plain op, `inplace`, `out`, `grad`: backward through torch.autograd.grad, and
`error`: OpInfo's error_inputs) is classified:

  native    matches CPU and no op went through the CPU fallback
  fallback  matches CPU, but some ops ran through the CPU fallback (listed)
  fail      wrong value / dtype / shape / device, wrong or missing exception, raised
            where CPU did not, timeout, or crash (the process died; ops_report only)
  skip      listed in tests/opinfo/tables.py with a reason, or CPU itself could not
            produce the reference (the reason says which)

Tolerances come from tests/tolerances.py (the project's one table); skips, random ops
and known failures from tests/opinfo/tables.py. Both are loaded from the checkout."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import random
import signal
import sys
import time
import types
import unittest
from pathlib import Path

import torch
from torch.utils._pytree import tree_map

from . import _tolerances

ROOT = Path(__file__).resolve().parents[1]
DEV = "tpu"

# The dtypes of the sweep, in report order. f64 runs where the op supports it.
DTYPES = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
}
VARIANTS = ("op", "inplace", "out", "grad")
# Checks of float32 only: the op's error_inputs, and out= tensors of another dtype than
# the result's (OUT_DTYPES, on the first OUT_DTYPE_SAMPLES samples), which ATen's kernels
# either cast into or refuse, each op by its own rule.
EXTRA_VARIANTS = ("error", "out_dtype")
OUT_DTYPES = (torch.float64, torch.float16, torch.int64)
OUT_DTYPE_SAMPLES = 2
PASS = ("native", "fallback")


# ----------------------------------------------------------------------------- loading

def _load_path(name, path):
    if name in sys.modules:
        return sys.modules[name]
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def tables():
    """tests/opinfo/tables.py (skips, random ops, known failures), or an empty stand-in."""
    mod = _load_path("torchtpu_opinfo_tables", ROOT / "tests" / "opinfo" / "tables.py")
    if mod is None:
        mod = types.SimpleNamespace(SKIPS={}, RANDOM_OPS={}, EXPECTED_FAILURES={},
                                    CI_DTYPES=("float32", "bfloat16"), CI_SAMPLES=2,
                                    SAMPLE_TIMEOUT_S=60)
    return mod


def tolerances():
    mod = sys.modules.get("tolerances")
    if mod is None:
        mod = _load_path("tolerances", ROOT / "tests" / "tolerances.py")
    return mod


def tol_for(op_key, dtype):
    mod = tolerances()
    if mod is None:
        return dict(atol=0, rtol=0)
    if hasattr(mod, "op_tol"):
        return mod.op_tol(op_key, dtype)
    return dict(mod.tol(dtype))


def _ensure_expecttest():
    """torch.testing._internal imports `expecttest` only for a TestCase base class; when the
    package is not installed, a stand-in with unittest's TestCase is enough for OpInfo."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        m = types.ModuleType("expecttest")
        m.TestCase = unittest.TestCase
        sys.modules["expecttest"] = m


_OPS = None


def load_ops():
    """{key: OpInfo} for op_db (incl. linalg/fft/special/masked/signal) and the foreach dbs.
    The key is the OpInfo name, plus '.variant_test_name' when it has one."""
    global _OPS
    if _OPS is not None:
        return _OPS
    _ensure_expecttest()
    import torch.testing._internal.common_methods_invocations as cmi
    dbs = [cmi.op_db]
    for name in sorted(dir(cmi)):
        if name.startswith("foreach_") and name.endswith("_db"):
            dbs.append(getattr(cmi, name))
    _unseed_wrappers()
    ops = {}
    for db in dbs:
        for op in db:
            key = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
            ops.setdefault(key, op)
    _OPS = ops
    return ops


SEEDED = set()  # op keys whose OpInfo op went through wrapper_set_seed


def _unseed_wrappers():
    """OpInfo wraps random ops in `wrapper_set_seed` (manual_seed(42) around the call) so
    that CPU reruns agree. tpu's generator (Philox) never reproduces CPU's stream, so here
    the wrapper is replaced by a plain call: a sample whose CPU result then changes with
    the global seed is random, and is compared for shape and dtype only."""
    def wrapper_set_seed(op, *args, **kwargs):
        return op(*args, **kwargs)
    wrapper_set_seed._torchtpu = True
    for name, mod in list(sys.modules.items()):
        if name.startswith("torch.testing._internal") and \
                callable(getattr(mod, "wrapper_set_seed", None)) and \
                not getattr(mod.wrapper_set_seed, "_torchtpu", False):
            mod.wrapper_set_seed = wrapper_set_seed


def _uses_seed_wrapper(op):
    f = op.op
    seen = set()
    while f is not None and id(f) not in seen:
        seen.add(id(f))
        code = getattr(f, "__code__", None)
        if code is not None and "wrapper_set_seed" in code.co_names:
            return True
        f = getattr(f, "__wrapped__", None) or getattr(f, "func", None)
    return False


def op_dtypes(op):
    """Names of the sweep dtypes the op supports on CPU."""
    sup = op.supported_dtypes("cpu")
    return [n for n, d in DTYPES.items() if d in sup]


def extra_variants(op, dtype_name):
    """The EXTRA_VARIANTS that run for (op, dtype)."""
    if dtype_name != "float32":
        return []
    return (["error"] if op.error_inputs_func is not None else []) + \
        (["out_dtype"] if op.supports_out else [])


def variants_for(op, dtype):
    out = ["op"]
    if op.inplace_variant is not None:
        out.append("inplace")
    if op.supports_out:
        out.append("out")
    if op.supports_autograd and dtype.is_floating_point and \
            dtype in op.supported_backward_dtypes("cpu"):
        out.append("grad")
    return out


def seed_all(seed=0):
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass


def samples(op, dtype, requires_grad=False, limit=None):
    """The op's CPU samples, deterministically (seeded), at most `limit` of them."""
    seed_all(0)
    out = []
    for s in op.sample_inputs("cpu", dtype, requires_grad=requires_grad):
        out.append(s)
        if limit is not None and len(out) >= limit:
            break
    return out


# ----------------------------------------------------------------------------- moving data

def _to_dev_tensor(t, memo=None):
    """A tpu copy of a CPU tensor with the same sizes, strides and storage offset. With a
    memo (CPU storage -> its tpu copy), tensors that share a CPU storage share one tpu
    storage too: an error input whose out= aliases its input aliases it on tpu."""
    if t.layout != torch.strided:
        return t.to(DEV)
    src = t.detach()
    st = src.untyped_storage()
    key = (st.data_ptr(), src.dtype) if memo is not None and st.nbytes() else None
    if key is None and src.is_contiguous() and src.storage_offset() == 0:
        d = src.to(DEV)
    else:
        if key is None or key not in memo:
            n = st.nbytes() // max(src.element_size(), 1)
            flat = torch.empty(0, dtype=src.dtype).set_(st, 0, (n,), (1,)).to(DEV)
            if key is not None:
                memo[key] = flat
        d = (memo[key] if key is not None else flat).as_strided(src.size(), src.stride(), src.storage_offset())
    if t.requires_grad:
        d.requires_grad_(True)
    return d


def to_dev(x, key=None, memo=None):
    """Recursively: CPU tensors -> tpu copies, cpu devices -> tpu, CPU generators -> tpu."""
    if isinstance(x, torch.Tensor):
        return _to_dev_tensor(x, memo)
    if isinstance(x, torch.device):
        return torch.device(DEV) if x.type == "cpu" else x
    if isinstance(x, str) and (x == "cpu" or x.startswith("cpu:")) and key in (None, "device"):
        return DEV  # a device string, positional (Tensor.to("cpu")) or device=
    if isinstance(x, str) and key == "device" and x.startswith("cpu"):
        return DEV
    if isinstance(x, torch.Generator):
        g = torch.Generator(device=DEV)
        g.manual_seed(x.initial_seed())
        return g
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*[to_dev(v, memo=memo) for v in x])
    if isinstance(x, (list, tuple)):
        return type(x)(to_dev(v, memo=memo) for v in x)
    if isinstance(x, dict):
        return {k: to_dev(v, k, memo) for k, v in x.items()}
    return x


def _clone(x):
    """Recursively clones CPU tensors (an op that writes its input must not change the
    sample for the next run)."""
    if isinstance(x, torch.Tensor):
        c = x.detach().clone()
        return c.requires_grad_(True) if x.requires_grad else c
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[_clone(v) for v in x])
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def tensors_in(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in tensors_in(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors_in(v)]
    return []


# ----------------------------------------------------------------------------- comparing

class Mismatch(AssertionError):
    def __init__(self, kind, msg):
        super().__init__(msg)
        self.kind = kind


def compare(actual, expected, op_key, dtype, shape_only=False, path="out", device=DEV):
    """Recursively: tensors (device, dtype, shape, values with equal_nan), sequences,
    dicts and scalars. Raises Mismatch(kind, message)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch("type", f"{path}: expected a tensor, got {type(actual).__name__}")
        if device is not None and expected.device.type == "cpu" and \
                actual.device.type != device and \
                expected.numel() > 0 and not shape_only:
            raise Mismatch("device", f"{path}: result on {actual.device}, expected {DEV}")
        if actual.dtype != expected.dtype:
            raise Mismatch("dtype", f"{path}: dtype {actual.dtype}, expected {expected.dtype}")
        if actual.shape != expected.shape:
            raise Mismatch("shape", f"{path}: shape {tuple(actual.shape)}, "
                                    f"expected {tuple(expected.shape)}")
        if shape_only or expected.layout != torch.strided:
            return
        a = actual.detach().cpu()
        e = expected.detach()
        # a complex result (fft of an integer input) takes the table's complex row
        kw = tol_for(op_key, e.dtype if e.dtype in DTYPES.values() or e.dtype.is_complex else dtype)
        try:
            torch.testing.assert_close(a, e, equal_nan=True, check_device=False,
                                       check_stride=False, **kw)
        except AssertionError:
            raise Mismatch("value", f"{path}: {_value_diff(a, e)}") from None
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise Mismatch("type", f"{path}: expected a sequence of {len(expected)}, got "
                                   f"{type(actual).__name__}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, op_key, dtype, shape_only, f"{path}[{i}]", device)
        return
    if isinstance(expected, dict):
        for k, e in expected.items():
            compare(actual.get(k) if isinstance(actual, dict) else None, e, op_key, dtype,
                    shape_only, f"{path}[{k!r}]", device)
        return
    if shape_only:
        return
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        if math.isnan(expected) and math.isnan(actual):
            return
        if not math.isclose(actual, expected, rel_tol=1e-5, abs_tol=1e-6):
            raise Mismatch("value", f"{path}: {actual!r}, expected {expected!r}")
        return
    if isinstance(actual, torch.Tensor) and not isinstance(expected, torch.Tensor):
        actual = actual.item() if actual.numel() == 1 else actual.tolist()
    if actual != expected:
        raise Mismatch("value", f"{path}: {actual!r}, expected {expected!r}")


def _value_diff(a, e):
    try:
        if e.dtype == torch.bool or not (e.is_floating_point() or e.is_complex()):
            bad = (a != e).sum().item()
            return f"{bad}/{e.numel()} elements differ (exact dtype {e.dtype})"
        af, ef = a.double(), e.double()
        finite = torch.isfinite(ef) & torch.isfinite(af)
        nanbad = (torch.isnan(af) != torch.isnan(ef)) | \
                 (torch.isinf(af) & torch.isinf(ef) & (af != ef)) | \
                 (torch.isinf(af) != torch.isinf(ef))
        err = (af - ef).abs().where(finite, torch.zeros_like(af))
        mx = err.max().item() if err.numel() else 0.0
        rel = (err / ef.abs().clamp_min(1e-30)).where(finite, torch.zeros_like(af))
        return (f"max abs err {mx:.3g}, max rel err {rel.max().item():.3g}"
                + (f", {int(nanbad.sum())} nan/inf mismatches" if nanbad.any() else "")
                + f" ({e.dtype}, {e.numel()} elements)")
    except Exception as x:  # noqa: BLE001
        return f"values differ ({type(x).__name__} while measuring)"


def short_exc(e):
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:200]}"


# ----------------------------------------------------------------------------- running

class SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def time_budget(seconds):
    """SIGALRM-based budget for one sample (main thread only; a hang inside C that never
    returns to Python is caught by ops_report's watchdog or pytest-timeout instead)."""
    if not seconds or not hasattr(signal, "SIGALRM") or \
            __import__("threading").current_thread() is not __import__("threading").main_thread():
        yield
        return

    def handler(signum, frame):
        raise SampleTimeout(f"sample exceeded {seconds}s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _call(op, variant, s, out=None):
    """One call of the variant on a sample (input/args/kwargs already on the right device)."""
    if variant == "inplace":
        inp = s.input.clone() if isinstance(s.input, torch.Tensor) else \
            [t.clone() for t in s.input] if isinstance(s.input, (list, tuple)) else s.input
        return op.inplace_variant(inp, *s.args, **s.kwargs)
    if variant == "out":
        return op(s.input, *s.args, **s.kwargs, out=out)
    return op(s.input, *s.args, **s.kwargs)


def _sample_on(s, fn):
    from torch.testing._internal.opinfo.core import SampleInput
    return SampleInput(fn(s.input), args=fn(s.args), kwargs=fn(s.kwargs),
                       output_process_fn_grad=s.output_process_fn_grad,
                       broadcasts_input=s.broadcasts_input, name=s.name)


def _empty_like_out(x, device=DEV, float_dtype=None):
    """out= tensors shaped like a result (the same structure of tuples/lists), filled with
    the same pattern on CPU and tpu (NaN, or 7 / True) instead of left uninitialized: an op
    that leaves out= unwritten on every device then compares equal (ATen's 1-D fft.ihfftn
    out= writes its result into a temporary: conj_physical_out's arguments are swapped),
    while one that writes it on CPU only still differs. float_dtype: the dtype of the
    floating ones instead of the result's."""
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            return None
        dt = float_dtype if float_dtype is not None and x.is_floating_point() else x.dtype
        fill = float("nan") if dt.is_floating_point or dt.is_complex else True if dt == torch.bool else 7
        return torch.empty_like(x, device=device, dtype=dt).fill_(fill)
    if isinstance(x, (list, tuple)):
        return type(x)(_empty_like_out(v, device, float_dtype) for v in x)
    return None


def _as_computed(x):
    """A float64 out= tensor as float32, the precision the float32 sample was computed in."""
    return tree_map(lambda t: t.to(torch.float32) if isinstance(t, torch.Tensor) and
                    t.dtype == torch.float64 else t, x)


def _grad_pieces(op, s, out):
    out = s.output_process_fn_grad(out)
    outs = [t for t in tensors_in(out) if t.requires_grad and
            (t.is_floating_point() or t.is_complex())]
    ins = [t for t in tensors_in([s.input, s.args, s.kwargs]) if t.requires_grad]
    return outs, ins


def _grad_outputs(outs):
    """Seeded CPU grad_outputs shaped like the (CPU or tpu) outputs."""
    g = torch.Generator().manual_seed(7)
    return [torch.randn(o.shape, generator=g, dtype=torch.float32).to(o.dtype) for o in outs]


def _run_cpu(op, variant, s, out_dtype=None):
    """(result, exception) of the CPU reference; for `grad`, the gradients."""
    seed_all(1234)
    try:
        if variant == "grad":
            res = op(s.input, *s.args, **s.kwargs)
            outs, ins = _grad_pieces(op, s, res)
            if not outs or not ins:
                return None, "no differentiable output or input"
            gouts = _grad_outputs(outs)
            grads = torch.autograd.grad(outs, ins, gouts, allow_unused=True)
            return (list(grads), gouts), None
        if variant == "out":
            c = _sample_on(s, _clone)
            res = op(c.input, *c.args, **c.kwargs)
            out = _empty_like_out(res, "cpu", out_dtype)
            ret = op(s.input, *s.args, **s.kwargs, out=out)
            return (ret, out), None
        return _call(op, variant, s), None
    except Exception as e:  # noqa: BLE001
        return None, e


def is_random(op, op_key, dtype, sample, tab, seeds=3):
    """Random or uninitialized result: the tables say so, or the CPU result changes with
    the global seed (OpInfo's seeding wrapper is disabled, see _unseed_wrappers) in one of
    `seeds` runs."""
    if op_key in tab.RANDOM_OPS or op.name in tab.RANDOM_OPS:
        return True
    # A CPU op whose result changes with the global seed draws random numbers.
    try:
        seed_all(1)
        s1 = _sample_on(sample, _clone)
        a = op(s1.input, *s1.args, **s1.kwargs)
        for seed in range(2, seeds + 1):  # small random outputs (a permutation of 3) may repeat
            seed_all(seed)
            s2 = _sample_on(sample, _clone)
            b = op(s2.input, *s2.args, **s2.kwargs)
            compare(b, a, op_key, dtype, path="cpu", device="cpu")
        return False
    except Mismatch:
        return True
    except Exception:  # noqa: BLE001
        return False


def _expects_device_result(s):
    """A result is expected on tpu when the sample has a tensor of rank >= 1 or names a
    device; factories fed only Python or 0-dim values (torch.arange(t0)) return CPU
    tensors on CPU and on tpu alike."""
    return any(t.dim() > 0 for t in tensors_in([s.input, s.args, s.kwargs])) or \
        "device" in s.kwargs


def run_sample(op, op_key, dtype, variant, s, shape_only=False, budget=None, out_dtype=None):
    """Runs one sample of one variant on CPU and tpu and classifies it; out_dtype: the out
    variant with floating out= tensors of that dtype. Returns {status, kind, reason,
    fallback, t}."""
    import torchtpu
    t0 = time.time()
    rec = dict(status=None, kind="", reason="", fallback={})
    if variant == "error":
        return _run_error(op, s, rec, t0)
    # The tpu copy is made first: an OpInfo op may write its CPU input.
    try:
        ds = _sample_on(s, to_dev)
        keep = getattr(tables(), "CPU_ARGS", {}).get(op_key, ())
        if keep:
            ds.args = tuple(_clone(a) if i in keep else d for i, (a, d) in enumerate(zip(s.args, ds.args)))
    except Exception as e:  # noqa: BLE001
        rec.update(status="fail", kind="exception", reason="copy to tpu: " + short_exc(e))
        return _fin(rec, t0)
    expected, cpu_exc = _run_cpu(op, variant, s, out_dtype)
    if isinstance(cpu_exc, str):
        rec.update(status="skip", kind="no_grad", reason=cpu_exc)
        return _fin(rec, t0)
    if variant == "out" and isinstance(cpu_exc, TypeError) and (
            "invalid combination of arguments" in str(cpu_exc) or "'out'" in str(cpu_exc)):
        rec.update(status="skip", kind="no_out",
                   reason="no out= overload reachable from Python: " + short_exc(cpu_exc))
        return _fin(rec, t0)
    out_like = None
    if variant == "out" and expected is None:
        with contextlib.suppress(Exception):  # out= raised on CPU: still shape the outs
            c = _sample_on(s, _clone)
            out_like = op(c.input, *c.args, **c.kwargs)
        if _empty_like_out(out_like) is None:
            rec.update(status="skip", kind="cpu_error",
                       reason="CPU raised with and without out= (the plain variant checks "
                              "the exception): " + short_exc(cpu_exc))
            return _fin(rec, t0)
    torchtpu.reset_fallback_report()
    cpu_gouts = None
    try:
        with time_budget(budget):
            if variant == "grad":
                res = op(ds.input, *ds.args, **ds.kwargs)
                outs, ins = _grad_pieces(op, ds, res)
                cpu_gouts = expected[1] if expected is not None else _grad_outputs(outs)
                gouts = to_dev(cpu_gouts)
                grads = torch.autograd.grad(outs, ins, gouts, allow_unused=True)
                actual = list(grads)
                expected = expected[0]
            elif variant == "out":
                out = _empty_like_out(expected[1] if expected is not None else out_like,
                                      float_dtype=out_dtype)
                ret = _call(op, variant, ds, out=out)
                actual = (ret, out)
            else:
                actual = _call(op, variant, ds)
            torch.tpu.synchronize()
        tpu_exc = None
    except SampleTimeout as e:
        rec.update(status="fail", kind="timeout", reason=str(e))
        return _fin(rec, t0)
    except Exception as e:  # noqa: BLE001
        tpu_exc = e
        with contextlib.suppress(Exception):
            torch.tpu.synchronize()
    rec["fallback"] = dict(torchtpu.fallback_report())
    ok_status = "fallback" if rec["fallback"] else "native"
    if cpu_exc is not None:
        if tpu_exc is None:
            rec.update(status="fail", kind="no_exception",
                       reason="CPU raised " + short_exc(cpu_exc) + "; tpu did not")
        elif isinstance(tpu_exc, type(cpu_exc)):
            rec.update(status=ok_status, kind="both_raised", reason=type(cpu_exc).__name__)
        else:
            rec.update(status="fail", kind="wrong_exception",
                       reason=f"tpu {short_exc(tpu_exc)}; CPU {type(cpu_exc).__name__}")
        return _fin(rec, t0)
    if tpu_exc is not None:
        rec.update(status="fail", kind="exception", reason=short_exc(tpu_exc))
        return _fin(rec, t0)
    if out_dtype is not None:
        actual, expected = _as_computed(actual), _as_computed(expected)
    gauge = getattr(tables(), "GAUGE_OPS", {})
    if variant in ("op", "out") and (op_key in gauge or op.name in gauge):
        # outputs defined up to per-vector signs: compare the sample's own invariant view
        fn = s.output_process_fn_grad
        actual, expected = ((fn(actual[0]), fn(actual[1])), (fn(expected[0]), fn(expected[1]))) \
            if variant == "out" else (fn(actual), fn(expected))
    try:
        compare(actual, expected, op_key, dtype, shape_only=shape_only,
                device=DEV if _expects_device_result(s) else None)
        rec.update(status=ok_status)
    except Mismatch as m:
        wider, errs = _wider_recheck(op, s, variant, actual, expected, cpu_gouts, op_key, dtype) \
            if m.kind == "value" else (None, None)
        if wider == "wider_reference":
            rec.update(status=ok_status, kind="wider_reference",
                       reason=f"CPU's own {dtype} kernel differs; matches CPU's result one precision "
                              f"up, rounded to {dtype} ({m})")
        elif m.kind == "value" and _valid_up_to_ties(op_key, s, variant, actual, expected, dtype):
            rec.update(status=ok_status, kind="ties",
                       reason=f"equal elements in another order than CPU's, a correct answer ({m})")
        elif wider == "within_cpu_error":
            rec.update(status=ok_status, kind="within_cpu_error",
                       reason=f"largest error against CPU's result one precision up: tpu {errs[0]:.3g}, "
                              f"CPU's own {dtype} result {errs[1]:.3g} ({m})")
        else:
            rec.update(status="fail", kind=m.kind, reason=str(m))
    except Exception as e:  # noqa: BLE001  reading the result back failed
        rec.update(status="fail", kind="exception", reason="reading result: " + short_exc(e))
    return _fin(rec, t0)


def _tie_params(op_key, s):
    """(dim, stable, sorted) of a tie op's sample (tables.TIE_OPS)."""
    before, dflt = tables().TIE_OPS[op_key]
    if before is None:
        return dflt, False, True
    names = list(before) + ["dim", "largest" if op_key == "topk" else "descending",
                            "sorted" if op_key == "topk" else "stable"]
    p = dict(zip(names, s.args))
    p.update(s.kwargs)
    return p.get("dim", dflt), bool(p.get("stable", False)), bool(p.get("sorted", True))


def _grad_up_to_ties(x, g, dim):
    """g reordered within each run of equal x elements along dim: by x, then by g."""
    i = torch.sort(g, dim=dim, stable=True).indices
    xs, gs = x.gather(dim, i), g.gather(dim, i)
    return gs.gather(dim, torch.sort(xs, dim=dim, stable=True).indices)


def _valid_up_to_ties(op_key, s, variant, actual, expected, dtype):
    """Whether a result that differs from CPU's is another correct answer of an op whose
    indices are defined only up to the order of equal elements (tables.TIE_OPS)."""
    if op_key not in getattr(tables(), "TIE_OPS", {}) or not isinstance(s.input, torch.Tensor):
        return False
    dim, stable, sorted_ = _tie_params(op_key, s)
    if stable:
        return False  # stable=True defines the order of equal elements
    x = s.input.detach()
    exact = dict(rtol=0, atol=0, equal_nan=True)
    try:
        if x.dim() == 0:
            return False
        if variant == "grad":  # the gradient with respect to the input comes first
            a, e = actual[0], expected[0]
            compare(_grad_up_to_ties(x, a.detach().cpu(), dim), _grad_up_to_ties(x, e, dim), op_key, dtype, device=None)
            return all(compare(p, q, op_key, dtype, device=None) is None for p, q in zip(actual[1:], expected[1:]))
        pairs = [(actual, expected)] if variant == "op" else list(zip(actual, expected))
        for a, e in pairs:
            (av, ai), (ev, ei) = [(None, r) if op_key == "argsort" else
                                  (r, None) if op_key == "msort" else (r[0], r[1]) for r in (a, e)]
            if ai is None:  # msort: values only, no indices to differ
                compare(av, ev, op_key, dtype, device=None)
                continue
            ai = ai.cpu()
            if ai.shape != ei.shape or ai.dtype != ei.dtype:
                return False
            if ai.numel() > 1 and ai.dim() > 0:
                srt = ai.sort(dim).values
                n = srt.size(dim)
                if (srt.narrow(dim, 1, n - 1) == srt.narrow(dim, 0, n - 1)).any():
                    return False  # an element picked twice
            picked = x.gather(dim, ai)
            if av is None:
                torch.testing.assert_close(picked, x.gather(dim, ei), **exact)
                continue
            av = av.cpu()
            torch.testing.assert_close(picked, av, **exact)  # the indices point at the values
            if not sorted_:  # topk(sorted=False): the same set of values
                av, ev = av.sort(dim).values, ev.sort(dim).values
            compare(av, ev, op_key, dtype, device=None)
        return True
    except Exception:  # noqa: BLE001  (a mismatch, or a sample this check does not cover)
        return False


_WIDER = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}


def _upcast(x, dtype):
    """CPU tensors of `dtype` in x (any nesting) -> copies in the next wider dtype
    (requires_grad kept)."""
    return tree_map(lambda t: t.detach().to(_WIDER[dtype]).requires_grad_(t.requires_grad)
                    if isinstance(t, torch.Tensor) and t.dtype == dtype else t, x)


def _wider_result(op, s, variant, cpu_gouts, dtype):
    """The sample's result (variant "grad": its gradients) computed on CPU one precision up
    (bf16 and f16 in float32, float32 in float64), unrounded, shaped like the variant's
    results; None where the call has no wider form."""
    w = _sample_on(s, lambda x: _upcast(x, dtype))
    res = op(w.input, *w.args, **w.kwargs)
    if variant != "grad":  # op, inplace (the op's result in self), out (returned and written)
        if not any(t.dtype == _WIDER[dtype] for t in tensors_in(res)):
            return None
        return (res, res) if variant == "out" else res
    outs, ins = _grad_pieces(op, w, res)
    gouts = [g.to(o.dtype) for g, o in zip(cpu_gouts, outs)]
    return list(torch.autograd.grad(outs, ins, gouts, allow_unused=True))


def _within_cpu_error(actual, expected, wide, op_key, dtype):
    """Whether every floating result of the tpu is no further from the wider result than
    twice CPU's own result is, plus the dtype's atol (largest error over the elements;
    non-finite elements must agree exactly), and the largest errors (tpu, CPU) over all
    results. The validation's float64 re-check, for OpInfo samples."""
    a_ts, e_ts, w_ts = tensors_in(actual), tensors_in(expected), tensors_in(wide)
    if not (len(a_ts) == len(e_ts) == len(w_ts)) or not w_ts:
        return False, None
    atol = tol_for(op_key, dtype)["atol"]
    worst = [0.0, 0.0]
    for a, e, r in zip(a_ts, e_ts, w_ts):
        if not (r.is_floating_point() or r.is_complex()):  # indices, counts: CPU's exactly
            if not torch.equal(a.detach().cpu(), e):
                return False, None
            continue
        a, e = a.detach().cpu().to(r.dtype), e.detach().to(r.dtype)
        if a.shape != r.shape or e.shape != r.shape:
            return False, None
        fin = r.isfinite()
        if not torch.equal(a[~fin].nan_to_num(), r[~fin].nan_to_num()) or not a[fin].isfinite().all():
            return False, None
        et, ec = _tolerances.max_error(a[fin], r[fin]), _tolerances.max_error(e[fin], r[fin])
        worst = [max(worst[0], et), max(worst[1], ec)]
        if not _tolerances.within_cpu_error(et, ec, atol):
            return False, None
    return True, worst


def _wider_recheck(op, s, variant, actual, expected, cpu_gouts, op_key, dtype):
    """For a float sample whose result differs from CPU's, (kind, errors): kind
    "wider_reference" where it is within the dtype's tolerance of the same op (or its
    gradients) computed on CPU one precision up and rounded to the dtype, "within_cpu_error" where
    it is at least no further from that wider result than twice CPU's own result is
    (_within_cpu_error; errors: the largest of each), else None. CPU's kernels for a dtype differ between machines: without AVX512-BF16, CPU's bf16
    conv_transpose3d accumulates in bf16 (on an AVX2 EPYC it differed from the float32
    result by one bf16 step at 323, the tpu result, which accumulates in float32, by under
    half a step), and its float32 GEMM and convolution backward sum in another order. Used
    only after the direct comparison failed, so every other sample is still compared with
    CPU's own result in the dtype."""
    if dtype not in _WIDER:
        return None, None
    try:
        wide = _wider_result(op, s, variant, cpu_gouts, dtype)
    except Exception:  # noqa: BLE001  (no wider form of the call)
        return None, None
    if wide is None:
        return None, None
    rounded = tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == _WIDER[dtype]
                       else t, wide)
    try:
        compare(actual, rounded, op_key, dtype, device=None)
        return "wider_reference", None
    except Exception:  # noqa: BLE001  (still a mismatch)
        pass
    try:
        ok, errs = _within_cpu_error(actual, expected, wide, op_key, dtype)
        return ("within_cpu_error", errs) if ok else (None, None)
    except Exception:  # noqa: BLE001  (results this check does not cover)
        return None, None


def _run_error(op, ei, rec, t0):
    import torchtpu
    s = ei.sample_input
    try:
        op(s.input, *s.args, **s.kwargs)
        rec.update(status="skip", kind="cpu_no_error",
                   reason=f"CPU did not raise the documented {ei.error_type.__name__}")
        return _fin(rec, t0)
    except Exception as e:  # noqa: BLE001
        cpu_type = type(e)
    torchtpu.reset_fallback_report()
    try:
        memo = {}  # error inputs test aliasing (out= overlapping an input): keep it
        ds = _sample_on(s, lambda x: to_dev(x, memo=memo))
        op(ds.input, *ds.args, **ds.kwargs)
        torch.tpu.synchronize()
        tpu_exc = None
    except Exception as e:  # noqa: BLE001
        tpu_exc = e
        with contextlib.suppress(Exception):
            torch.tpu.synchronize()
    rec["fallback"] = dict(torchtpu.fallback_report())
    if tpu_exc is None:
        rec.update(status="fail", kind="no_exception",
                   reason=f"CPU raised {cpu_type.__name__}; tpu did not")
    elif isinstance(tpu_exc, cpu_type):
        rec.update(status="fallback" if rec["fallback"] else "native", kind="both_raised",
                   reason=cpu_type.__name__)
    else:
        rec.update(status="fail", kind="wrong_exception",
                   reason=f"tpu {short_exc(tpu_exc)}; CPU {cpu_type.__name__}")
    return _fin(rec, t0)


def _fin(rec, t0):
    rec["t"] = round(time.time() - t0, 4)
    return rec


def skip_reason(op_key, dtype_name, variant):
    """The tables' skip reason for (op, dtype, variant), or None. Keys may use None as a
    wildcard for dtype or variant."""
    tab = tables()
    sk = dict(getattr(tab, "CRASHES", {}))
    sk.update(tab.SKIPS)
    for k in ((op_key, dtype_name, variant), (op_key, None, variant),
              (op_key, dtype_name, None), (op_key, None, None)):
        if k in sk:
            return sk[k]
    return None


def expected_failure(op_key, dtype_name, variant):
    """(reason, failing sample indices) listed for (op, dtype, variant), or None."""
    return tables().EXPECTED_FAILURES.get((op_key, dtype_name, variant))


@functools.lru_cache(maxsize=None)
def machine_class():
    """The CPU features that pick the kernels of both sides of a comparison: ATen's CPU
    capability (its vectorized kernels and oneDNN's), AVX512-BF16 and AMX (CPU's bf16
    kernels, and libtpurt's bf16 GEMMs). Low-precision results of CPU's conv and matmul
    kernels differ between classes, so a sample can fail against CPU on one and pass on
    another; EXPECTED_FAILURES records the class its sweep ran on."""
    import torch
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    cls = torch.backends.cpu.get_cpu_capability()
    cls += "+bf16" if "avx512_bf16" in flags else ""
    cls += "+amx" if "amx_bf16" in flags else ""
    return cls


def strict_passes():
    """Whether a listed expected failure that passes is an error here: only on the machine
    class the table was swept on (elsewhere CPU's own results may differ)."""
    return getattr(tables(), "EXPECTED_FAILURES_MACHINE", None) in (None, machine_class())


def run_unit(op_key, dtype_name, variants=None, limit=None, budget=None, skip_done=None,
             on_start=None, on_result=None):
    """Runs every sample of one (op, dtype) for the given variants. Yields records
    {op, dtype, variant, i, status, kind, reason, fallback, t}. `skip_done(variant, i)`
    tells samples already recorded (resume); `on_start(variant, i)` is called before each."""
    import torchtpu
    op = load_ops()[op_key]
    dtype = DTYPES[dtype_name]
    tab = tables()
    variants = [v for v in (variants or VARIANTS + EXTRA_VARIANTS)
                if v in variants_for(op, dtype) + extra_variants(op, dtype_name)]
    prev = torchtpu.get_fallback()
    torchtpu.set_fallback("allow")
    try:
        cache = {}
        for variant in variants:
            base = dict(op=op_key, dtype=dtype_name, variant=variant)
            reason = skip_reason(op_key, dtype_name, variant)
            if reason is not None:
                yield dict(base, i=-1, status="skip", kind="table", reason=reason,
                           fallback={}, t=0.0)
                continue
            try:
                if variant == "error":
                    seed_all(0)
                    ss = list(op.error_inputs("cpu"))[:limit]
                else:
                    rg = variant == "grad"
                    if rg not in cache:
                        cache[rg] = samples(op, dtype, requires_grad=rg, limit=limit)
                    ss = cache[rg]
            except Exception as e:  # noqa: BLE001
                yield dict(base, i=-1, status="skip", kind="cpu_samples",
                           reason="CPU sample generation failed: " + short_exc(e),
                           fallback={}, t=0.0)
                continue
            shape_only = False
            per_sample = _uses_seed_wrapper(op)
            if variant != "error" and ss and not per_sample:
                shape_only = op.has_nondeterministic_output or \
                    is_random(op, op_key, dtype, ss[0], tab)
            cases = enumerate(ss)
            if variant == "out_dtype":  # sample j with out= of OUT_DTYPES[k] is case 3j + k
                n = len(OUT_DTYPES)
                cases = ((j * n + k, s) for j, s in enumerate(ss[:OUT_DTYPE_SAMPLES])
                         for k in range(n))
            for i, s in cases:
                if per_sample and variant != "error":
                    # OpInfo declares the op random: a sample whose result moved with none
                    # of three seeds (fractional_max_pool's windows) may still with a fourth
                    shape_only = op.has_nondeterministic_output or \
                        is_random(op, op_key, dtype, s, tab, seeds=8)
                if skip_done is not None and skip_done(variant, i):
                    continue
                if on_start is not None:
                    on_start(variant, i)
                if variant == "out_dtype":
                    rec = run_sample(op, op_key, dtype, "out", s, shape_only=shape_only, budget=budget,
                                     out_dtype=OUT_DTYPES[i % len(OUT_DTYPES)])
                else:
                    rec = run_sample(op, op_key, dtype, variant, s, shape_only=shape_only,
                                     budget=budget)
                rec = dict(base, i=i, **rec)
                if shape_only:
                    rec["random"] = True
                if on_result is not None:
                    on_result(rec)
                yield rec
    finally:
        torchtpu.set_fallback(prev)
