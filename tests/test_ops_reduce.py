"""Reduce family on tpu vs PyTorch CPU: reductions, scans, softmax, histc; functional,
in-place and out= forms, non-contiguous inputs, dtype= arguments, backward, and error
classes."""
import math

import pytest
import torch

import torchtpu
from tolerances import assert_close, tol

FLOAT = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INT = [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool]
ALL = FLOAT + INT
LAYOUTS = ["contig", "strided", "transposed"]

# The ATen ops libtpurt's reduce family implements natively (runtime/src/aten/reduce.c).
REDUCE_OPS = [
    "sum", "sum.out", "sum.dim_IntList", "sum.IntList_out", "nansum", "nansum.out",
    "prod", "prod.out", "prod.dim_int", "prod.int_out", "mean", "mean.dtype_out", "mean.dim",
    "mean.out", "amax", "amax.out", "amin", "amin.out", "max", "max.unary_out", "min",
    "min.unary_out", "max.dim", "max.dim_max", "min.dim", "min.dim_min", "argmax",
    "argmax.out", "argmin", "argmin.out", "aminmax", "aminmax.out", "var.correction",
    "var.correction_out", "std.correction", "std.correction_out", "var_mean.correction",
    "var_mean.correction_out", "std_mean.correction", "std_mean.correction_out", "any",
    "any.all_out", "any.dim", "any.out", "any.dims", "any.dims_out", "all", "all.all_out",
    "all.dim", "all.out", "all.dims", "all.dims_out", "logsumexp", "logsumexp.out",
    "linalg_vector_norm", "linalg_vector_norm.out", "norm.Scalar", "norm.Scalar_out",
    "norm.ScalarOpt_dim", "norm.out", "norm.ScalarOpt_dim_dtype", "norm.dtype_out",
    "norm.ScalarOpt_dtype", "norm.ScalarOpt_dtype_out", "count_nonzero.dim_IntList",
    "count_nonzero.dim_IntList_out", "cumsum", "cumsum_", "cumsum.out", "cumprod",
    "cumprod_", "cumprod.out", "_logcumsumexp", "_logcumsumexp.out", "cummax", "cummax.out",
    "cummin", "cummin.out", "_softmax", "_softmax.out", "_log_softmax", "_log_softmax.out",
    "_softmax_backward_data", "_softmax_backward_data.out", "_log_softmax_backward_data",
    "_log_softmax_backward_data.out", "histc", "histc.out",
]


@pytest.fixture
def native_reduce():
    """Fails the test if any reduce-family op ran through the CPU fallback (other
    families' ops used by autograd formulas may still fall back while they are built)."""
    torchtpu.reset_fallback_report()
    yield
    torch.tpu.synchronize()
    report = torchtpu.fallback_report()
    bad = {k: v for k, v in report.items() if k.removeprefix("aten::") in REDUCE_OPS}
    assert not bad, f"reduce ops ran through the CPU fallback: {bad}"


def test_registered_natively():
    native = set(torchtpu.native_ops())
    missing = [n for n in REDUCE_OPS if n not in native]
    assert not missing, f"not registered for tpu: {missing}"


