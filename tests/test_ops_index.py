"""Index and shape ops on tpu against PyTorch CPU: gather/scatter family, index_select,
index_add/index_copy, advanced indexing and index_put, masked ops, nonzero, cat, flip,
roll, repeat, constant_pad_nd, tril/triu, sort/topk, arange, eye, linspace/logspace,
searchsorted/bucketize, isin, repeat_interleave, bincount, unique_consecutive,
_assert_async.

Each test runs the op on CPU and on tpu from the same inputs (all dtypes the backend
supports; plain, in-place and out= forms; broadcasting; non-contiguous inputs), checks
the result, checks that the native kernel ran (not the CPU fallback), and checks error
classes against CPU."""
import pytest
import torch

import torchtpu
from tolerances import assert_close
from op_helpers import native

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
          torch.int32, torch.int8, torch.uint8, torch.bool]
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
NUMERIC = [d for d in DTYPES if d is not torch.bool]

# The ATen ops this family registers natively; none may go through the CPU fallback.
NATIVE = {"gather", "scatter", "scatter_add", "scatter_reduce", "index_select", "index_add",
          "index_copy", "index", "_index_put_impl", "masked_select", "masked_scatter", "nonzero",
          "cat", "flip", "roll", "repeat", "constant_pad_nd", "tril", "triu", "sort", "topk",
          "arange", "eye", "linspace", "logspace", "searchsorted", "bucketize", "isin",
          "repeat_interleave", "unfold_backward", "bincount", "unique_consecutive", "_assert_async"}


def _ours(key):
    """'aten::scatter_.src' -> True when the op belongs to this family."""
    name = key.split("::")[-1]
    base = name.split(".")[0].rstrip("_")
    return base in NATIVE and (base != "index" or name.startswith("index.Tensor"))


@pytest.fixture(autouse=True)
def native_only():
    torchtpu.reset_fallback_report()
    yield
    torch.tpu.synchronize()
    bad = {k: v for k, v in torchtpu.fallback_report().items() if _ours(k)}
    assert not bad, f"index-family ops ran through the CPU fallback: {bad}"


def make(shape, dtype, seed=0, low=-5, high=5):
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype is torch.uint8:
        low = 0
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype)
    return torch.randint(low, high, shape, generator=g).to(dtype)


def tpu(t):
    return t.to("tpu")


def same(actual, expected, **kw):
    assert actual.device.type == "tpu"
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert_close(actual, expected, **kw)


def same_error(fn_cpu, fn_tpu):
    with pytest.raises(Exception) as cpu_err:
        fn_cpu()
    with pytest.raises(Exception) as tpu_err:
        fn_tpu()
        torch.tpu.synchronize()
    assert type(tpu_err.value) is type(cpu_err.value), (cpu_err.value, tpu_err.value)


# ---- gather / scatter ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather(dtype):
    x = make((4, 5), dtype)
    idx = torch.randint(0, 5, (3, 7), generator=torch.Generator().manual_seed(1))
    same(torch.gather(tpu(x), 1, tpu(idx)), torch.gather(x, 1, idx))
    # non-contiguous self and index, dim 0, int32 index
    xt, it = x.t(), torch.randint(0, 5, (2, 4)).t().contiguous().t()
    same(torch.gather(tpu(x).t(), 0, tpu(it)), torch.gather(xt, 0, it))
    out = tpu(torch.empty(0, dtype=dtype))
    torch.gather(tpu(x), 1, tpu(idx.int()), out=out)
    same(out, torch.gather(x, 1, idx.int()))


def test_gather_errors():
    x, bad = torch.zeros(2, 3), torch.tensor([[5]])
    same_error(lambda: torch.gather(x, 1, bad), lambda: torch.gather(tpu(x), 1, tpu(bad)))
    same_error(lambda: torch.gather(x, 1, torch.tensor([1])),
               lambda: torch.gather(tpu(x), 1, tpu(torch.tensor([1]))))


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_forms(dtype):
    x, src = make((3, 4), dtype), make((3, 4), dtype, seed=2)
    # a permutation per row keeps plain scatter deterministic
    idx = torch.stack([torch.randperm(4, generator=torch.Generator().manual_seed(i))[:3] for i in range(3)])
    same(torch.scatter(tpu(x), 1, tpu(idx), tpu(src)), torch.scatter(x, 1, idx, src))
    same(torch.scatter(tpu(x), 1, tpu(idx), 2), torch.scatter(x, 1, idx, 2))
    y = tpu(x)
    y.scatter_(1, tpu(idx), tpu(src))
    same(y, x.clone().scatter_(1, idx, src))
    out = tpu(torch.empty(0, dtype=dtype))
    torch.scatter(tpu(x), 1, tpu(idx), tpu(src), out=out)
    same(out, torch.scatter(x, 1, idx, src))
    dup = torch.randint(0, 3, (5, 4), generator=torch.Generator().manual_seed(3))
    s2 = make((5, 4), dtype, seed=4)
    if dtype is not torch.bool:
        same(torch.scatter_add(tpu(x), 0, tpu(dup), tpu(s2)), torch.scatter_add(x, 0, dup, s2))
        y = tpu(x)
        y.scatter_add_(0, tpu(dup), tpu(s2))
        same(y, torch.scatter_add(x, 0, dup, s2))
        for red in ("add", "multiply"):
            same(torch.scatter(tpu(x), 0, tpu(dup), tpu(s2), reduce=red),
                 torch.scatter(x, 0, dup, s2, reduce=red))
            same(torch.scatter(tpu(x), 0, tpu(dup), 3, reduce=red), torch.scatter(x, 0, dup, 3, reduce=red))


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(dtype, reduce, include_self):
    x = make((4, 3), dtype)
    src = make((6, 3), dtype, seed=5, low=1, high=4)
    idx = torch.randint(0, 4, (6, 3), generator=torch.Generator().manual_seed(6))
    exp = torch.scatter_reduce(x, 0, idx, src, reduce, include_self=include_self)
    same(torch.scatter_reduce(tpu(x), 0, tpu(idx), tpu(src), reduce, include_self=include_self), exp)
    y = tpu(x)
    y.scatter_reduce_(0, tpu(idx), tpu(src), reduce, include_self=include_self)
    same(y, exp)


def test_scatter_errors():
    x = torch.zeros(2, 3)
    same_error(lambda: x.clone().scatter_(1, torch.tensor([[5]]), 1.0),
               lambda: tpu(x).scatter_(1, tpu(torch.tensor([[5]])), 1.0))
    same_error(lambda: x.scatter(1, torch.tensor([[1]]), torch.ones(1, 1, dtype=torch.float64)),
               lambda: tpu(x).scatter(1, tpu(torch.tensor([[1]])), tpu(torch.ones(1, 1, dtype=torch.float64))))


