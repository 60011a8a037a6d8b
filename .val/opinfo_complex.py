"""Ad-hoc OpInfo sweep of the complex ops (forward, complex64 and complex128 samples,
plus float32 for real-input ops) vs CPU, counting CPU fallbacks."""
import sys, collections, warnings
import torch, torchtpu
from torch.testing._internal.common_methods_invocations import op_db
from torchtpu._tolerances import tol
warnings.simplefilter("ignore")
NAMES = ["add", "sub", "mul", "div", "neg", "abs", "angle", "sgn", "conj_physical", "polar", "complex",
         "fft.fft", "fft.ifft", "fft.rfft", "fft.irfft", "fft.fftn", "fft.ifftn", "fft.rfftn", "fft.irfftn",
         "fft.fft2", "fft.ifft2", "fft.rfft2", "fft.irfft2", "fft.hfft", "fft.ihfft", "view_as_real",
         "view_as_complex", "real", "imag", "resolve_conj", "conj", "fill", "zero_", "zeros_like", "ones_like"]
ops = [o for o in op_db if o.name in NAMES]
def tod(x):
    if isinstance(x, torch.Tensor): return x.to("tpu")
    if isinstance(x, (list, tuple)): return type(x)(tod(e) for e in x)
    return x
res = collections.Counter(); fails = []
for op in ops:
    for dt in [torch.complex64, torch.complex128, torch.float32]:
        if dt not in op.supported_dtypes("cpu"): continue
        for i, s in enumerate(op.sample_inputs("cpu", dt)):
            if i >= 12: break
            key = (op.name, op.variant_test_name, str(dt).replace("torch.", ""))
            try:
                exp = op(s.input, *s.args, **s.kwargs)
            except Exception:
                continue
            torchtpu.reset_fallback_report()
            try:
                act = op(tod(s.input), *tod(s.args), **{k: tod(v) for k, v in s.kwargs.items()})
                torch.tpu.synchronize()
                E = exp if isinstance(exp, (list, tuple)) else [exp]
                A = act if isinstance(act, (list, tuple)) else [act]
                for a, e in zip(A, E):
                    if not isinstance(e, torch.Tensor): continue
                    kw = tol(e.dtype)
                    if op.name.startswith("fft"):
                        kw["atol"] += kw["rtol"] * (1 + (e.abs().max().item() if e.numel() else 0))
                    torch.testing.assert_close(a.cpu(), e, equal_nan=True, **kw)
                fb = torchtpu.fallback_report()
                if fb: res[key + ("fallback",)] += 1; fails.append((key, "fallback", fb))
                else: res[key + ("pass",)] += 1
            except Exception as ex:
                res[key + ("fail",)] += 1; fails.append((key, "fail", str(ex).split("\n")[0][:200]))
summary = collections.defaultdict(lambda: collections.Counter())
for k, v in res.items(): summary[k[:3]][k[3]] += v
for k in sorted(summary): print(k, dict(summary[k]))
print("--- problems")
seen = set()
for k, why, d in fails:
    if (k, why) in seen: continue
    seen.add((k, why)); print(k, why, d)