def make(shape, dtype, layout="contig", seed=0, lo=-4, hi=5):
    """(cpu, tpu) pair with the same values and the same kind of layout."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    if layout == "strided":
        full = shape[:-1] + (shape[-1] * 2,) if shape else shape
    elif layout == "transposed":
        full = tuple(reversed(shape))
    else:
        full = shape
    if dtype.is_floating_point:
        base = torch.randn(full, generator=g, dtype=torch.float64).to(dtype)
    elif dtype == torch.bool:
        base = torch.randint(0, 2, full, generator=g).bool()
    elif dtype == torch.uint8:
        base = torch.randint(0, hi, full, generator=g).to(dtype)
    else:
        base = torch.randint(lo, hi, full, generator=g).to(dtype)
    dev = base.to("tpu")

    def view(t):
        if layout == "strided" and shape:
            return t[..., ::2]
        if layout == "transposed":
            return t.permute(*reversed(range(t.dim())))
        return t

    c, d = view(base), view(dev)
    assert c.shape == shape and d.shape == shape
    return c, d


def check(actual, expected, **kw):
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            check(a, e, **kw)
        return
    assert actual.device.type == "tpu"
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert_close(actual, expected, equal_nan=True, **kw)


def same_error(fn, *cpu_args, **kwargs):
    """fn on CPU and on tpu args must raise the same exception class."""
    with pytest.raises(Exception) as ce:
        fn(*[a for a, _ in cpu_args], **kwargs)
    with pytest.raises(type(ce.value)):
        r = fn(*[b for _, b in cpu_args], **kwargs)
        torch.tpu.synchronize()
        if isinstance(r, torch.Tensor):
            r.cpu()


SHAPE = (3, 4, 5)
DIMS = [None, 0, -1, (0, 2), ()]


# ---- sum / nansum / mean / prod ------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_sum(dtype, layout, native_reduce):
    c, d = make(SHAPE, dtype, layout)
    check(d.sum(), c.sum())
    for dim in DIMS[1:]:
        for keep in (False, True):
            check(d.sum(dim, keepdim=keep), c.sum(dim, keepdim=keep))
            # CPU's nansum accumulates bf16/f16 in their own precision; tpu in f32 or
            # better, so half types are checked against the f32 reference instead.
            if dtype in (torch.bfloat16, torch.float16):
                ref = torch.nansum(c.float(), dim, keepdim=keep).to(dtype)
            else:
                ref = torch.nansum(c, dim, keepdim=keep)
            check(torch.nansum(d, dim, keepdim=keep), ref)


@pytest.mark.parametrize("dtype", FLOAT)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_mean(dtype, layout, native_reduce):
    c, d = make(SHAPE, dtype, layout)
    check(d.mean(), c.mean())
    for dim in DIMS[1:]:
        for keep in (False, True):
            check(d.mean(dim, keepdim=keep), c.mean(dim, keepdim=keep))


@pytest.mark.parametrize("dtype", ALL)
def test_prod(dtype, native_reduce):
    c, d = make((3, 4, 5), dtype, "transposed", lo=-2, hi=3)
    check(d.prod(), c.prod())
    for dim in (0, 1, -1):
        for keep in (False, True):
            check(d.prod(dim, keepdim=keep), c.prod(dim, keepdim=keep))


def test_dtype_args(native_reduce):
    c, d = make(SHAPE, torch.int32)
    check(d.sum(dtype=torch.float32), c.sum(dtype=torch.float32))
    check(d.sum(1, dtype=torch.int8), c.sum(1, dtype=torch.int8))
    check(d.mean(1, dtype=torch.float64), c.mean(1, dtype=torch.float64))
    check(d.prod(1, dtype=torch.float32), c.prod(1, dtype=torch.float32))
    cf, df = make(SHAPE, torch.float32)
    check(df.sum(0, dtype=torch.float64), cf.sum(0, dtype=torch.float64))
    check(df.sum(0, dtype=torch.bool), cf.sum(0, dtype=torch.bool))
    check(df.prod(0, dtype=torch.bool), cf.prod(0, dtype=torch.bool))
    check(df.sum(0, dtype=torch.float16), cf.sum(0, dtype=torch.float16))
    check(torch.cumsum(df, 1, dtype=torch.float64), torch.cumsum(cf, 1, dtype=torch.float64))


def test_out_forms(native_reduce):
    c, d = make(SHAPE, torch.float32)
    for dt in (torch.float32, torch.float64, torch.int64):
        oc, od = torch.empty(0, dtype=dt), torch.empty(0, dtype=dt, device="tpu")
        torch.sum(c, 1, out=oc)
        r = torch.sum(d, 1, out=od)
        assert r is od
        check(od, oc)
    oc, od = torch.empty(0, dtype=torch.float16), torch.empty(0, dtype=torch.float16, device="tpu")
    check(torch.mean(d, (0, 1), out=od), torch.mean(c, (0, 1), out=oc))
    check(torch.amax(d, 1, out=torch.empty(0, device="tpu")), torch.amax(c, 1))
    vo, io = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.long, device="tpu")
    r = torch.max(d, 2, keepdim=True, out=(vo, io))
    check((vo, io), tuple(torch.max(c, 2, keepdim=True)))
    assert r[0] is vo and r[1] is io
    check(torch.argmin(d, 0, out=torch.empty(0, dtype=torch.long, device="tpu")), torch.argmin(c, 0))
    check(torch.var(d, 1, out=torch.empty(0, device="tpu")), torch.var(c, 1))
    check(torch.logsumexp(d, 1, out=torch.empty(0, device="tpu")), torch.logsumexp(c, 1))
    check(torch.linalg.vector_norm(d, 3, 1, out=torch.empty(0, device="tpu")),
          torch.linalg.vector_norm(c, 3, 1))
    check(torch.any(d > 0, 1, out=torch.empty(0, dtype=torch.bool, device="tpu")), torch.any(c > 0, 1))
    check(torch.all(d, 1, out=torch.empty(0, dtype=torch.uint8, device="tpu")),
          torch.all(c, 1, out=torch.empty(0, dtype=torch.uint8)))
    check(torch.cumsum(d, 1, out=torch.empty(0, dtype=torch.int64, device="tpu")),
          torch.cumsum(c, 1, out=torch.empty(0, dtype=torch.int64)))
    check(torch.ops.aten._softmax.out(d, 1, False, out=torch.empty(0, device="tpu")), torch.softmax(c, 1))
    # out= into a non-contiguous view of a bigger tensor
    big_c, big_d = torch.zeros(6, 8), torch.zeros(6, 8, device="tpu")
    torch.sum(c, 0, out=big_c[:5, ::2].t())
    torch.sum(d, 0, out=big_d[:5, ::2].t())
    check(big_d, big_c)


# ---- min/max family ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_minmax(dtype, layout, native_reduce):
    c, d = make(SHAPE, dtype, layout)  # small ints: many ties
    check(d.max(), c.max())
    check(d.min(), c.min())
    for dim in (0, 1, -1):
        for keep in (False, True):
            check(tuple(d.max(dim, keep)), tuple(c.max(dim, keep)))
            check(tuple(d.min(dim, keep)), tuple(c.min(dim, keep)))
            check(d.amax(dim, keep), c.amax(dim, keep))
            check(d.amin((0, dim) if dim else dim, keep), c.amin((0, dim) if dim else dim, keep))
            check(tuple(torch.aminmax(d, dim=dim, keepdim=keep)), tuple(torch.aminmax(c, dim=dim, keepdim=keep)))
            if dtype != torch.bool:
                check(d.argmax(dim, keep), c.argmax(dim, keep))
                check(d.argmin(dim, keep), c.argmin(dim, keep))
    check(d.amax(()), c.amax(()))
    if dtype != torch.bool:
        check(d.argmax(), c.argmax())
        check(d.argmin(None, True), c.argmin(None, True))


def test_minmax_nan(native_reduce):
    c = torch.tensor([[1.0, math.nan, 3.0, math.nan], [2.0, -1.0, 7.0, 0.5]])
    d = c.to("tpu")
    for f in (torch.amax, torch.amin):
        check(f(d, 1), f(c, 1))
    check(d.max(), c.max())
    check(tuple(d.max(1)), tuple(c.max(1)))
    check(tuple(d.min(1)), tuple(c.min(1)))
    check(d.argmax(1), c.argmax(1))
    check(d.argmin(), c.argmin())


# ---- var / std ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_var_std(dtype, layout, native_reduce):
    c, d = make(SHAPE, dtype, layout)
    for dim in DIMS:
        for corr in (0, 1, 2.5):
            for keep in (False, True):
                kw = dict(dim=dim, correction=corr, keepdim=keep)
                check(torch.var(d, **kw), torch.var(c, **kw))
                check(torch.std(d, **kw), torch.std(c, **kw))
                check(tuple(torch.var_mean(d, **kw)), tuple(torch.var_mean(c, **kw)))
                check(tuple(torch.std_mean(d, **kw)), tuple(torch.std_mean(c, **kw)))
    one_c, one_d = make((1, 3), dtype)
    check(torch.var(one_d, 0), torch.var(one_c, 0))  # N - correction = 0 -> nan


# ---- any / all / count_nonzero ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL)
def test_any_all(dtype, native_reduce):
    c, d = make(SHAPE, dtype, "strided", lo=0, hi=2)
    if dtype.is_floating_point:
        c, d = c * 0.5, d * 0.5  # 0.5 is truthy
    for f in (torch.any, torch.all):
        check(f(d), f(c))
        for dim in (0, -1):
            for keep in (False, True):
                check(f(d, dim, keep), f(c, dim, keep))
        check(f(d, dim=(0, 2)), f(c, dim=(0, 2)))
        check(torch.ops.aten.any.dims(d, []), torch.ops.aten.any.dims(c, []))
    check(torch.count_nonzero(d, (0, 2)), torch.count_nonzero(c, (0, 2)))


# ---- logsumexp / norms -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL)
def test_logsumexp(dtype, native_reduce):
    c, d = make(SHAPE, dtype, "transposed")
    for dim in (0, -1, (0, 2)):
        for keep in (False, True):
            check(torch.logsumexp(d, dim, keep), torch.logsumexp(c, dim, keep))
    if dtype.is_floating_point:
        c = torch.tensor([[math.inf, 1.0], [-math.inf, -math.inf], [math.nan, 0.0]], dtype=dtype)
        check(torch.logsumexp(c.to("tpu"), 1), torch.logsumexp(c, 1))


@pytest.mark.parametrize("dtype", FLOAT)
def test_vector_norm(dtype, native_reduce):
    c, d = make(SHAPE, dtype, "strided")
    c[0, 0, 0] = 0
    d[0, 0, 0] = 0
    for ord in (2, 1, 0, math.inf, -math.inf, 3, 0.5, -1):
        for dim in (None, 1, (0, 2)):
            check(torch.linalg.vector_norm(d, ord, dim), torch.linalg.vector_norm(c, ord, dim))
    check(torch.linalg.vector_norm(d, 2, 1, True), torch.linalg.vector_norm(c, 2, 1, True))
    check(torch.ops.aten.norm.Scalar(d, 3), torch.ops.aten.norm.Scalar(c, 3))
    check(torch.ops.aten.norm.ScalarOpt_dim(d, None, [1]), torch.ops.aten.norm.ScalarOpt_dim(c, None, [1]))
    check(torch.ops.aten.norm.ScalarOpt_dtype(d, 2, dtype=torch.float64),
          torch.ops.aten.norm.ScalarOpt_dtype(c, 2, dtype=torch.float64))
    check(torch.linalg.vector_norm(d, dtype=torch.float64), torch.linalg.vector_norm(c, dtype=torch.float64))


# ---- scans --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cumsum_cumprod(dtype, layout, native_reduce):
    c, d = make(SHAPE, dtype, layout, lo=-2, hi=3)
    for dim in (0, 1, -1):
        check(torch.cumsum(d, dim), torch.cumsum(c, dim))
        check(torch.cumprod(d, dim), torch.cumprod(c, dim))
        check(tuple(torch.cummax(d, dim)), tuple(torch.cummax(c, dim)))
        check(tuple(torch.cummin(d, dim)), tuple(torch.cummin(c, dim)))
        if dtype.is_floating_point:
            check(torch.logcumsumexp(d, dim), torch.logcumsumexp(c, dim))
    if dtype != torch.bool:
        c2, d2 = c.clone(), d.clone()
        c2.cumsum_(1)
        r = d2.cumsum_(1)
        assert r is d2
        check(d2, c2)
        c2.cumprod_(0)
        d2.cumprod_(0)
        check(d2, c2)
    check(torch.cumsum(torch.tensor(3.0, device="tpu"), 0), torch.cumsum(torch.tensor(3.0), 0))


# ---- softmax ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_softmax(dtype, layout, native_reduce):
    c, d = make(SHAPE, dtype, layout)
    for dim in (0, 1, -1):
        check(torch.softmax(d, dim), torch.softmax(c, dim))
        check(torch.log_softmax(d, dim), torch.log_softmax(c, dim))
    c = torch.tensor([[-math.inf, -math.inf], [-math.inf, 0.0], [math.inf, 1.0]], dtype=dtype)
    check(torch.softmax(c.to("tpu"), 1), torch.softmax(c, 1))
    check(torch.log_softmax(c.to("tpu"), 1), torch.log_softmax(c, 1))
    s = torch.tensor(2.0, dtype=dtype)
    check(torch.softmax(s.to("tpu"), 0), torch.softmax(s, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_backward_ops(dtype, native_reduce):
    g_c, g_d = make(SHAPE, dtype, "transposed", seed=1)
    y_c = torch.softmax(make(SHAPE, dtype, seed=2)[0], 1)
    y_d = y_c.to("tpu")
    for op, kw in ((torch.ops.aten._softmax_backward_data, "grad_input"),
                   (torch.ops.aten._log_softmax_backward_data, "out")):
        check(op(g_d, y_d, 1, dtype), op(g_c, y_c, 1, dtype))
        out = torch.empty(0, dtype=dtype, device="tpu")
        op.out(g_d, y_d, 1, dtype, **{kw: out})
        check(out, op(g_c, y_c, 1, dtype))


# ---- backward through autograd -------------------------------------------------------------------

GRAD_CASES = {
    "sum": lambda x: x.sum(1),
    "mean": lambda x: x.mean((0, 2)),
    "prod": lambda x: x.prod(1),
    "amax": lambda x: x.amax(1),
    "max_dim": lambda x: x.max(2)[0],
    "var": lambda x: torch.var(x, 1),
    "std_mean": lambda x: sum(torch.std_mean(x, 0)),
    "logsumexp": lambda x: torch.logsumexp(x, 2),
    "norm": lambda x: torch.linalg.vector_norm(x, 2, 1),
    "cumsum": lambda x: torch.cumsum(x, 1),
    "cumprod": lambda x: torch.cumprod(x, 2),
    "softmax": lambda x: torch.softmax(x, 1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_backward(name, native_reduce):
    f = GRAD_CASES[name]
    c, d = make(SHAPE, torch.float64, seed=3)
    c.requires_grad_(True)
    d = d.detach().requires_grad_(True)
    yc, yd = f(c), f(d)
    gc_, gd_ = make(yc.shape, torch.float64, seed=4)
    (grad_c,) = torch.autograd.grad(yc, c, gc_)
    (grad_d,) = torch.autograd.grad(yd, d, gd_)
    check(grad_d, grad_c)


# ---- accuracy and errors -------------------------------------------------------------------------

def test_long_sum_accuracy(native_reduce):
    c = torch.rand(200003, generator=torch.Generator().manual_seed(5)) - 0.3
    ref = c.double().sum()
    got = c.to("tpu").sum().cpu().double()
    assert abs(got - ref) <= 1e-6 * abs(ref)


@pytest.mark.parametrize("shape,dim", [((200003,), None), ((3, 70001), -1), ((2, 3, 9000), (1, 2))])
def test_long_bf16_rows(shape, dim, native_reduce):
    """bf16 rows longer than one 16384-element group are summed from the bf16 data itself
    (no float copy): integer values keep the sums exact in bf16, with nonzeros at group,
    256-block and row ends, so a dropped or doubled element changes the result."""
    g = torch.Generator().manual_seed(7)
    c = torch.zeros(shape).flatten()
    n = c.numel()
    ends = [0, 16383, 16384, 32767, n - 1, n - 2, n - 257, n - 256] + [n // 3 - 1, n // 3, 2 * n // 3]
    hot = torch.cat([torch.tensor(ends), torch.randint(0, n, (40,), generator=g)])
    c[hot] = torch.randint(1, 3, hot.shape, generator=g).float()
    c = c.reshape(shape).bfloat16()
    d = c.to("tpu")
    kw = {} if dim is None else {"dim": dim}
    for f in (torch.sum, torch.nansum, torch.mean, torch.var, torch.std,
              lambda x, **k: torch.linalg.vector_norm(x, 1, **k),
              lambda x, **k: torch.linalg.vector_norm(x, 2, **k),
              lambda x, **k: torch.linalg.vector_norm(x, 3, **k)):
        got, ref = f(d, **kw).cpu(), f(c.double(), **kw)
        torch.testing.assert_close(got.double(), ref, rtol=8e-3, atol=0)
        # the same values as the float32 path, rounded to bf16
        assert torch.equal(got, f(d.float(), **kw).bfloat16().cpu())
    assert torch.equal(d.sum(**kw).cpu().double(), c.double().sum(**kw))
    nan = c.clone()
    nan.view(-1)[[5, n - 1]] = float("nan")
    torch.testing.assert_close(torch.nansum(nan.to("tpu"), **kw).cpu().double(),
                               torch.nansum(nan.double(), **kw), rtol=8e-3, atol=0)
    assert torch.isnan(nan.to("tpu").sum()).item()


def test_errors():
    xi_c = torch.arange(6).reshape(2, 3)
    xi = (xi_c, xi_c.to("tpu"))
    e_c = torch.zeros(0, 3)
    e = (e_c, e_c.to("tpu"))
    f_c = torch.randn(2, 3)
    f = (f_c, f_c.to("tpu"))
    b = (f_c > 0, (f_c > 0).to("tpu"))
    same_error(lambda x: torch.mean(x), xi)
    same_error(lambda x: torch.var(x, 0), xi)
    same_error(lambda x: torch.amax(x, 0), e)
    same_error(lambda x: torch.max(x), e)
    same_error(lambda x: torch.max(x, 0), e)
    same_error(lambda x: torch.argmax(x), e)
    same_error(lambda x: torch.argmax(x), b)
    same_error(lambda x: torch.sum(x, (0, 0)), f)
    same_error(lambda x: torch.sum(x, 2), f)
    same_error(lambda x: torch.softmax(x, 2), f)
    same_error(lambda x: torch.linalg.vector_norm(x), xi)
    same_error(lambda x: torch.linalg.vector_norm(x, math.inf), e)
    same_error(lambda x: torch.cumsum(x, 3), f)
    same_error(lambda x: torch.ops.aten._softmax(x, 0, True), f)
    same_error(lambda x: torch.amax(x, 0, out=torch.empty(0, dtype=torch.long, device=x.device)), f)
    same_error(lambda x: torch.argmax(x, 0, out=torch.empty(0, device=x.device)), f)
    same_error(lambda x: torch.any(x, 0, out=torch.empty(0, device=x.device)), f)
    same_error(lambda x: x.int().cumsum_(0, dtype=torch.float32), f)


# ---- histc ------------------------------------------------------------------------------------


def bitwise(actual, expected):
    assert actual.device.type == "tpu"
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual.cpu(), expected), (actual.cpu(), expected)


@pytest.mark.parametrize("dtype", FLOAT)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_histc_float(dtype, layout, native_reduce):
    """Floating histc equals CPU's exactly: bins from (x - min) * bins / (max - min) in
    the input dtype's arithmetic, x == max counted in the last bin, values outside (and
    NaN) dropped, counts kept in the input dtype."""
    c, d = make((6, 40), dtype, layout, lo=-4, hi=5)
    for bins, lo, hi in [(10, 0, 0), (7, -1.5, 2.25), (1, -3, 3), (13, 0.1, 0.3), (100, -2, 2), (4, 2, 2)]:
        bitwise(torch.histc(d, bins=bins, min=lo, max=hi), torch.histc(c, bins=bins, min=lo, max=hi))
        bitwise(torch.histc(d.round(), bins=bins, min=lo, max=hi), torch.histc(c.round(), bins=bins, min=lo, max=hi))
    edges = torch.tensor([-1.0, 0.0, 0.5, 1.0, 1.0, 2.0, float("nan"), float("inf")], dtype=dtype)
    bitwise(torch.histc(edges.to("tpu"), bins=4, min=-1, max=1), torch.histc(edges, bins=4, min=-1, max=1))
    out = torch.empty(0, dtype=dtype, device="tpu")
    assert torch.histc(d, bins=5, out=out) is out
    bitwise(out, torch.histc(c, bins=5))
    e = torch.empty(0, dtype=dtype)
    bitwise(torch.histc(e.to("tpu"), bins=3), torch.histc(e, bins=3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_histc_half_counts_saturate(dtype, native_reduce):
    """CPU counts in the input dtype: past 256 (bf16) / 2048 (f16) adding 1 rounds away.
    CPU keeps one partial histogram per thread, so its saturated counts depend on the
    thread count; the kernel counts in one sequence, as CPU with one thread does."""
    x = torch.zeros(3000, dtype=dtype)
    x[::3] = 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = torch.histc(x, bins=3)
    finally:
        torch.set_num_threads(threads)
    bitwise(torch.histc(x.to("tpu"), bins=3), want)


def cuda_histc(x, bins, lo, hi):
    """CUDA's integer histc (SummaryOps.cu), the reference for integer inputs, which CPU
    does not implement: bounds narrowed to the dtype, min == max -> data range (then -1/+1),
    bin = (v - min) * bins // (max - min) in int64, v == max in the last bin."""
    info = torch.iinfo(x.dtype)

    def narrow(v):
        return (v - info.min) % (info.max - info.min + 1) + info.min
    v = x.flatten().tolist()
    lo, hi = narrow(int(lo)), narrow(int(hi))
    if int(lo) == int(hi) and v:
        lo, hi = min(v), max(v)
    if lo == hi:
        lo, hi = narrow(lo - 1), narrow(hi + 1)
    out = [0] * bins
    for e in v:
        if lo <= e <= hi:
            b = (e - lo) * bins // (hi - lo)
            out[min(b, bins - 1)] += 1
    return torch.tensor([narrow(o) for o in out], dtype=x.dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_histc_integer(dtype, native_reduce):
    """Integer histc as CUDA computes it (output in the input dtype)."""
    g = torch.Generator().manual_seed(0)
    lo = 0 if dtype is torch.uint8 else -50
    x = torch.randint(lo, 60, (300,), generator=g).to(dtype)
    for bins, a, b in [(10, 0, 0), (7, -5, 40), (3, 1, 2), (16, 0, 15), (5, 2.7, 30.2), (4, 12, 12)]:
        if dtype is torch.uint8 and a < 0:
            continue
        got = torch.histc(x.to("tpu"), bins=bins, min=a, max=b)
        bitwise(got, cuda_histc(x, bins, a, b))
    bitwise(torch.histc(x.to("tpu")[::3], bins=6), cuda_histc(x[::3], 6, 0, 0))


@pytest.mark.parametrize("experts", [1, 2, 8, 60, 128])
def test_histc_counts_experts(experts, native_reduce):
    """The Mixture-of-Experts idiom: histc(ids.int(), bins=E, min=0, max=E-1) counts tokens
    per expert, equal to CPU's float histc of the same ids and to bincount."""
    ids = torch.randint(0, experts, (64, 2), generator=torch.Generator().manual_seed(experts))
    got = torch.histc(ids.int().to("tpu"), bins=experts, min=0, max=experts - 1)
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu().long(), torch.bincount(ids.flatten(), minlength=experts))
    assert torch.equal(got.cpu().float(), torch.histc(ids.float(), bins=experts, min=0, max=experts - 1))
    got = torch.histc(ids.int().to("tpu"), bins=experts, min=0, max=experts)
    assert torch.equal(got.cpu().float(), torch.histc(ids.float(), bins=experts, min=0, max=experts))


def test_histc_errors():
    f_c = torch.randn(5)
    f = (f_c, f_c.to("tpu"))
    nan_c = torch.tensor([1.0, float("nan")])
    same_error(lambda x: torch.histc(x, bins=0), f)
    same_error(lambda x: torch.histc(x, bins=-3), f)
    same_error(lambda x: torch.histc(x, bins=3, min=2, max=1), f)
    same_error(lambda x: torch.histc(x, bins=3, min=float("-inf"), max=1), f)
    same_error(lambda x: torch.histc(x, bins=3, min=0, max=7e4), (f_c.half(), f_c.half().to("tpu")))
    same_error(lambda x: torch.histc(x, bins=3), (nan_c, nan_c.to("tpu")))  # data range, found at run time
    same_error(lambda x: torch.histc(x, bins=3, out=torch.empty(3, dtype=torch.float64, device=x.device)), f)
