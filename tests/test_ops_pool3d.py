"""3-d pooling on tpu vs PyTorch CPU: max_pool3d_with_indices, avg_pool3d, adaptive
avg/max pool 3d and their backwards (kernel, stride, padding, dilation, ceil_mode,
count_include_pad, divisor_override; 4-d unbatched and 5-d inputs; NaN propagation; the
error checks). The pooling ops must not go through the CPU fallback."""
import pytest
import torch
import torch.nn.functional as F

from op_helpers import DEV, close, native, tpu
from tolerances import assert_close

A = torch.ops.aten
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
POOL_OPS = ("max_pool3d_with_indices", "max_pool3d_with_indices_backward", "avg_pool3d", "avg_pool3d_backward",
            "_adaptive_avg_pool3d", "_adaptive_avg_pool3d_backward", "adaptive_max_pool3d",
            "adaptive_max_pool3d_backward")


def make(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    lo = 0 if dtype == torch.uint8 else -50
    return torch.randint(lo, 50, shape, generator=g, dtype=dtype)


MAX_KW = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 2, 3), stride=(2, 1, 2), padding=(1, 0, 1), dilation=(1, 2, 1), ceil_mode=True),
    dict(kernel_size=(1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),  # s3d / mvit style
    dict(kernel_size=2, stride=2, dilation=2, ceil_mode=True),
]


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize("kw", MAX_KW)
def test_max_pool3d(dtype, kw):
    x = make((2, 3, 6, 7, 5), dtype)
    want, wi = F.max_pool3d(x, return_indices=True, **kw)
    with native(*POOL_OPS):
        got, gi = F.max_pool3d(tpu(x), return_indices=True, **kw)
        got3 = F.max_pool3d(tpu(x[0]), **kw)  # 4-d unbatched input
    assert_close(got, want, dtype)
    assert_close(got3, F.max_pool3d(x[0], **kw), dtype)
    assert torch.equal(gi.cpu(), wi)  # same values on both sides: the same (first) maximum


def test_max_pool3d_nan_ties_and_out():
    x = make((1, 2, 4, 4, 4), torch.float32)
    x[0, 0, 1, 1, 1] = float("nan")
    x[0, 1] = 1.0  # all ties: the first index wins
    x[0, 1, 3, 3, 3] = float("nan")
    want, wi = A.max_pool3d_with_indices(x, [2], [2], [0], [1], False)
    out, ind = torch.empty(0, device=DEV), torch.empty(0, dtype=torch.int64, device=DEV)
    with native(*POOL_OPS):
        A.max_pool3d_with_indices.out(tpu(x), [2], [2], [0], [1], False, out=out, indices=ind)
    assert_close(out, want, equal_nan=True)
    assert torch.equal(ind.cpu(), wi)


AVG_KW = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=(3, 2, 3), stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=2, stride=1, padding=1, divisor_override=3),
    dict(kernel_size=(1, 3, 3), stride=1, padding=(0, 1, 1), count_include_pad=False),
]


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
@pytest.mark.parametrize("kw", AVG_KW)
def test_avg_pool3d(dtype, kw):
    x = make((2, 3, 6, 7, 5), dtype)
    with native(*POOL_OPS):
        got = F.avg_pool3d(tpu(x), **kw)
        got3 = F.avg_pool3d(tpu(x[1]), **kw)
    assert_close(got, _cpu(F.avg_pool3d, x, **kw), dtype)
    assert_close(got3, _cpu(F.avg_pool3d, x[1], **kw), dtype)


def _cpu(fn, x, *args, **kw):
    """CPU's result; CPU's avg_pool3d has no bf16/f16 kernel (tpu computes them in f32, as
    its other pools do): the f32 result rounded to the dtype."""
    if x.dtype in (torch.bfloat16, torch.float16):
        return fn(x.float(), *args, **kw).to(x.dtype)
    return fn(x, *args, **kw)


def test_avg_pool3d_out():
    x = make((2, 3, 4, 5, 6), torch.float32)
    out, aout = torch.empty(0, device=DEV), torch.empty(0, device=DEV)
    with native(*POOL_OPS, "adaptive_avg_pool3d"):
        A.avg_pool3d.out(tpu(x), [2, 3, 2], [1, 2, 2], [1, 1, 0], True, False, None, out=out)
        A.adaptive_avg_pool3d.out(tpu(x), [3, 2, 4], out=aout)
    assert_close(out, A.avg_pool3d(x, [2, 3, 2], [1, 2, 2], [1, 1, 0], True, False, None))
    assert_close(aout, A.adaptive_avg_pool3d(x, [3, 2, 4]))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("size", [(3, 2, 4), (6, 7, 5), (1, 1, 1), (4, 5, 2), (None, 3, None)])