def test_gather_scatter_backward():
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(0, 5, (4, 3))
    xt = tpu(x.detach()).requires_grad_()
    g = torch.randn(4, 3, dtype=torch.float64)
    (gc,) = torch.autograd.grad(torch.gather(x, 1, idx), x, g)
    (gt,) = torch.autograd.grad(torch.gather(xt, 1, tpu(idx)), xt, tpu(g))
    same(gt, gc)
    src = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    st = tpu(src.detach()).requires_grad_()
    g2 = torch.randn(4, 5, dtype=torch.float64)
    (gc,) = torch.autograd.grad(torch.scatter_add(x.detach(), 1, idx, src), src, g2)
    (gt,) = torch.autograd.grad(torch.scatter_add(tpu(x.detach()), 1, tpu(idx), st), st, tpu(g2))
    same(gt, gc)


# ---- index_select / index_add / index_copy ------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select(dtype):
    x = make((4, 6), dtype)
    idx = torch.tensor([3, 0, 3, 5])
    same(torch.index_select(tpu(x), 1, tpu(idx)), torch.index_select(x, 1, idx))
    same(torch.index_select(tpu(x).t(), 0, tpu(idx.int())), torch.index_select(x.t(), 0, idx.int()))
    out = tpu(torch.empty(0, dtype=dtype))
    torch.index_select(tpu(x), 0, tpu(idx[:2]), out=out)
    same(out, torch.index_select(x, 0, idx[:2]))
    same_error(lambda: torch.index_select(x, 0, torch.tensor([9])),
               lambda: torch.index_select(tpu(x), 0, tpu(torch.tensor([9]))))


@pytest.mark.parametrize("dtype", NUMERIC)
def test_index_add_copy(dtype):
    x, src = make((5, 3), dtype), make((4, 3), dtype, seed=8)
    idx = torch.tensor([4, 0, 4, 2])
    alpha = 2 if not dtype.is_floating_point else 0.5
    same(torch.index_add(tpu(x), 0, tpu(idx), tpu(src), alpha=alpha), torch.index_add(x, 0, idx, src, alpha=alpha))
    y = tpu(x)
    y.index_add_(0, tpu(idx), tpu(src))
    same(y, torch.index_add(x, 0, idx, src))
    uidx = torch.tensor([4, 0, 1, 2])
    same(torch.index_copy(tpu(x), 0, tpu(uidx), tpu(src)), torch.index_copy(x, 0, uidx, src))
    y = tpu(x)
    y.index_copy_(0, tpu(uidx), tpu(src))
    same(y, torch.index_copy(x, 0, uidx, src))
    same_error(lambda: x.clone().index_copy_(0, torch.tensor([9]), src[:1]),
               lambda: tpu(x).index_copy_(0, tpu(torch.tensor([9])), tpu(src[:1])))


def test_index_add_backward():
    x = torch.randn(5, 3, dtype=torch.float64)
    src = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    st = tpu(src.detach()).requires_grad_()
    idx = torch.tensor([4, 0, 4, 2])
    g = torch.randn(5, 3, dtype=torch.float64)
    (gc,) = torch.autograd.grad(torch.index_add(x, 0, idx, src), src, g)
    (gt,) = torch.autograd.grad(torch.index_add(tpu(x), 0, tpu(idx), st), st, tpu(g))
    same(gt, gc)


# ---- advanced indexing ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_advanced_index(dtype):
    x = make((3, 4, 5), dtype)
    a, b = torch.tensor([2, 0, -1]), torch.tensor([[1], [4]])
    m = make((3, 4), torch.bool, seed=9)
    xt = tpu(x)
    same(xt[tpu(a)], x[a])
    same(xt[tpu(a), :, tpu(b)], x[a, :, b])          # separated: broadcast dims first
    same(xt[:, tpu(b - 1), tpu(a[:1])], x[:, b - 1, a[:1]])  # adjacent: in place
    same(xt[tpu(m)], x[m])
    same(xt[1, tpu(m[0])], x[1, m[0]])
    same(xt.transpose(0, 2)[tpu(b)], x.transpose(0, 2)[b])
    same_error(lambda: x[torch.tensor([3])], lambda: xt[tpu(torch.tensor([3]))])
    same_error(lambda: x[torch.tensor([0.0])], lambda: xt[tpu(torch.tensor([0.0]))])


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(dtype, accumulate):
    x = make((4, 3), dtype)
    idx = (torch.tensor([0, 3, 3, 1]), torch.tensor([2, 1, 1, 0]))
    if not accumulate:
        idx = (torch.tensor([0, 3, 1]), torch.tensor([2, 1, 0]))
    v = make((len(idx[0]),), dtype, seed=3)
    y = tpu(x)
    y.index_put_(tuple(tpu(i) for i in idx), tpu(v), accumulate=accumulate)
    same(y, x.clone().index_put_(idx, v, accumulate=accumulate))
    m = make((4,), torch.bool, seed=4)
    row = make((3,), dtype, seed=5)
    y = tpu(x)
    y[tpu(m)] = tpu(row)
    xc = x.clone()
    xc[m] = row
    same(y, xc)
    same(torch.index_put(tpu(x), (tpu(idx[0]),), tpu(row), accumulate=accumulate),
         torch.index_put(x, (idx[0],), row, accumulate=accumulate))


def test_index_put_errors():
    x = torch.zeros(2, 3)
    same_error(lambda: x.clone().index_put_((torch.tensor([5]),), torch.tensor(1.0)),
               lambda: tpu(x).index_put_((tpu(torch.tensor([5])),), tpu(torch.tensor(1.0))))
    same_error(lambda: x.clone().index_put_((torch.tensor([1]),), torch.tensor([1.0, 2.0])),
               lambda: tpu(x).index_put_((tpu(torch.tensor([1])),), tpu(torch.tensor([1.0, 2.0]))))


def test_index_backward():
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    xt = tpu(x.detach()).requires_grad_()
    idx = torch.tensor([3, 0, 3])
    g = torch.randn(3, 5, dtype=torch.float64)
    (gc,) = torch.autograd.grad(x[idx], x, g)
    (gt,) = torch.autograd.grad(xt[tpu(idx)], xt, tpu(g))
    same(gt, gc)


