"""Helpers shared by the per-family op tests: comparison with the CPU result under the one
tolerance table, guards that an op did not run through the CPU fallback, moving inputs to
tpu, and gradients of a fixed random projection."""
import contextlib

import torch

import torchtpu
from tolerances import tol

DEV = "tpu"


def close(actual, expected, dtype=None, scale=1.0):
    """actual (on tpu) matches the CPU result within the table's tolerance for dtype
    (default: expected's), scaled by `scale`; None matches None."""
    if actual is None or expected is None:
        assert actual is None and expected is None, (actual, expected)
        return
    kw = tol(dtype or expected.dtype)
    assert actual.device.type == DEV, actual.device
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.cpu(), expected, rtol=kw["rtol"] * scale, atol=kw["atol"] * scale,
                               equal_nan=True)


def _fallback_growth(before):
    torch.tpu.synchronize()
    after = torchtpu.fallback_report()
    return {k.removeprefix("aten::"): v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}


@contextlib.contextmanager
def native(*ops):
    """Fails if any of `ops` (ATen names, overload optional) ran through the CPU fallback."""
    before = dict(torchtpu.fallback_report())
    yield
    bad = [k for k in _fallback_growth(before) if any(k == o or k.split(".")[0] == o for o in ops)]
    assert not bad, f"ran through the CPU fallback: {bad}"


@contextlib.contextmanager
def no_cpu_fallback():
    """Fails if any op at all ran through the CPU fallback."""
    before = dict(torchtpu.fallback_report())
    yield
    grew = _fallback_growth(before)
    assert not grew, f"ran through the CPU fallback: {grew}"


def tpu(*ts):
    """Copies on tpu (detached, keeping requires_grad); None stays None."""
    out = tuple(None if t is None else t.detach().to(DEV).requires_grad_(t.requires_grad) for t in ts)
    return out if len(out) > 1 else out[0]


def grads(fn, inputs, seed=0):
    """fn(*inputs) and autograd.grad of sum(out * g) for a fixed random g."""
    out = fn(*inputs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    if out.device.type == DEV:
        g = g.to(DEV)
    diff = [t for t in inputs if t is not None and t.requires_grad]
    return out, torch.autograd.grad(out, diff, g)