def test_adaptive_pools3d(dtype, size):
    x = make((2, 3, 6, 7, 5), dtype)
    with native(*POOL_OPS):
        got = F.adaptive_avg_pool3d(tpu(x), size)
        gotm, gi = F.adaptive_max_pool3d(tpu(x), size, return_indices=True)
        got3 = F.adaptive_avg_pool3d(tpu(x[0]), size)
    assert_close(got, F.adaptive_avg_pool3d(x, size), dtype)
    assert_close(got3, F.adaptive_avg_pool3d(x[0], size), dtype)
    want, wi = F.adaptive_max_pool3d(x, size, return_indices=True)
    assert_close(gotm, want, dtype)
    assert torch.equal(gi.cpu(), wi)


BWD_FNS = [
    lambda t: F.max_pool3d(t, 3, 2, 1),
    lambda t: F.max_pool3d(t, (3, 2, 3), (2, 1, 2), (1, 0, 1), (1, 2, 1), ceil_mode=True),
    lambda t: F.max_pool3d(t, (1, 3, 3), (1, 2, 2), (0, 1, 1)),
    lambda t: F.avg_pool3d(t, 3, 2, 1),
    lambda t: F.avg_pool3d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    lambda t: F.avg_pool3d(t, 2, 1, 1, divisor_override=3),
    lambda t: F.adaptive_avg_pool3d(t, (4, 5, 2)),
    lambda t: F.adaptive_avg_pool3d(t, 1),
    lambda t: F.adaptive_max_pool3d(t, (3, 4, 2)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fn", range(len(BWD_FNS)))
@pytest.mark.parametrize("batched", [True, False])
def test_pool3d_backward(dtype, fn, batched):
    fn = BWD_FNS[fn]
    x = make((2, 3, 6, 7, 5) if batched else (3, 6, 7, 5), torch.float64, seed=1).to(dtype)
    g = make(fn(x.float()).shape, dtype, seed=2)
    # CPU's reference in the dtype itself; avg_pool3d has no bf16/f16 CPU kernel: there
    # the f32 result rounded to the dtype (tpu computes those pools in f32)
    ref_dt = torch.float32 if dtype in (torch.bfloat16, torch.float16) and fn in BWD_FNS[3:6] else dtype
    xc = x.to(ref_dt).requires_grad_()
    want = fn(xc)
    (gc,) = torch.autograd.grad(want, xc, g.to(ref_dt))
    want, gc = want.detach().to(dtype), gc.to(dtype)
    xt = tpu(x).requires_grad_()
    with native(*POOL_OPS):
        got = fn(xt)
        (gt,) = torch.autograd.grad(got, xt, tpu(g))
    assert_close(got, want, dtype)
    assert_close(gt, gc, dtype)


def test_pool3d_backward_explicit_calls():
    x = make((2, 2, 5, 4, 6), torch.float64)
    y, ind = A.max_pool3d_with_indices(x, [2, 2, 3], [1, 2, 2], [1, 0, 1], [1, 1, 1], True)
    g = make(y.shape, torch.float64, seed=3)
    want = A.max_pool3d_with_indices_backward(g, x, [2, 2, 3], [1, 2, 2], [1, 0, 1], [1, 1, 1], True, ind)
    out = torch.empty(0, dtype=torch.float64, device=DEV)
    with native(*POOL_OPS):
        A.max_pool3d_with_indices_backward.grad_input(tpu(g), tpu(x), [2, 2, 3], [1, 2, 2], [1, 0, 1], [1, 1, 1],
                                                      True, tpu(ind), grad_input=out)
    close(out, want)
    ya = A.avg_pool3d(x, [3], [2], [1], False, False, None)
    ga = make(ya.shape, torch.float64, seed=4)
    want = A.avg_pool3d_backward(ga, x, [3], [2], [1], False, False, None)
    with native(*POOL_OPS):
        got = A.avg_pool3d_backward(tpu(ga), tpu(x), [3], [2], [1], False, False, None)
    close(got, want)
    gd = make((2, 2, 3, 2, 4), torch.float64, seed=5)
    want = A._adaptive_avg_pool3d_backward(gd, x)
    with native(*POOL_OPS):
        got = A._adaptive_avg_pool3d_backward(tpu(gd), tpu(x))
    close(got, want)


def test_pool3d_empty_batch_and_output():
    x = torch.ones(0, 2, 4, 4, 4)
    with native(*POOL_OPS):
        got, gi = F.max_pool3d(tpu(x), 2, return_indices=True)
        got_a = F.avg_pool3d(tpu(x), 2)
        got_e = F.adaptive_avg_pool3d(tpu(torch.ones(1, 2, 4, 4, 4)), (0, 2, 2))
    assert got.shape == gi.shape == got_a.shape == (0, 2, 2, 2, 2)
    assert got_e.shape == (1, 2, 0, 2, 2)


def _same_error(fn, *args):
    with pytest.raises(Exception) as cpu_err:
        fn(*args)
    targs = [tpu(a) if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(cpu_err.type) as tpu_err:
        fn(*targs)
        torch.tpu.synchronize()
    return str(cpu_err.value), str(tpu_err.value)


def test_pool3d_errors():
    o = torch.ones
    cases = [
        (A.max_pool3d_with_indices, o(1, 1, 4, 4, 4), [2, 2, 2, 2]),
        (A.max_pool3d_with_indices, o(1, 1, 4, 4, 4), [2], [0, 1, 1]),
        (A.max_pool3d_with_indices, o(1, 1, 4, 4, 4), [2], [1], [2]),
        (A.max_pool3d_with_indices, o(1, 1, 4, 4, 4), [2], [1], [-1]),
        (A.max_pool3d_with_indices, o(1, 4, 4), [2]),
        (A.max_pool3d_with_indices, o(1, 1, 1, 4, 4, 4), [2]),
        (A.max_pool3d_with_indices, o(1, 1, 1, 4, 4), [2]),
        (A.max_pool3d_with_indices, o(1, 0, 4, 4, 4), [2]),
        (A.max_pool3d_with_indices, o(1, 1, 4, 4, 4), [2], [2], [0], [0]),
        (A.max_pool3d_with_indices, o(1, 1, 4, 4, 4, dtype=torch.bool), [2]),
        (A.avg_pool3d, o(1, 1, 4, 4, 4), [2, 2]),
        (A.avg_pool3d, o(1, 1, 1, 4, 4), [2]),
        (A.avg_pool3d, o(1, 1, 4, 4, 4), [2], [2], [0], False, True, 0),
        (A.avg_pool3d, o(1, 1, 4, 4, 4, dtype=torch.int32), [2]),
        (A.avg_pool3d, o(1, 1, 0, 4, 4), [2]),
        (A.max_pool3d_with_indices_backward, o(1, 1, 3, 2, 2), o(1, 1, 4, 4, 4), [2], [2], [0], [1], False,
         torch.zeros(1, 1, 2, 2, 2, dtype=torch.long)),
        (A.max_pool3d_with_indices_backward, o(1, 1, 2, 2, 2), o(1, 1, 4, 4, 4), [2], [2], [0], [1], False,
         torch.zeros(1, 1, 2, 2, 2, dtype=torch.int)),
        (A.max_pool3d_with_indices_backward, o(1, 1, 2, 2, 2, dtype=torch.double), o(1, 1, 4, 4, 4), [2], [2],
         [0], [1], False, torch.zeros(1, 1, 2, 2, 2, dtype=torch.long)),
        (A.avg_pool3d_backward, o(1, 1, 3, 2, 2), o(1, 1, 4, 4, 4), [2], [2], [0], False, True, None),
        (A.avg_pool3d_backward, o(1, 1, 2, 2, 2, dtype=torch.double), o(1, 1, 4, 4, 4), [2], [2], [0], False,
         True, None),
        (A._adaptive_avg_pool3d, o(1, 1, 4, 4, 4), [2, 2]),
        (F.adaptive_avg_pool3d, o(1, 4, 4), 2),
        (F.adaptive_avg_pool3d, o(1, 1, 0, 4, 4), 2),
        (A.adaptive_max_pool3d, o(1, 1, 4, 4, 4), [2, 2]),
        (F.adaptive_max_pool3d, o(1, 4, 4), 2),
        (A._adaptive_avg_pool3d_backward, o(1, 2, 2, 2), o(1, 1, 4, 4, 4)),
        (A.adaptive_max_pool3d_backward, o(1, 1, 2, 3, 2), o(1, 1, 4, 4, 4), torch.zeros(1, 1, 2, 2, 2, dtype=torch.long)),
    ]
    for fn, *args in cases:
        cpu_msg, tpu_msg = _same_error(fn, *args)
        first = cpu_msg.splitlines()[0]
        if "tensor.size[2] == 3" in first:
            # CPU checks indices against grad_output's sizes, tpu grad_output against the
            # forward's output: the same dim, the sizes the other way round
            first = "tensor.size[2] == 2 but got: dimension 5 and tensor.size[2] = 3"
        assert first in tpu_msg, (first, tpu_msg)
    # the indices of a hand-made backward call are checked (CPU does not check them)
    with pytest.raises(IndexError, match="out of range"):
        A.max_pool3d_with_indices_backward(tpu(o(1, 1, 2, 2, 2)), tpu(o(1, 1, 4, 4, 4)), [2], [2], [0], [1], False,
                                           tpu(torch.full((1, 1, 2, 2, 2), 64, dtype=torch.long))).cpu()
    # the runtime stays usable after the asynchronous error
    x = make((1, 1, 4, 4, 4), torch.float32)
    close(F.max_pool3d(tpu(x), 2), F.max_pool3d(x, 2))