# ---- masked ops, nonzero ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_select_nonzero(dtype):
    x = make((3, 4), dtype)
    m = make((4,), torch.bool, seed=11)
    same(torch.masked_select(tpu(x), tpu(m)), torch.masked_select(x, m))
    out = tpu(torch.empty(0, dtype=dtype))
    torch.masked_select(tpu(x).t(), tpu(m[:3]), out=out)
    same(out, torch.masked_select(x.t(), m[:3]))
    same(torch.nonzero(tpu(x)), torch.nonzero(x))
    same(torch.nonzero(tpu(x).t()), torch.nonzero(x.t()))
    out = tpu(torch.empty(0, dtype=torch.int64))
    torch.nonzero(tpu(x), out=out)
    same(out, torch.nonzero(x))
    src = make((12,), dtype, seed=12)
    mm = make((3, 4), torch.bool, seed=13)
    y = tpu(x)
    y.masked_scatter_(tpu(mm), tpu(src))
    same(y, x.clone().masked_scatter_(mm, src))
    same_error(lambda: torch.masked_select(x, m.float()), lambda: torch.masked_select(tpu(x), tpu(m.float())))


def test_nonzero_special_floats():
    x = torch.tensor([0.0, -0.0, float("nan"), 1e-30, float("inf")])
    same(torch.nonzero(tpu(x)), torch.nonzero(x))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_bincount(dtype):
    x = make((40,), dtype, low=0, high=9)
    x_nc = make((80,), dtype, seed=1, low=0, high=9)[::2]  # strided input
    weights = [None, make((40,), torch.float32, seed=2), make((40,), torch.float64, seed=3),
               make((40,), torch.int64, seed=4), make((40,), torch.float16, seed=5)]
    for w in weights:  # int64 counts; float32 weights sum as float32, others as float64
        for minlength in (0, 5, 20):
            same(torch.bincount(tpu(x), None if w is None else tpu(w), minlength=minlength),
                 torch.bincount(x, w, minlength=minlength), rtol=0, atol=0)
    same(torch.bincount(tpu(x_nc)), torch.bincount(x_nc), rtol=0, atol=0)
    e = torch.empty(0, dtype=dtype)  # empty: int64 zeros of minlength, whatever the weights
    same(torch.bincount(tpu(e), tpu(torch.empty(0)), minlength=3), torch.bincount(e, torch.empty(0), minlength=3))


def test_bincount_errors():
    x = torch.tensor([1, 2, 2])
    same_error(lambda: torch.bincount(torch.tensor([1, -1])), lambda: torch.bincount(tpu(torch.tensor([1, -1]))))
    same_error(lambda: torch.bincount(x.view(1, 3)), lambda: torch.bincount(tpu(x).view(1, 3)))
    same_error(lambda: torch.bincount(x, minlength=-1), lambda: torch.bincount(tpu(x), minlength=-1))
    same_error(lambda: torch.bincount(x, torch.rand(2)), lambda: torch.bincount(tpu(x), tpu(torch.rand(2))))


# ---- cat, flip, roll, repeat, pad, tril/triu ------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat(dtype):
    a, b = make((2, 3), dtype), make((2, 5), dtype, seed=1)
    same(torch.cat([tpu(a), tpu(b)], 1), torch.cat([a, b], 1))
    same(torch.cat([tpu(a).t(), tpu(b).t()]), torch.cat([a.t(), b.t()]))
    e = torch.empty(0, dtype=dtype)
    same(torch.cat([tpu(a), tpu(e), tpu(a)], -2), torch.cat([a, e, a], -2))
    other = make((1, 3), torch.float64, seed=2)
    same(torch.cat([tpu(a), tpu(other)]), torch.cat([a, other]))
    out = tpu(torch.empty(0, dtype=dtype))
    torch.cat([tpu(a), tpu(a)], out=out)
    same(out, torch.cat([a, a]))
    same_error(lambda: torch.cat([a, b]), lambda: torch.cat([tpu(a), tpu(b)]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int8, torch.bool,
                                   torch.complex64])
def test_strided_copies_large(dtype):
    # The same-dtype strided copy behind transposed .contiguous(), expand, cat and pack:
    # large enough to split over the pool, attention-style transposes, broadcasts, one
    # long strided row (split into pieces with a tail), and cat of transposed inputs into
    # a transposed out= destination.
    g = torch.Generator().manual_seed(3)
    if dtype.is_complex:
        x = torch.randn(8, 4, 64, 33, dtype=dtype, generator=g)
    else:
        x = make((8, 4, 64, 33), dtype, seed=3)
    xt = tpu(x)
    same(xt.transpose(1, 2).contiguous(), x.transpose(1, 2).contiguous())
    same(xt.permute(3, 1, 0, 2).contiguous(), x.permute(3, 1, 0, 2).contiguous())
    same(xt[:, :, :, :32].contiguous(), x[:, :, :, :32].contiguous())
    row = make((2 * 300_001,), dtype, seed=4) if not dtype.is_complex else torch.randn(600_002, dtype=dtype, generator=g)
    same(tpu(row)[::2].contiguous(), row[::2].contiguous())
    col = x[:1, :1, :, :1]
    same(tpu(col).expand(8, 4, 64, 33).contiguous(), col.expand(8, 4, 64, 33).contiguous())
    parts = [x[:, i].transpose(0, 1) for i in range(3)]
    same(torch.cat([tpu(p) for p in parts], 2), torch.cat(parts, 2))
    out = tpu(torch.zeros(3 * 33, 8, 64, dtype=dtype)).permute(1, 2, 0)
    torch.cat([tpu(p) for p in parts], 2, out=out)
    same(out, torch.cat(parts, 2))
    y = tpu(torch.zeros(64, 8, 33, dtype=dtype)).transpose(0, 1)
    y.copy_(xt[:, 1])
    same(y, x[:, 1])


def test_cat_backward():
    a = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    at = tpu(a.detach()).requires_grad_()
    g = torch.randn(4, 3, dtype=torch.float64)
    (gc,) = torch.autograd.grad(torch.cat([a, a * 1]), a, g)
    (gt,) = torch.autograd.grad(torch.cat([at, at * 1]), at, tpu(g))
    same(gt, gc)


