"""The one table of comparison tolerances (tests, the OpInfo suite and `python -m
torchtpu.validate` all read it; tests/tolerances.py re-exports it), per dtype (tpu result vs PyTorch CPU).

f32: kernels may reassociate sums (blocked GEMM, pairwise reductions) -> ~1e-5 relative.
bf16/f16: 8/11-bit mantissas; one rounding step of difference is expected."""
import torch

TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1.3e-5),
    torch.float64: dict(atol=1e-10, rtol=1e-9),
    torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2),
    torch.float16: dict(atol=1e-3, rtol=1e-3),
    # complex: compared as |actual - expected| <= atol + rtol |expected| (torch.testing),
    # each part computed in its part dtype, so the part dtype's tolerance
    torch.complex64: dict(atol=1e-5, rtol=1.3e-5),
    torch.complex128: dict(atol=1e-10, rtol=1e-9),
}


def tol(dtype):
    """A fresh dict (callers add keyword arguments to it; the table must not change)."""
    return dict(TOLERANCES.get(dtype, dict(atol=0, rtol=0)))


def assert_close(actual, expected, dtype=None, **override):
    """Compares a tpu result with the CPU reference using the table (exact for ints/bool)."""
    kw = tol(dtype or expected.dtype)
    kw.update(override)
    torch.testing.assert_close(actual.cpu(), expected, **kw)


def max_error(x, ref):
    """Largest |x - ref|, computed in float64; a NaN or infinite difference counts as 0
    (callers that care about non-finite elements compare those themselves)."""
    return float((x.double() - ref.double()).abs().nan_to_num(0, 0, 0).max()) if x.numel() else 0.0


def within_cpu_error(tpu_err, cpu_err, atol):
    """The float64 re-check's rule (model validation and OpInfo): a result whose error
    against a more exact reference is at most twice CPU's own result's, plus atol, is as
    correct as CPU's."""
    return tpu_err <= 2 * cpu_err + atol


# Per-op overrides, only where truly needed, each with its reason:
# {(op, dtype): (dict(atol=..., rtol=...), "reason")}. `op` is an OpInfo key (see
# tests/opinfo/tables.py) or a test's own op name.
OP_TOLERANCES = {
    ("nn.functional.scaled_dot_product_attention", torch.float32): (
        dict(atol=5e-5, rtol=1.3e-5),
        "the fused attention backward sums over the sequence in a different order than "
        "CPU's math path; gradients near zero differ by a few 1e-5 absolute"),
}
# SVD's backward divides by differences of squared singular values, so the float32
# rounding differences between CPU's LAPACK (MKL) and the tpu's (OpenBLAS) grow by the
# inverse gaps: gradients through an SVD differ by up to ~1e-4 absolute / relative.
for _op in ("linalg.svd", "svd", "linalg.pinv.hermitian", "linalg.lstsq", "linalg.lstsq.grad_oriented"):
    OP_TOLERANCES[(_op, torch.float32)] = (
        dict(atol=1e-4, rtol=1e-4),
        "the SVD backward amplifies f32 differences between two LAPACK implementations")
del _op


def op_tol(op, dtype):
    """The tolerance for one op's results in one dtype: the override if any, else tol()."""
    over = OP_TOLERANCES.get((op, dtype))
    return dict(over[0]) if over is not None else dict(tol(dtype))