@pytest.mark.parametrize("dtype", DTYPES)
def test_flip_roll_repeat(dtype):
    x = make((3, 4, 2), dtype)
    xt = tpu(x)
    same(torch.flip(xt, (0, 2)), torch.flip(x, (0, 2)))
    same(torch.flip(xt.transpose(0, 1), (-1,)), torch.flip(x.transpose(0, 1), (-1,)))
    same(torch.roll(xt, 5), torch.roll(x, 5))
    same(torch.roll(xt, (1, -3), (0, 1)), torch.roll(x, (1, -3), (0, 1)))
    same(torch.roll(xt.transpose(0, 2), 1, 1), torch.roll(x.transpose(0, 2), 1, 1))
    same(xt.repeat(2, 1, 1, 3), x.repeat(2, 1, 1, 3))
    same(xt.transpose(0, 1).repeat(1, 2, 1), x.transpose(0, 1).repeat(1, 2, 1))
    same_error(lambda: torch.flip(x, (0, 0)), lambda: torch.flip(xt, (0, 0)))
    same_error(lambda: x.repeat(2), lambda: xt.repeat(2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_pad_tril_triu(dtype):
    x = make((3, 4), dtype)
    xt = tpu(x)
    value = True if dtype is torch.bool else 3
    same(torch.constant_pad_nd(xt, (1, 2, -1, 1), value), torch.constant_pad_nd(x, (1, 2, -1, 1), value))
    same(torch.nn.functional.pad(xt.t(), (2, 0)), torch.nn.functional.pad(x.t(), (2, 0)))
    for k in (-1, 0, 2):
        same(torch.tril(xt, k), torch.tril(x, k))
        same(torch.triu(xt.t(), k), torch.triu(x.t(), k))
    y = tpu(x)
    y.tril_(1)
    same(y, torch.tril(x, 1))
    out = tpu(torch.empty(0, dtype=dtype))
    torch.triu(xt, -1, out=out)
    same(out, torch.triu(x, -1))
    same_error(lambda: torch.tril(x[0]), lambda: torch.tril(xt[0]))
    same_error(lambda: torch.constant_pad_nd(x, (1,)), lambda: torch.constant_pad_nd(xt, (1,)))


def test_shape_backward():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    xt = tpu(x.detach()).requires_grad_()
    g = torch.randn(4, 7, dtype=torch.float64)
    f = lambda t: torch.nn.functional.pad(torch.flip(torch.tril(t), (0,)).roll(1, 1), (1, 2, 0, 1))  # noqa: E731
    (gc,) = torch.autograd.grad(f(x), x, g)
    (gt,) = torch.autograd.grad(f(xt), xt, tpu(g))
    same(gt, gc)


# ---- unfold_backward ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size,step", [(3, 1), (3, 2), (2, 2), (2, 3), (4, 4), (1, 1), (0, 2)])
def test_unfold_backward(dtype, size, step):
    # overlapping windows (step < size) sum; disjoint or gapped ones copy; ATen's op directly
    # (all dtypes, a strided grad) and through autograd of Tensor.unfold
    shape, dim = (3, 9, 4), 1
    nw = (shape[dim] - size) // step + 1
    g = make((3, nw, 4, size), dtype, seed=1)
    gt = tpu(g).transpose(0, 2).contiguous().transpose(0, 2)
    want = torch.ops.aten.unfold_backward(g, list(shape), dim, size, step)
    got = torch.ops.aten.unfold_backward(gt, list(shape), dim, size, step)
    same(got, want)
    if dtype.is_floating_point:
        x = make((5, 11), dtype, seed=2).requires_grad_()
        xt = tpu(x.detach()).requires_grad_()
        out = x.unfold(-1, size, step)
        gout = make(tuple(out.shape), dtype, seed=3)
        (gx,) = torch.autograd.grad(out, x, gout)
        (gxt,) = torch.autograd.grad(xt.unfold(-1, size, step), xt, tpu(gout))
        same(gxt, gx)


def test_unfold_backward_errors():
    g = torch.zeros(2, 3, 2)
    same_error(lambda: torch.ops.aten.unfold_backward(g, [2, 4], 1, 2, 0),
               lambda: torch.ops.aten.unfold_backward(tpu(g), [2, 4], 1, 2, 0))
    same_error(lambda: torch.ops.aten.unfold_backward(g, [2, 4], 2, 2, 1),
               lambda: torch.ops.aten.unfold_backward(tpu(g), [2, 4], 2, 2, 1))


# ---- sort / topk --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("descending", [False, True])
def test_sort(dtype, descending):
    x = make((5, 7), dtype, low=-3, high=3)  # many ties: checks stability
    if dtype.is_floating_point:
        x[1, 2] = float("nan")
        x[3, 0] = float("nan")
    xt = tpu(x)
    for dim in (0, 1):
        v, i = torch.sort(xt, dim=dim, descending=descending, stable=True)
        ve, ie = torch.sort(x, dim=dim, descending=descending, stable=True)
        same(v, ve, equal_nan=True)
        same(i, ie)
    v, i = torch.sort(xt.t(), descending=descending)
    same(v, torch.sort(x.t(), descending=descending).values, equal_nan=True)
    vo, io = tpu(torch.empty(0, dtype=dtype)), tpu(torch.empty(0, dtype=torch.int64))
    torch.sort(xt, stable=True, dim=1, descending=descending, out=(vo, io))
    same(io, torch.sort(x, stable=True, dim=1, descending=descending).indices)


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("largest", [True, False])
def test_topk(dtype, largest):
    n = 200 if dtype not in (torch.int8, torch.uint8) else 100
    x = torch.randperm(n, generator=torch.Generator().manual_seed(0)).reshape(-1, 10)
    x = (x - (0 if dtype is torch.uint8 else n // 2)).to(dtype)
    xt = tpu(x)
    v, i = torch.topk(xt, 3, dim=1, largest=largest)
    ve, ie = torch.topk(x, 3, dim=1, largest=largest)
    same(v, ve)
    same(i, ie)
    v, i = torch.topk(xt, 4, dim=0, largest=largest, sorted=False)
    ve, _ = torch.topk(x, 4, dim=0, largest=largest, sorted=False)
    same(v.cpu().sort(0).values.to("tpu"), ve.sort(0).values)
    same(torch.gather(xt, 0, i), v.cpu())
    same_error(lambda: torch.topk(x, 11), lambda: torch.topk(xt, 11))


def test_sort_topk_backward():
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    xt = tpu(x.detach()).requires_grad_()
    g = torch.randn(4, 2, dtype=torch.float64)
    (gc,) = torch.autograd.grad(torch.topk(x, 2).values, x, g)
    (gt,) = torch.autograd.grad(torch.topk(xt, 2).values, xt, tpu(g))
    same(gt, gc)
    g2 = torch.randn(4, 6, dtype=torch.float64)
    (gc,) = torch.autograd.grad(torch.sort(x, 0).values, x, g2)
    (gt,) = torch.autograd.grad(torch.sort(xt, 0).values, xt, tpu(g2))
    same(gt, gc)


# ---- factories ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMERIC)
def test_arange_eye(dtype):
    for args in [(10,), (2, 9), (9, -3, -2), (0, 1, 0.1) if dtype.is_floating_point else (1, 8, 3)]:
        same(torch.arange(*args, dtype=dtype, device="tpu"), torch.arange(*args, dtype=dtype))
    same(torch.eye(3, dtype=dtype, device="tpu"), torch.eye(3, dtype=dtype))
    same(torch.eye(2, 5, dtype=dtype, device="tpu"), torch.eye(2, 5, dtype=dtype))
    same_error(lambda: torch.arange(0, 5, -1, dtype=dtype), lambda: torch.arange(0, 5, -1, dtype=dtype, device="tpu"))
    same_error(lambda: torch.eye(-1, dtype=dtype), lambda: torch.eye(-1, dtype=dtype, device="tpu"))


def test_arange_default_dtypes():
    same(torch.arange(5, device="tpu"), torch.arange(5))
    same(torch.arange(0.5, 3, device="tpu"), torch.arange(0.5, 3))
    same(torch.eye(2, dtype=torch.bool, device="tpu"), torch.eye(2, dtype=torch.bool))


# ---- linspace / logspace ---------------------------------------------------------------------

RANGES = [(0, 1), (-3.3, 7.1), (5, -2), (0.1, 0.7), (-7, 9), (2, 2), (1e-3, 1e3), (-100, 100.5)]
STEPS = [0, 1, 2, 3, 16, 17, 33, 100, 1001, 40000]  # 40000: CPU splits it across threads


def exact(actual, expected):
    assert actual.device.type == "tpu"
    a = actual.cpu()
    assert a.dtype == expected.dtype and a.shape == expected.shape
    assert torch.equal(a.isnan(), expected.isnan()) if a.is_floating_point() else True
    ok = ~expected.isnan() if a.is_floating_point() else torch.ones_like(a, dtype=torch.bool)
    assert torch.equal(a[ok], expected[ok]), (a, expected)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_linspace_bit_exact(dtype):
    """CPU's two-sided formula (count up from start, down from end), its fused
    multiply-adds for float/double, Half/BFloat16 rounding of every step, truncation for
    integers: the tpu result is identical, not just close."""
    for start, end in RANGES:
        if not dtype.is_floating_point:
            lo = 0 if dtype is torch.uint8 else -100
            start, end = max(lo, min(start, 120)), max(lo, min(end, 120))
        for steps in STEPS:
            exact(torch.linspace(start, end, steps, dtype=dtype, device="tpu"),
                  torch.linspace(start, end, steps, dtype=dtype))
    if not dtype.is_floating_point:  # integer ends of a float dtype, float ends of an int one
        exact(torch.linspace(3, 90, 7, dtype=dtype, device="tpu"), torch.linspace(3, 90, 7, dtype=dtype))
        exact(torch.linspace(2.5, 70.9, 9, dtype=dtype, device="tpu"), torch.linspace(2.5, 70.9, 9, dtype=dtype))


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("base", [10.0, 2.0, 0.5, 1.7])
def test_logspace_bit_exact(dtype, base):
    for start, end in [(0, 3), (-2, 2), (3, -1.5), (0.25, 0.75), (1, 1)]:
        if dtype is torch.uint8:
            start, end = abs(start), abs(end)
        for steps in [0, 1, 2, 5, 16, 33, 100]:
            def run(dev, steps=steps, start=start, end=end):
                return torch.logspace(start, end, steps, base=base, dtype=dtype, device=dev)
            try:
                want = run("cpu")
            except RuntimeError:  # one step filled with a value out of the dtype's range
                same_error(lambda: run("cpu"), lambda: run("tpu"))
                continue
            exact(run("tpu"), want)


def test_linspace_logspace_out_and_tensor_forms():
    want = torch.linspace(-1, 2, 6)
    out = tpu(torch.empty(0))
    assert torch.linspace(-1, 2, 6, out=out) is out
    exact(out, want)
    out = tpu(torch.empty(2, 3))  # already 6 elements: CPU keeps the shape
    torch.linspace(-1, 2, 6, out=out)
    exact(out, torch.linspace(-1, 2, 6, out=torch.empty(2, 3)))
    base = tpu(torch.zeros(6, 2))
    torch.logspace(-1, 2, 6, base=3.0, out=base[:, 1])  # a non-contiguous out
    exact(base[:, 1], torch.logspace(-1, 2, 6, base=3.0))
    exact(base[:, 0], torch.zeros(6))
    # 0-dim tensor ends: PyTorch reads them with item() and calls linspace.out
    s, e = torch.tensor(0.5), torch.tensor(4.0)
    exact(torch.linspace(tpu(s), tpu(e), 9, device="tpu"), torch.linspace(s, e, 9))
    exact(torch.linspace(tpu(s), 3, 9, device="tpu"), torch.linspace(s, 3, 9))
    exact(torch.logspace(1, tpu(e), 5, device="tpu"), torch.logspace(1, e, 5))
    exact(torch.linspace(1, 1, 1, dtype=torch.bool, device="tpu"), torch.linspace(1, 1, 1, dtype=torch.bool))
    exact(torch.logspace(2, 5, 1, dtype=torch.bool, device="tpu"), torch.logspace(2, 5, 1, dtype=torch.bool))


def test_linspace_logspace_errors():
    for fn in (torch.linspace, torch.logspace):
        same_error(lambda: fn(0, 1, -1), lambda: fn(0, 1, -1, device="tpu"))
        same_error(lambda: fn(-1.5, 3, 4, dtype=torch.uint8), lambda: fn(-1.5, 3, 4, dtype=torch.uint8, device="tpu"))
        same_error(lambda: fn(0, 7e4, 4, dtype=torch.half), lambda: fn(0, 7e4, 4, dtype=torch.half, device="tpu"))
        same_error(lambda: fn(0, 300, 4, dtype=torch.int8), lambda: fn(0, 300, 4, dtype=torch.int8, device="tpu"))
        same_error(lambda: fn(torch.zeros(2), 1, 3), lambda: fn(tpu(torch.zeros(2)), 1, 3, device="tpu"))
    same_error(lambda: torch.logspace(10, 20, 1, dtype=torch.int8),
               lambda: torch.logspace(10, 20, 1, dtype=torch.int8, device="tpu"))
    # Bool has no CPU kernel past one step: the builder sends it to the CPU fallback,
    # which raises CPU's NotImplementedError
    same_error(lambda: torch.linspace(0, 1, 3, dtype=torch.bool),
               lambda: torch.linspace(0, 1, 3, dtype=torch.bool, device="tpu"))
    torchtpu.reset_fallback_report()


# ---- searchsorted / bucketize -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMERIC)
def test_searchsorted_bucketize(dtype):
    g = torch.Generator().manual_seed(3)
    bd = make((9,), dtype, seed=1).sort().values
    bd2 = make((3, 7), dtype, seed=2).sort(dim=-1).values
    v = make((4, 5), dtype, seed=3, low=-7, high=7)
    v2 = make((3, 6), dtype, seed=4, low=-7, high=7)
    for right in (False, True):
        for out_int32 in (False, True):
            kw = dict(right=right, out_int32=out_int32)
            same(torch.searchsorted(tpu(bd), tpu(v), **kw), torch.searchsorted(bd, v, **kw), atol=0, rtol=0)
            same(torch.searchsorted(tpu(bd2), tpu(v2), **kw), torch.searchsorted(bd2, v2, **kw), atol=0, rtol=0)
            same(torch.bucketize(tpu(v), tpu(bd), **kw), torch.bucketize(v, bd, **kw), atol=0, rtol=0)
            same(torch.bucketize(tpu(v.t()), tpu(bd), **kw), torch.bucketize(v.t(), bd, **kw), atol=0, rtol=0)
        side = "right" if right else "left"
        same(torch.searchsorted(tpu(bd), 2, side=side), torch.searchsorted(bd, 2, side=side), atol=0, rtol=0)
        same(torch.bucketize(3, tpu(bd), right=right), torch.bucketize(3, bd, right=right), atol=0, rtol=0)
        # an unsorted sequence with its sorter
        un = make((3, 7), dtype, seed=5)
        sorter = un.argsort(dim=-1, stable=True)
        same(torch.searchsorted(tpu(un), tpu(v2), sorter=tpu(sorter), side=side),
             torch.searchsorted(un, v2, sorter=sorter, side=side), atol=0, rtol=0)
    # values of another dtype compare in the promoted dtype
    vf = torch.rand((4, 5), generator=g, dtype=torch.float64) * 10 - 5
    same(torch.searchsorted(tpu(bd), tpu(vf)), torch.searchsorted(bd, vf), atol=0, rtol=0)
    same(torch.bucketize(2.5, tpu(bd)), torch.bucketize(2.5, bd), atol=0, rtol=0)
    out = tpu(torch.empty(0, dtype=torch.int32))
    assert torch.searchsorted(tpu(bd), tpu(v), out_int32=True, out=out) is out
    same(out, torch.searchsorted(bd, v, out_int32=True), atol=0, rtol=0)


def test_searchsorted_nan_and_edges():
    bd = torch.tensor([1.0, 2.0, 2.0, float("nan")])
    v = torch.tensor([[float("nan"), 2.0, -float("inf"), float("inf"), 1.5]])
    for side in ("left", "right"):
        same(torch.searchsorted(tpu(bd), tpu(v), side=side), torch.searchsorted(bd, v, side=side), atol=0, rtol=0)
    e = torch.empty(0)
    same(torch.searchsorted(tpu(e), tpu(v)), torch.searchsorted(e, v), atol=0, rtol=0)
    same(torch.bucketize(tpu(e), tpu(bd)), torch.bucketize(e, bd), atol=0, rtol=0)


def test_searchsorted_errors():
    bd, v = torch.arange(5.0), torch.tensor([1.5, 3.0])
    b2 = torch.arange(6.0).reshape(2, 3)
    for fc, ft in [
        (lambda: torch.bucketize(v, b2), lambda: torch.bucketize(tpu(v), tpu(b2))),
        (lambda: torch.searchsorted(bd, v, side="mid"), lambda: torch.searchsorted(tpu(bd), tpu(v), side="mid")),
        (lambda: torch.searchsorted(bd, v, side="left", right=True),
         lambda: torch.searchsorted(tpu(bd), tpu(v), side="left", right=True)),
        (lambda: torch.searchsorted(b2, 1.0), lambda: torch.searchsorted(tpu(b2), 1.0)),
        (lambda: torch.searchsorted(b2, torch.ones(3, 1)), lambda: torch.searchsorted(tpu(b2), tpu(torch.ones(3, 1)))),
        (lambda: torch.searchsorted(torch.tensor(1.0), v), lambda: torch.searchsorted(tpu(torch.tensor(1.0)), tpu(v))),
        (lambda: torch.searchsorted(bd, v, out=torch.empty(2, dtype=torch.int32)),
         lambda: torch.searchsorted(tpu(bd), tpu(v), out=tpu(torch.empty(2, dtype=torch.int32)))),
        (lambda: torch.searchsorted(bd, v, sorter=torch.arange(5, dtype=torch.int32)),
         lambda: torch.searchsorted(tpu(bd), tpu(v), sorter=tpu(torch.arange(5, dtype=torch.int32)))),
        (lambda: torch.searchsorted(bd, v, sorter=torch.tensor([0, 1, 2, 3, 9])),  # found at run time
         lambda: torch.searchsorted(tpu(bd), tpu(v), sorter=tpu(torch.tensor([0, 1, 2, 3, 9])))),
    ]:
        same_error(fc, ft)


# ---- isin -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMERIC)
def test_isin(dtype):
    """Both of CPU's algorithms: a few test elements (compared one by one in
    result_type) and many (sorted together; with assume_unique=True and repeated values
    CPU marks adjacent duplicates, which the kernel reproduces)."""
    x = make((4, 6), dtype, seed=1)
    for n_test in (0, 1, 3, 30, 200):
        t = make((n_test,), dtype, seed=2)
        for unique in (False, True):
            for invert in (False, True):
                kw = dict(assume_unique=unique, invert=invert)
                same(torch.isin(tpu(x), tpu(t), **kw), torch.isin(x, t, **kw))
                same(torch.isin(tpu(x.t()), tpu(t), **kw), torch.isin(x.t(), t, **kw))
    same(torch.isin(tpu(x), 3), torch.isin(x, 3))
    same(torch.isin(tpu(x), 2.5, invert=True), torch.isin(x, 2.5, invert=True))
    t = make((40,), dtype, seed=3)
    same(torch.isin(2, tpu(t)), torch.isin(2, t))
    same(torch.isin(2, tpu(t[:3])), torch.isin(2, t[:3]))
    out = tpu(torch.empty(0, dtype=torch.bool))
    assert torch.isin(tpu(x), tpu(t), out=out) is out
    same(out, torch.isin(x, t))


def test_isin_mixed_dtypes_and_nan():
    x = torch.tensor([0.0, -0.0, 1.5, float("nan"), 3.0, 2 ** 24 + 1.0], dtype=torch.float64)
    for t in [torch.tensor([0.0, float("nan"), 3]), torch.tensor([3, 2 ** 24 + 1]),
              torch.arange(100, dtype=torch.float32) * 0.5, torch.tensor(3.0, dtype=torch.float16)]:
        for unique in (False, True):
            same(torch.isin(tpu(x), tpu(t), assume_unique=unique), torch.isin(x, t, assume_unique=unique))
            same(torch.isin(tpu(t), tpu(x), assume_unique=unique), torch.isin(t, x, assume_unique=unique))
    i = torch.arange(10)
    same(torch.isin(tpu(i), 3.0), torch.isin(i, 3.0))
    same(torch.isin(tpu(i), tpu(torch.tensor([2.5, 3.0]))), torch.isin(i, torch.tensor([2.5, 3.0])))
    # a CPU 0-dim tensor beside a tpu one acts as a 0-dim tensor
    same(torch.isin(tpu(i), torch.tensor(3)), torch.isin(i, torch.tensor(3)))
    same(torch.isin(torch.tensor(3), tpu(i)), torch.isin(torch.tensor(3), i))


def test_isin_errors():
    b, i = torch.tensor([True, False]), torch.arange(3)
    same_error(lambda: torch.isin(b, b), lambda: torch.isin(tpu(b), tpu(b)))
    same_error(lambda: torch.isin(i, True), lambda: torch.isin(tpu(i), True))
    same_error(lambda: torch.isin(i, i, out=torch.empty(3)), lambda: torch.isin(tpu(i), tpu(i), out=tpu(torch.empty(3))))


# ---- repeat_interleave ---------------------------------------------------------------------------


@pytest.mark.parametrize("rdtype", [torch.int64, torch.int32])
def test_repeat_interleave(rdtype):
    r = torch.tensor([2, 0, 3, 1], dtype=rdtype)
    same(torch.repeat_interleave(tpu(r)), torch.repeat_interleave(r))
    same(torch.repeat_interleave(tpu(r), output_size=6), torch.repeat_interleave(r, output_size=6))
    e = torch.empty(0, dtype=rdtype)
    same(torch.repeat_interleave(tpu(e)), torch.repeat_interleave(e))
    same(torch.repeat_interleave(tpu(torch.zeros(3, dtype=rdtype))), torch.repeat_interleave(torch.zeros(3, dtype=rdtype)))
    x = make((4, 3), torch.float32)
    same(torch.repeat_interleave(tpu(x), tpu(r), dim=0), torch.repeat_interleave(x, r, dim=0))
    same(torch.repeat_interleave(tpu(x), 2, dim=1), torch.repeat_interleave(x, 2, dim=1))
    same(torch.repeat_interleave(tpu(x), 3), torch.repeat_interleave(x, 3))
    same(tpu(x).repeat_interleave(tpu(r[:3]), dim=1, output_size=5),
         x.repeat_interleave(r[:3], dim=1, output_size=5))


def test_repeat_interleave_backward():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    xt = tpu(x.detach()).requires_grad_()
    r = torch.tensor([1, 0, 2, 3])
    g = torch.randn(6, 3, dtype=torch.float64)
    (gc,) = torch.autograd.grad(torch.repeat_interleave(x, r, dim=0), x, g)
    (gt,) = torch.autograd.grad(torch.repeat_interleave(xt, tpu(r), dim=0), xt, tpu(g))
    same(gt, gc)


def test_repeat_interleave_errors():
    r = torch.tensor([1, -2, 3])
    same_error(lambda: torch.repeat_interleave(r), lambda: torch.repeat_interleave(tpu(r)))
    same_error(lambda: torch.repeat_interleave(r.reshape(1, 3)), lambda: torch.repeat_interleave(tpu(r).reshape(1, 3)))
    ok = torch.tensor([1, 2])  # output_size disagrees: found by the kernel, raised at the sync
    same_error(lambda: torch.repeat_interleave(ok, output_size=4), lambda: torch.repeat_interleave(tpu(ok), output_size=4))
    same_error(lambda: torch.repeat_interleave(r, output_size=2), lambda: torch.repeat_interleave(tpu(r), output_size=2))


@pytest.mark.parametrize("ri", [False, True])
@pytest.mark.parametrize("rc", [False, True])
@pytest.mark.parametrize("x", [torch.tensor([1, 1, 2, 2, 3, 1, 1, 2]), torch.tensor([[1.0, 1.0], [float("nan"), float("nan")]]),
                               torch.tensor([], dtype=torch.long), torch.tensor([5]), torch.tensor([0, 0, 1])],
                         ids=["runs", "nan_2d", "empty", "one", "1d"])
def test_unique_consecutive_matches_cpu(x, ri, rc):
    """unique_consecutive over the flattened input (what the HF sequence-classification
    heads call) runs natively; values, inverse and counts equal CPU's."""
    ref = torch.unique_consecutive(x, return_inverse=ri, return_counts=rc)
    with native("unique_consecutive"):
        got = torch.unique_consecutive(x.to("tpu"), return_inverse=ri, return_counts=rc)
    ref, got = (ref, got) if isinstance(ref, tuple) else ((ref,), (got,))
    for a, b in zip(ref, got):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.nan_to_num(7.0), b.cpu().nan_to_num(7.0))


def _same_tuple(got, ref):
    for a, b in zip(ref, got):
        assert b.device.type == "tpu"
        assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
        b = b.cpu()
        if a.is_floating_point():
            assert torch.equal(a.isnan(), b.isnan())
            a, b = a.nan_to_num(7.0), b.nan_to_num(7.0)
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [None, 0, 1, -1, 2])
def test_unique_consecutive_dims_match_cpu(dtype, dim):
    """Runs along a dim (equal slices) and over the flattened input, every dtype, a
    non-contiguous input; with a dim CPU returns inverse and counts even unasked."""
    base = make((3, 40, 4), torch.int64, low=0, high=2)
    base[1] = base[0]  # equal slices along dim 0
    base[:, 5] = base[:, 4]  # and along dim 1
    x = base.to(dtype).transpose(0, 2)  # [4, 40, 3], non-contiguous
    for ri, rc in [(False, False), (True, True), (True, False)]:
        ref = torch.ops.aten.unique_consecutive(x, ri, rc, dim)
        got = torch.ops.aten.unique_consecutive(tpu(x), ri, rc, dim)
        _same_tuple(got, ref)


def test_unique_consecutive_float_values_and_out():
    """NaN never equals NaN, -0.0 equals 0.0 (the first is kept), as on CPU; out= tensors
    must have the results' dtypes exactly."""
    x = torch.tensor([[-0.0, 0.0, float("nan"), float("nan"), 1.0], [0.0, -0.0, 1, 1, 1]])
    for dim in [None, 0, 1]:
        _same_tuple(torch.ops.aten.unique_consecutive(tpu(x), True, True, dim),
                    torch.ops.aten.unique_consecutive(x, True, True, dim))
    outs = [tpu(torch.empty(0)), tpu(torch.empty(0, dtype=torch.long)), tpu(torch.empty(5, dtype=torch.long))]
    torch.ops.aten.unique_consecutive(tpu(x), True, True, None, out0=outs[0], out1=outs[1], out2=outs[2])
    _same_tuple(outs, torch.ops.aten.unique_consecutive(x, True, True, None))
    bad = [tpu(torch.empty(0)), tpu(torch.empty(0, dtype=torch.int32)), tpu(torch.empty(0, dtype=torch.long))]
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype long int, but got int instead"):
        torch.ops.aten.unique_consecutive(tpu(x), True, True, None, out0=bad[0], out1=bad[1], out2=bad[2])


@pytest.mark.parametrize("x,dim", [(torch.tensor(5), None), (torch.empty(0, 3), 0), (torch.empty(0, 3), None),
                                   (torch.empty(2, 0, 3), 1)],
                         ids=["0d", "empty_dim0", "empty_flat", "empty_mid"])
def test_unique_consecutive_edge_shapes(x, dim):
    for ri, rc in [(False, False), (True, True)]:
        _same_tuple(torch.ops.aten.unique_consecutive(tpu(x), ri, rc, dim),
                    torch.ops.aten.unique_consecutive(x, ri, rc, dim))


@pytest.mark.parametrize("x,dim,exc,msg", [
    (torch.tensor(5), 0, IndexError, "Dimension specified as 0 but tensor has no dimensions"),
    (torch.tensor([1, 2]), 2, IndexError, "Dimension out of range"),
    (torch.empty(3, 0), 0, RuntimeError, "There are 0 sized dimensions, and they aren't selected"),
    (torch.empty(0, 0), 0, RuntimeError, "Number of zero sized dimensions is more than one"),
], ids=["0d_dim", "dim_range", "zero_other", "zero_two"])
def test_unique_consecutive_errors_match_cpu(x, dim, exc, msg):
    with pytest.raises(exc, match=msg):
        torch.ops.aten.unique_consecutive(x, True, True, dim)
    with pytest.raises(exc, match=msg):
        torch.ops.aten.unique_consecutive(tpu(x), True, True, dim)


def _async_raises(fn, match):
    """fn's error is the running op's: in strict and defer_and_fuse it surfaces at the next
    synchronization, in debug mode at the call itself; either way it names the op."""
    debug = torchtpu.get_eager_mode() == "debug"
    with pytest.raises(RuntimeError, match=match) as e:
        fn()
        assert not debug, "debug mode raises at the call"
        torch.tpu.synchronize()
    assert "_assert_async" in str(e.value)


def test_assert_async():
    with native("_assert_async"):
        for v in [1, -3, 0.5, -0.5, float("nan"), True]:
            torch._assert_async(torch.tensor(v, device="tpu"))
            torch._assert_async(torch.tensor([[v]], device="tpu"), "not raised")
        torch._assert_async(torch.tensor([0.0, 2.0], device="tpu")[1:])
        torch.tpu.synchronize()
        _async_raises(lambda: torch._assert_async(torch.tensor(0, device="tpu")),
                      "Expected Tensor with single nonzero value, but got zero")
        _async_raises(lambda: torch._assert_async(torch.tensor(-0.0, device="tpu")), "single nonzero value")
        _async_raises(lambda: torch._assert_async(torch.tensor(False, device="tpu")), "single nonzero value")
        _async_raises(lambda: torch._assert_async(torch.tensor(0.0, device="tpu", dtype=torch.bfloat16),
                                                  "custom message"), "custom message")
        _async_raises(lambda: torch._assert_async(torch.tensor(0, device="tpu"), ""), "Assertion is failed")
        # the value checked is the one when the op runs: a later write does not change it
        t = torch.zeros((), device="tpu")
        _async_raises(lambda: (torch._assert_async(t, "first"), t.fill_(1)), "first")
        # the element count is checked at the call, as on CPU
        for x, msg in [(torch.tensor([1, 1]), "more than one value"), (torch.tensor([]), "no values")]:
            with pytest.raises(RuntimeError, match=msg):
                torch._assert_async(x)
            with pytest.raises(RuntimeError, match=msg):
                torch._assert_async(tpu(x))
        torch._assert_async(torch.tensor(1, device="tpu"))  # the device works on afterwards
        torch.tpu.synchronize()


def test_assert_async_complex():
    with native("_assert_async"):
        torch._assert_async(torch.tensor(1j, device="tpu"))
        torch.tpu.synchronize()
        _async_raises(lambda: torch._assert_async(torch.tensor(-0.0 + 0j, device="tpu")), "single nonzero value")


# ---- unique (_unique2) -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int32, torch.int8, torch.uint8, torch.bool])
def test_unique_matches_cpu(dtype):
    """torch.unique (aten::_unique2) natively: ascending values, each element's index and
    each value's count, every flag combination (an output not asked for is empty), a
    non-contiguous input, `sorted=False` (CPU sorts too)."""
    x = make((6, 7), torch.int64, low=-3, high=4).to(dtype).t()
    for s in (True, False):
        for ri in (False, True):
            for rc in (False, True):
                ref = torch.ops.aten._unique2(x, s, ri, rc)
                with native("_unique2"):
                    got = torch.ops.aten._unique2(tpu(x), s, ri, rc)
                _same_tuple(got, ref)


def test_unique_float_values_edge_shapes_and_out():
    """NaN is never equal to NaN (each its own value, last, in input order), -0.0 equals
    0.0 and the first of them in input order is kept; 0-d and empty inputs; out= tensors."""
    x = torch.tensor([3.0, float("nan"), 1.0, 3.0, float("nan"), -0.0, 0.0, 2.0])
    ref = torch.ops.aten._unique2(x, True, True, True)
    got = torch.ops.aten._unique2(tpu(x), True, True, True)
    _same_tuple(got, ref)
    assert torch.equal(got[0].cpu().signbit(), ref[0].signbit())
    y = torch.tensor([0.0, -0.0, 5.0])
    assert torch.equal(torch.ops.aten._unique2(tpu(y), True)[0].cpu().signbit(),
                       torch.ops.aten._unique2(y, True)[0].signbit())
    for e in (torch.tensor(4.0), torch.empty(0), torch.empty(2, 0, dtype=torch.int64)):
        _same_tuple(torch.ops.aten._unique2(tpu(e), True, True, True), torch.ops.aten._unique2(e, True, True, True))
    outs = [tpu(torch.empty(0)), tpu(torch.empty(0, dtype=torch.long)), tpu(torch.empty(3, dtype=torch.long))]
    torch.ops.aten._unique2(tpu(x), True, True, True, out0=outs[0], out1=outs[1], out2=outs[2])
    _same_tuple(outs, ref)
    # the Python API on top of it, with a dim-less call as models make it
    u, inv, cnt = torch.unique(tpu(x[2:4]), return_inverse=True, return_counts=True)
    _same_tuple((u, inv, cnt), torch.unique(x[2:4], return_inverse=True, return_counts=True))
