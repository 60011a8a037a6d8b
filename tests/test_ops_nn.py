"""nn and norm families on tpu against PyTorch's CPU results: layer norm, embedding,
embedding_bag, nll
loss, fused attention, the pointwise losses, weight norm, group norm, reflection and
replication padding, im2col/col2im, in their functional, out= and backward forms; the
transformer inference fast path and its kernels (_masked_softmax,
_transform_bias_rescale_qkv, _addmm_activation).

Every comparison runs the same call on CPU and on tpu; the native kernels must not go
through the CPU fallback (checked with torchtpu.fallback_report())."""
import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import torchtpu
from op_helpers import close, grads, native, no_cpu_fallback, tpu

A = torch.ops.aten
DEV = "tpu"
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def test_native_guard_can_fail():
    """The fallback guard itself: an op forced through the CPU fallback is caught."""
    with pytest.raises(AssertionError, match="native_layer_norm"):
        with native("native_layer_norm"):
            with pytest.raises(NotImplementedError):  # integer input: libtpurt defers to the CPU
                A.native_layer_norm(torch.ones(2, 3, dtype=torch.long).to(DEV), [3], None, None, 1e-5)


# ---- layer norm -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("affine", [True, False])
def test_native_layer_norm(dtype, affine):
    torch.manual_seed(0)
    x = (torch.randn(4, 3, 8) * 3 + 1).to(dtype)
    shape = [3, 8] if affine else [8]
    w = torch.randn(shape).to(dtype) if affine else None
    b = torch.randn(shape).to(dtype) if affine else None
    with native("native_layer_norm"):
        got = A.native_layer_norm(tpu(x), shape, *(tpu(w, b) if affine else (None, None)), 1e-5)
    exp = A.native_layer_norm(x, shape, w, b, 1e-5)
    for g, e in zip(got, exp):
        close(g, e, scale=2)


def test_native_layer_norm_mixed_noncontiguous_and_out():
    torch.manual_seed(1)
    x = torch.randn(8, 6).to(torch.bfloat16).t()  # (6, 8), non-contiguous
    w, b = torch.randn(8), torch.randn(8)
    with native("native_layer_norm"):
        got = A.native_layer_norm(tpu(x), [8], *tpu(w, b), 1e-5)
    exp = A.native_layer_norm(x, [8], w, b, 1e-5)
    assert got[1].dtype == torch.float32
    for g, e in zip(got, exp):
        close(g, e, scale=2)
    outs = [torch.empty(0, device=DEV, dtype=d) for d in (torch.bfloat16, torch.float32, torch.float32)]
    with native("native_layer_norm"):
        r = A.native_layer_norm.out(tpu(x), [8], *tpu(w, b), 1e-5, out0=outs[0], out1=outs[1], out2=outs[2])
    assert r[0] is outs[0]
    for g, e in zip(outs, exp):
        close(g, e, scale=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_layer_norm_backward(dtype):
    torch.manual_seed(2)
    x = torch.randn(5, 2, 16).to(dtype).requires_grad_()
    w = torch.randn(16).to(dtype).requires_grad_()
    b = torch.randn(16).to(dtype).requires_grad_()
    fn = lambda x, w, b: F.layer_norm(x, [16], w, b)
    oc, gc = grads(fn, (x, w, b))
    with native("native_layer_norm", "native_layer_norm_backward"):
        ot, gt = grads(fn, tpu(x, w, b))
    close(ot, oc.detach(), scale=2)
    for g, e in zip(gt, gc):
        close(g, e, scale=4)
    # only the input requires grad
    xi = x.detach().requires_grad_()
    _, (gc_x,) = grads(lambda x: F.layer_norm(x, [16]), (xi,))
    with native("native_layer_norm_backward"):
        _, (gt_x,) = grads(lambda x: F.layer_norm(x, [16]), (tpu(xi),))
    close(gt_x, gc_x, scale=4)


def test_layer_norm_backward_output_mask():
    x, dy = torch.randn(3, 4), torch.randn(3, 4)
    w = torch.randn(4)
    _, mean, rstd = A.native_layer_norm(x, [4], w, None, 1e-5)
    exp = A.native_layer_norm_backward(dy, x, [4], mean, rstd, w, None, [True, False, False])
    got = A.native_layer_norm_backward(*tpu(dy, x), [4], *tpu(mean, rstd, w), None, [True, False, False])
    assert got[1] is None and got[2] is None
    close(got[0], exp[0])


def test_layer_norm_errors():
    x = torch.randn(2, 3, 4)
    for args in [([3], None, None), ([4], torch.ones(3), None), ([4], torch.ones(4, dtype=torch.float64), None)]:
        with pytest.raises(RuntimeError) as ec:
            A.native_layer_norm(x, args[0], args[1], args[2], 1e-5)
        with pytest.raises(RuntimeError) as et:
            A.native_layer_norm(tpu(x), args[0], tpu(args[1]), None, 1e-5)
        assert type(et.value) is type(ec.value)
    with pytest.raises(NotImplementedError):
        A.native_layer_norm(tpu(torch.ones(2, 3, dtype=torch.long)), [3], None, None, 1e-5)


# ---- embedding --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool])
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_embedding(dtype, idx_dtype):
    torch.manual_seed(3)
    w = (torch.randn(7, 10) * 5).to(dtype).t().contiguous().t()  # (7, 10), column-major
    idx = torch.randint(0, 7, (3, 4), dtype=idx_dtype)
    with native("embedding"):
        got = F.embedding(tpu(idx), tpu(w))
    close(got, F.embedding(idx, w))
    out = torch.empty(0, dtype=dtype, device=DEV)
    with native("embedding"):
        A.embedding.out(tpu(w), tpu(idx), out=out)
    close(out, F.embedding(idx, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("padding_idx,scale", [(None, False), (2, False), (None, True), (0, True)])
def test_embedding_backward(dtype, padding_idx, scale):
    torch.manual_seed(4)
    w = torch.randn(6, 5).to(dtype).requires_grad_()
    idx = torch.tensor([[0, 2, 2, 5], [1, 0, 0, 0]])
    fn = lambda w: F.embedding(idx if w.device.type == "cpu" else tpu(idx), w, padding_idx=padding_idx,
                               scale_grad_by_freq=scale)
    oc, (gc,) = grads(fn, (w,))
    with native("embedding", "embedding_dense_backward"):
        ot, (gt,) = grads(fn, (tpu(w),))
    close(ot, oc.detach())
    close(gt, gc, scale=2)


def test_embedding_dense_backward_int_and_out():
    g = torch.arange(24).reshape(2, 4, 3)
    idx = torch.tensor([[0, 4, 4, 1], [1, 1, 0, 3]])
    with native("embedding_dense_backward"):
        got = A.embedding_dense_backward(tpu(g), tpu(idx), 5, -1, False)
    close(got, A.embedding_dense_backward(g, idx, 5, -1, False))
    out = torch.empty(0, device=DEV)
    gf = g.float()
    with native("embedding_dense_backward"):
        A.embedding_dense_backward.out(tpu(gf), tpu(idx.int()), 5, 4, True, out=out)
    close(out, A.embedding_dense_backward(gf, idx.int(), 5, 4, True))


def test_embedding_errors():
    w = torch.randn(5, 3)
    for bad in ([[0, 5]], [[0, -1]]):
        with pytest.raises(IndexError):
            F.embedding(torch.tensor(bad), w)
        with pytest.raises(IndexError):
            F.embedding(tpu(torch.tensor(bad)), tpu(w)).cpu()
    with pytest.raises(RuntimeError):
        A.embedding(tpu(w), tpu(torch.tensor([[0.0, 1.0]])))
    with pytest.raises(RuntimeError):
        A.embedding(tpu(w[0]), tpu(torch.tensor([0])))
    # the runtime stays usable after the asynchronous error
    close(F.embedding(tpu(torch.tensor([1])), tpu(w)), F.embedding(torch.tensor([1]), w))


# ---- embedding_bag ----------------------------------------------------------------------

BAG_OPS = ("_embedding_bag", "_embedding_bag_forward_only", "_embedding_bag_backward", "_embedding_bag_dense_backward",
           "_embedding_bag_per_sample_weights_backward")
BAG_IDX = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 4, 7, 7])
BAG_OFF = torch.tensor([0, 4, 4, 6, 11])  # an empty bag and a bag of one


def _bag_call(op, w, idx, off, mode, ilo, pad, psw=None):
    if ilo:
        off = torch.cat([off, torch.tensor([idx.numel()], dtype=off.dtype)])
    dev = lambda t: t if w.device.type == "cpu" or t is None else tpu(t)
    return op(w, dev(idx), dev(off), False, mode, False, dev(psw), ilo, pad)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("ilo", [False, True])
@pytest.mark.parametrize("pad", [-1, 4])
def test_embedding_bag_forward(dtype, mode, ilo, pad):
    """All four outputs of _embedding_bag and _embedding_bag_forward_only, including CPU's
    auxiliary ones (offset2bag, bag_size, max_indices) that the backwards read."""
    w = torch.randn(10, 6, generator=torch.Generator().manual_seed(5)).to(dtype)
    for op in (A._embedding_bag, A._embedding_bag_forward_only):
        for idx_dt in (torch.int64, torch.int32):
            idx, off = BAG_IDX.to(idx_dt), BAG_OFF.to(idx_dt)
            want = _bag_call(op, w, idx, off, mode, ilo, pad)
            with native(*BAG_OPS):
                got = _bag_call(op, tpu(w), idx, off, mode, ilo, pad)
            close(got[0], want[0])
            for g, c in zip(got[1:], want[1:]):
                assert g.dtype == c.dtype and torch.equal(g.cpu(), c), (op, g.cpu(), c)


def test_embedding_bag_forward_strided_psw_and_out():
    w = torch.randn(12, 7, generator=torch.Generator().manual_seed(6)).t().contiguous().t()  # column-major rows
    psw = torch.rand(24, generator=torch.Generator().manual_seed(7))[::2]
    want = _bag_call(A._embedding_bag, w, BAG_IDX, BAG_OFF, 0, False, -1, psw)
    outs = [torch.empty(0, device=DEV)] + [torch.empty(0, dtype=torch.long, device=DEV) for _ in range(3)]
    with native(*BAG_OPS):
        A._embedding_bag.out(tpu(w), tpu(BAG_IDX), tpu(BAG_OFF), False, 0, False, tpu(psw), False, -1,
                             out0=outs[0], out1=outs[1], out2=outs[2], out3=outs[3])
    close(outs[0], want[0])
    for g, c in zip(outs[1:], want[1:]):
        assert torch.equal(g.cpu(), c)


def test_embedding_bag_max_nan_and_ties():
    """Max takes a bag's first value, then strictly greater ones: a NaN wins only first."""
    nan = float("nan")
    w = torch.tensor([[1.0, nan, 2.0], [2.0, 0.0, 2.0], [nan, 3.0, 2.0]])
    for off in ([0], [0, 1], [0, 2]):
        want = A._embedding_bag(w, torch.tensor([0, 1, 2]), torch.tensor(off), False, 2, False, None, False, -1)
        with native(*BAG_OPS):
            got = A._embedding_bag(tpu(w), tpu(torch.tensor([0, 1, 2])), tpu(torch.tensor(off)), False, 2, False,
                                   None, False, -1)
        close(got[0], want[0])
        assert torch.equal(got[3].cpu(), want[3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("ilo", [False, True])
@pytest.mark.parametrize("mode,pad,scale", [  # F.embedding_bag refuses scale_grad_by_freq in max mode
    (m, p, s) for m in ("sum", "mean", "max") for p, s in ((None, False), (4, False), (None, True), (-1, True))
    if not (m == "max" and s)])
def test_embedding_bag_backward(dtype, mode, ilo, pad, scale):
    w = torch.randn(10, 6, generator=torch.Generator().manual_seed(8)).to(dtype).requires_grad_()
    off = torch.cat([BAG_OFF, torch.tensor([BAG_IDX.numel()])]) if ilo else BAG_OFF
    fn = lambda w: F.embedding_bag(BAG_IDX if w.device.type == "cpu" else tpu(BAG_IDX), w,
                                   off if w.device.type == "cpu" else tpu(off), mode=mode, include_last_offset=ilo,
                                   padding_idx=pad, scale_grad_by_freq=scale)
    oc, (gc,) = grads(fn, (w,))
    with native(*BAG_OPS):
        ot, (gt,) = grads(fn, (tpu(w),))
    close(ot, oc.detach())
    close(gt, gc, scale=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pad", [None, 4])
def test_embedding_bag_per_sample_weights_backward(dtype, pad):
    g = torch.Generator().manual_seed(9)
    w = torch.randn(10, 6, generator=g).to(dtype).requires_grad_()
    psw = torch.rand(BAG_IDX.numel(), generator=g).to(dtype).requires_grad_()
    fn = lambda w, p: F.embedding_bag(BAG_IDX if w.device.type == "cpu" else tpu(BAG_IDX), w,
                                      BAG_OFF if w.device.type == "cpu" else tpu(BAG_OFF), mode="sum",
                                      per_sample_weights=p, padding_idx=pad)
    oc, (gwc, gpc) = grads(fn, (w, psw))
    with native(*BAG_OPS):
        ot, (gwt, gpt) = grads(fn, tpu(w, psw))
    close(ot, oc.detach())
    close(gwt, gwc)
    close(gpt, gpc)


def test_embedding_bag_module_2d_input_training():
    """nn.EmbeddingBag with 2-D input (F.embedding_bag flattens it and makes the offsets),
    one SGD step on each device."""
    torch.manual_seed(10)
    for mode in ("sum", "mean", "max"):
        mc = torch.nn.EmbeddingBag(20, 8, mode=mode)
        mt = torch.nn.EmbeddingBag(20, 8, mode=mode)
        mt.load_state_dict(mc.state_dict())
        mt.to(DEV)
        x = torch.randint(0, 20, (5, 3))
        for m, xin in ((mc, x), (mt, tpu(x))):
            opt = torch.optim.SGD(m.parameters(), lr=0.5)
            with native(*BAG_OPS):
                m(xin).square().sum().backward()
                opt.step()
        close(mt.weight.detach(), mc.weight.detach())


def test_embedding_bag_backward_direct_calls():
    """The backwards called with CPU's auxiliary outputs, including CPU's empty offset2bag
    (its sum fast path), which they rebuild from offsets; and the out= forms."""
    g = torch.Generator().manual_seed(11)
    w = torch.randn(10, 6, generator=g)
    grad = torch.randn(BAG_OFF.numel(), 6, generator=g)
    psw = torch.rand(BAG_IDX.numel(), generator=g)
    for mode, pad in ((0, -1), (0, 4), (1, -1), (2, 4)):
        _, o2b, bs, mi = A._embedding_bag(w, BAG_IDX, BAG_OFF, False, mode, False, None, False, pad)
        args = (BAG_IDX, BAG_OFF, o2b, bs, mi, 10, mode == 1, mode, False, None, pad)
        want = A._embedding_bag_backward(grad, *args)
        with native(*BAG_OPS):
            got = A._embedding_bag_backward(tpu(grad), *[tpu(a) if isinstance(a, torch.Tensor) else a for a in args])
        close(got, want)
        if o2b.numel():
            dargs = (BAG_IDX, o2b, bs, mi, 10, False, mode, None, pad)
            want = A._embedding_bag_dense_backward(grad, *dargs)
            out = torch.empty(0, device=DEV)
            with native(*BAG_OPS):
                A._embedding_bag_dense_backward.out(
                    tpu(grad), *[tpu(a) if isinstance(a, torch.Tensor) else a for a in dargs], out=out)
            close(out, want)
    _, o2b, _, _ = A._embedding_bag(w, BAG_IDX, BAG_OFF, False, 0, False, psw, False, -1)
    assert o2b.numel() == 0  # CPU's fast path: the backward rebuilds offset2bag
    want = A._embedding_bag_per_sample_weights_backward(grad, w, BAG_IDX, BAG_OFF, o2b, 0, -1)
    with native(*BAG_OPS):
        got = A._embedding_bag_per_sample_weights_backward(tpu(grad), tpu(w), tpu(BAG_IDX), tpu(BAG_OFF), tpu(o2b),
                                                           0, -1)
    close(got, want)


def test_embedding_bag_errors():
    w = torch.randn(10, 3)
    idx, off = BAG_IDX[:8], torch.tensor([0, 4])
    cases = [  # (weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)
        (w, idx, torch.tensor([1, 4]), 0, None, False, -1),  # offsets[0] != 0
        (w, idx, torch.tensor([0, 9]), 1, None, False, -1),  # offsets[-1] > len
        (w, torch.tensor([1, 10]), torch.tensor([0]), 0, None, False, -1),  # index out of range
        (w, torch.tensor([1, -1]), torch.tensor([0]), 1, None, False, -1),
        (w, torch.tensor([1, 10]), torch.tensor([0]), 2, None, False, -1),
        (w, idx.float(), off, 0, None, False, -1),
        (w, idx, off.view(1, 2), 0, None, False, -1),
        (w, idx.view(1, 2, 4), off, 0, None, False, -1),
        (w[0], idx, off, 0, None, False, -1),
        (w.long(), idx, off, 0, None, False, -1),
        (w, idx, off, 1, torch.rand(8), False, -1),
        (w, idx, off, 0, torch.rand(7), False, -1),
        (w, idx, off, 0, torch.rand(8).double(), False, -1),
        (w, idx, torch.tensor([], dtype=torch.long), 0, None, True, -1),
        (w, idx, off, 3, None, False, -1),
    ]
    for wt, i, o, mode, p, ilo, pad in cases:
        with pytest.raises(RuntimeError) as ec:
            A._embedding_bag(wt, i, o, False, mode, False, p, ilo, pad)
        with pytest.raises(RuntimeError) as et:
            r = A._embedding_bag(tpu(wt), tpu(i), tpu(o), False, mode, False, None if p is None else tpu(p), ilo, pad)
            r[0].cpu()
        first = str(ec.value).splitlines()[0].split("  (Could this error message")[0]
        assert first in str(et.value), (first, str(et.value))
    # decreasing offsets: CPU fails in sum/mean with an internal check (and not in max);
    # tpu says what is wrong in every mode
    for mode in (0, 1, 2):
        with pytest.raises(RuntimeError, match="offsets must be non-decreasing"):
            A._embedding_bag(tpu(w), tpu(idx), tpu(torch.tensor([0, 5, 3])), False, mode, False, None, False,
                             -1)[0].cpu()
    with pytest.raises(RuntimeError, match="per_sample_weights only supported for mode='sum'"):
        A._embedding_bag_per_sample_weights_backward(tpu(torch.ones(2, 3)), tpu(w), tpu(idx), tpu(off),
                                                     tpu(idx), 1, -1)
    # the runtime stays usable after the asynchronous errors
    close(F.embedding_bag(tpu(idx), tpu(w), tpu(off)), F.embedding_bag(idx, w, off))


# ---- nll loss ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(dtype, reduction, weighted):
    torch.manual_seed(5)
    x = torch.randn(6, 4).log_softmax(1).to(dtype).requires_grad_()
    t = torch.tensor([0, 3, 1, -100, 2, 3])
    wt = torch.rand(4).to(dtype) if weighted else None
    fn = lambda x: F.nll_loss(x, t.to(x.device), weight=None if wt is None else wt.to(x.device), reduction=reduction)
    oc, (gc,) = grads(fn, (x,))
    with native("nll_loss_forward", "nll_loss_backward"):
        ot, (gt,) = grads(fn, (tpu(x),))
    close(ot, oc.detach(), scale=2)
    close(gt, gc, scale=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss2d(dtype, reduction):
    torch.manual_seed(6)
    x = torch.randn(2, 3, 4, 5).log_softmax(1).to(dtype).requires_grad_()
    t = torch.randint(0, 3, (2, 4, 5))
    t[0, 0, 0] = 1
    wt = torch.rand(3).to(dtype)
    fn = lambda x: F.nll_loss(x, t.to(x.device), weight=wt.to(x.device), reduction=reduction, ignore_index=1)
    oc, (gc,) = grads(fn, (x,))
    with native("nll_loss2d_forward", "nll_loss2d_backward"):
        ot, (gt,) = grads(fn, (tpu(x),))
    close(ot, oc.detach(), scale=2)
    close(gt, gc, scale=2)


def test_nll_loss_unbatched_out_and_all_ignored():
    x = torch.randn(5).log_softmax(0)
    t = torch.tensor(3)
    with native("nll_loss_forward"):
        got = A.nll_loss_forward(tpu(x), tpu(t), None, 1, -100)
    for g, e in zip(got, A.nll_loss_forward(x, t, None, 1, -100)):
        close(g, e)
    x2 = torch.randn(3, 5)
    t2 = torch.full((3,), -100)
    o, tw = torch.empty(0, device=DEV), torch.empty(0, device=DEV)
    with native("nll_loss_forward"):
        A.nll_loss_forward.output(tpu(x2), tpu(t2), None, 1, -100, output=o, total_weight=tw)
    for g, e in zip((o, tw), A.nll_loss_forward(x2, t2, None, 1, -100)):
        close(g, e)


def test_loss_backward_out_forms():
    torch.manual_seed(13)
    x, t, w = torch.randn(4, 3).log_softmax(1), torch.tensor([2, 0, 1, 2]), torch.rand(3)
    out, tw = A.nll_loss_forward(x, t, w, 1, -100)
    go = torch.tensor(1.5)
    gi = torch.empty(0, device=DEV)
    with native("nll_loss_backward"):
        A.nll_loss_backward.grad_input(*tpu(go, x, t, w), 1, -100, tpu(tw), grad_input=gi)
    close(gi, A.nll_loss_backward(go, x, t, w, 1, -100, tw))
    p, y = torch.rand(5), torch.rand(5)
    gi = torch.empty(0, device=DEV)
    with native("binary_cross_entropy_backward"):
        A.binary_cross_entropy_backward.grad_input(*tpu(go, p, y), None, 1, grad_input=gi)
    close(gi, A.binary_cross_entropy_backward(go, p, y, None, 1))


def test_nll_loss_errors():
    x = torch.randn(3, 5)
    with pytest.raises(IndexError):
        F.nll_loss(x, torch.tensor([1, 2, 5]))
    with pytest.raises(IndexError):
        F.nll_loss(tpu(x), tpu(torch.tensor([1, 2, 5]))).cpu()
    for t, w in [(torch.tensor([1.0, 2, 3]), None), (torch.tensor([1, 2]), None), (torch.tensor([1, 2, 3]), torch.ones(4))]:
        with pytest.raises(RuntimeError):
            A.nll_loss_forward(x, t, w, 1, -100)
        with pytest.raises(RuntimeError):
            A.nll_loss_forward(tpu(x), tpu(t), tpu(w), 1, -100)[0].cpu()


# ---- fused attention (the overrideable SDPA op) -----------------------------------------


def sdpa_ref(q, k, v, bias, causal, scale):
    """CPU math attention as F.scaled_dot_product_attention applies it: grouped-query heads
    expanded, a bool mask turned into -inf, the causal mask folded into the bias."""
    rep = q.shape[1] // k.shape[1]
    k2, v2 = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    L, S = q.shape[2], k.shape[2]
    if bias is not None and bias.dtype == torch.bool:
        bias = torch.zeros(bias.shape, dtype=q.dtype).masked_fill(~bias, float("-inf"))
    if causal:
        tri = torch.ones(L, S, dtype=torch.bool).tril()
        cm = torch.zeros(L, S, dtype=q.dtype).masked_fill(~tri, float("-inf"))
        bias = cm if bias is None else bias + cm
    return A._scaled_dot_product_attention_math(q, k2, v2, bias, 0.0, False, scale=scale)[0]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("causal,bias_kind,heads_kv", [(False, None, 4), (True, None, 2), (False, "float", 4),
                                                        (False, "bool", 1), (True, "float", 2)])
def test_fused_attention_overrideable(dtype, causal, bias_kind, heads_kv):
    torch.manual_seed(7)
    B, H, L, S, E, Ev = 2, 4, 5, 7, 8, 6
    q = torch.randn(B, H, L, E).to(dtype)
    k = torch.randn(B, heads_kv, S, E).to(dtype)
    v = torch.randn(B, heads_kv, S, Ev).to(dtype)
    bias = None
    if bias_kind == "float":
        bias = torch.randn(1, H, L, S).to(dtype)
    elif bias_kind == "bool":
        bias = torch.rand(L, S) > 0.3
        bias[1] = False  # a fully masked row: zeros, as ATen's safe softmax
    scale = 0.3 if causal else None
    with native("_scaled_dot_product_fused_attention_overrideable"):
        res = A._scaled_dot_product_fused_attention_overrideable(*tpu(q, k, v), tpu(bias), 0.0, causal, False,
                                                                 scale=scale)
    exp = sdpa_ref(q.double(), k.double(), v.double(), None if bias is None else
                   (bias if bias.dtype == torch.bool else bias.double()), causal,
                   scale if scale is not None else 1 / math.sqrt(E)).to(dtype)
    close(res[0], exp, scale=2)
    assert res[1].shape == (B, H, L)
    assert res[1].dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("L,S", [(70, 70), (45, 33), (33, 80), (32, 32)])
def test_fused_attention_causal_row_blocks(dtype, L, S):
    """Causal attention without bias runs in blocks of query rows that skip masked keys:
    several blocks, a partial last block, more queries than keys and the reverse; the
    log-sum-exp output (which the backward reuses) and the gradients as well."""
    torch.manual_seed(9)
    B, H, Hk, E = 2, 4, 2, 16
    q = torch.randn(B, H, L, E, dtype=dtype)
    k, v = torch.randn(B, Hk, S, E, dtype=dtype), torch.randn(B, Hk, S, E, dtype=dtype)
    with native("_scaled_dot_product_fused_attention_overrideable"):
        res = A._scaled_dot_product_fused_attention_overrideable(*tpu(q, k, v), None, 0.0, True, False)
    close(res[0], sdpa_ref(q.double(), k.double(), v.double(), None, True, 1 / math.sqrt(E)).to(dtype), scale=2)
    s = (q.double() @ k.double().repeat_interleave(H // Hk, 1).transpose(-1, -2)) / math.sqrt(E)
    s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    close(res[1], s.logsumexp(-1).to(res[1].dtype), scale=2)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    oc, gc = grads(fn, tuple(t.clone().requires_grad_() for t in (q, k, v)))
    with native("_scaled_dot_product_fused_attention_overrideable_backward"):
        ot, gt = grads(fn, tuple(tpu(t).requires_grad_() for t in (q, k, v)))
    close(ot, oc.detach(), scale=2)
    for a, e in zip(gt, gc):
        close(a, e, scale=4)


@pytest.mark.parametrize("mask", [None, "padding", "float"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L,S,E,Ev", [(64, 64, 32, 32), (37, 100, 80, 100), (130, 130, 128, 17), (3, 9, 1, 65)])
def test_fused_attention_f32_heads(causal, mask, L, S, E, Ev):
    """f32 heads run whole on one thread (host/attn_avx512f32.c where the CPU has AVX-512):
    score strips of 64 keys and a narrower last one, head dims past one 64-wide strip and
    not multiples of 16, a partial last block of 32 query rows; q, k and v as the
    transposed views a fused qkv projection gives; a bool padding mask broadcast over heads
    and rows (the second sequence's last keys dropped) or a float bias broadcast over the
    batch, transposed in memory; forward and the gradients of q, k and v against
    float64."""
    torch.manual_seed(10)
    B, H = 2, 3
    qkv = [torch.randn(B, n, H, d).transpose(1, 2) for n, d in ((L, E), (S, E), (S, Ev))]
    bias = None
    if mask == "padding":
        bias = torch.ones(B, 1, 1, S, dtype=torch.bool)
        bias[1, ..., S // 3:] = False
        bias[1, ..., 0] = bool(causal)  # causal: row 0 sees key 0 only; else a hole
    elif mask == "float":
        bias = torch.randn(1, H, S, L).transpose(-1, -2)  # keys not adjacent in memory
    # ATen's reference rejects a mask with is_causal: the causal part joins the mask
    ref_bias = bias
    if causal and bias is not None:
        tri = torch.ones(L, S, dtype=torch.bool).tril()
        ref_bias = bias & tri if bias.dtype == torch.bool else bias.masked_fill(~tri, float("-inf"))
    fn = lambda bias_, causal_: lambda q, k, v: F.scaled_dot_product_attention(q, k, v, bias_, is_causal=causal_)
    ref = ref_bias if ref_bias is None or ref_bias.dtype == torch.bool else ref_bias.double()
    oc, gc = grads(fn(ref, causal and bias is None), tuple(t.double().requires_grad_() for t in qkv))
    with native("_scaled_dot_product_fused_attention_overrideable",
                "_scaled_dot_product_fused_attention_overrideable_backward"):
        ot, gt = grads(fn(tpu(ref_bias), causal and bias is None), tuple(tpu(t).requires_grad_() for t in qkv))
    close(ot, oc.detach().float(), scale=2)
    for a, e in zip(gt, gc):
        close(a, e.float(), scale=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal,with_bias,heads_kv", [(False, False, 3), (True, True, 1), (False, True, 3)])
def test_fused_attention_overrideable_backward(dtype, causal, with_bias, heads_kv):
    torch.manual_seed(8)
    B, H, L, S, E = 2, 3, 4, 6, 5
    q = torch.randn(B, H, L, E, dtype=dtype, requires_grad=True)
    k = torch.randn(B, heads_kv, S, E, dtype=dtype, requires_grad=True)
    v = torch.randn(B, heads_kv, S, E, dtype=dtype, requires_grad=True)
    bias = torch.randn(B, 1, L, S, dtype=dtype, requires_grad=True) if with_bias else None
    inputs = (q, k, v) + ((bias,) if with_bias else ())
    oc = sdpa_ref(q, k, v, bias, causal, None)
    g = torch.randn_like(oc)
    gc = torch.autograd.grad(oc, inputs, g)
    with native("_scaled_dot_product_fused_attention_overrideable",
                "_scaled_dot_product_fused_attention_overrideable_backward"):
        res = A._scaled_dot_product_fused_attention_overrideable(*tpu(q, k, v), tpu(bias), 0.0, causal, False)
        gt = A._scaled_dot_product_fused_attention_overrideable_backward(
            tpu(g), *tpu(q, k, v), tpu(bias), [True, True, True, with_bias], res[0], res[1], opt(res[2]),
            opt(res[3]), res[4], res[5], 0.0, causal, opt(res[6]), opt(res[7]))
    close(res[0], oc.detach(), scale=10)
    for a, e in zip(gt, gc):
        close(a, e, scale=10)


def test_fused_attention_backward_grad_input_mask():
    q = torch.randn(1, 2, 3, 4)
    res = A._scaled_dot_product_fused_attention_overrideable(*tpu(q, q, q))
    g = A._scaled_dot_product_fused_attention_overrideable_backward(
        tpu(torch.randn(1, 2, 3, 4)), *tpu(q, q, q), None, [True, False, True, False], res[0], res[1],
        opt(res[2]), opt(res[3]), 3, 3, 0.0, False, opt(res[6]), opt(res[7]))
    assert g[0] is not None and g[1] is None and g[2] is not None and g[3] is None


@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_attention_autograd(with_bias):
    """The op's derivative formula calls the backward op with autograd's grad_input_mask."""
    torch.manual_seed(12)
    q, k, v = (torch.randn(2, 2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.randn(4, 4, dtype=torch.float64, requires_grad=with_bias) if with_bias else None
    ins = (q, k, v) + ((bias,) if with_bias else ())
    oc = sdpa_ref(q, k, v, bias, False, None)
    g = torch.randn_like(oc)
    gc = torch.autograd.grad(oc, ins, g)
    tins = tpu(*ins)
    with native("_scaled_dot_product_fused_attention_overrideable",
                "_scaled_dot_product_fused_attention_overrideable_backward"):
        ot = A._scaled_dot_product_fused_attention_overrideable(*tins[:3], tins[3] if with_bias else None)[0]
        gt = torch.autograd.grad(ot, tins, tpu(g))
    close(ot, oc.detach())
    for a, e in zip(gt, gc):
        close(a, e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_product_attention_routes_to_fused(dtype, causal):
    """F.scaled_dot_product_attention on tpu: forward and backward through the fused op."""
    torch.manual_seed(11)
    q, k, v = (torch.randn(2, 3, 5, 8).to(dtype).requires_grad_() for _ in range(3))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    oc, gc = grads(fn, (q, k, v))
    seen = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.__name__)
            return func(*args, **(kwargs or {}))

    with native("_scaled_dot_product_fused_attention_overrideable",
                "_scaled_dot_product_fused_attention_overrideable_backward"), Record():
        ot, gt = grads(fn, tpu(q, k, v))
    assert "_scaled_dot_product_fused_attention_overrideable.default" in seen
    assert "_scaled_dot_product_fused_attention_overrideable_backward.default" in seen
    close(ot, oc.detach(), scale=2)
    for a, e in zip(gt, gc):
        close(a, e, scale=4)


def opt(t):
    """An undefined Tensor return, handed back where the schema wants a Tensor."""
    return torch.empty(0, device=DEV) if t is None else t


def test_fused_attention_errors():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(RuntimeError):
        A._scaled_dot_product_fused_attention_overrideable(tpu(q), tpu(q.double()), tpu(q))
    with pytest.raises(RuntimeError):
        A._scaled_dot_product_fused_attention_overrideable(tpu(q), tpu(torch.randn(1, 3, 3, 4)),
                                                           tpu(torch.randn(1, 3, 3, 4)))


# ---- pointwise losses -------------------------------------------------------------------

LOSSES = {
    "mse_loss": lambda x, y, r: F.mse_loss(x, y, reduction=r),
    "smooth_l1_loss": lambda x, y, r: F.smooth_l1_loss(x, y, reduction=r, beta=0.5),
    "huber_loss": lambda x, y, r: F.huber_loss(x, y, reduction=r, delta=0.7),
    "binary_cross_entropy": lambda x, y, r: F.binary_cross_entropy(x.sigmoid(), y, reduction=r),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_pointwise_losses(dtype, name, reduction):
    torch.manual_seed(9)
    x = torch.randn(4, 6).to(dtype)[:, ::2].requires_grad_()  # non-contiguous
    y = (torch.rand(4, 3) if name == "binary_cross_entropy" else torch.randn(4, 3)).to(dtype)
    fn = lambda x: LOSSES[name](x, y.to(x.device), reduction)
    oc, (gc,) = grads(fn, (x,))
    ops = [name, name + "_backward"]
    if name == "binary_cross_entropy":
        ops = ops[:]  # sigmoid belongs to another family
    with native(*ops):
        ot, (gt,) = grads(fn, (tpu(x),))
    close(ot, oc.detach(), scale=2)
    close(gt, gc, scale=2)


def test_pointwise_losses_broadcast_weight_and_out():
    torch.manual_seed(10)
    x, y = torch.rand(3, 4), torch.rand(3, 4)
    w = torch.rand(4)
    with native("binary_cross_entropy"):
        got = A.binary_cross_entropy(*tpu(x, y, w), 1)
    close(got, A.binary_cross_entropy(x, y, w, 1))
    a, b = torch.randn(3, 1), torch.randn(4)
    out = torch.empty(0, device=DEV)
    with native("mse_loss"):
        A.mse_loss.out(*tpu(a, b), 0, out=out)
    close(out, A.mse_loss(a, b, 0))
    g = torch.randn(3, 4)
    with native("smooth_l1_loss_backward"):
        got = A.smooth_l1_loss_backward(*tpu(g, a, b), 0, 0.0)
    close(got, A.smooth_l1_loss_backward(g, a.expand(3, 4), b.expand(3, 4), 0, 0.0))


def test_pointwise_loss_errors():
    x = torch.rand(3)
    with pytest.raises(RuntimeError):
        F.binary_cross_entropy(x + 1, x)
    with pytest.raises(RuntimeError):
        F.binary_cross_entropy(tpu(x + 1), tpu(x)).cpu()
    with pytest.raises(RuntimeError):
        A.smooth_l1_loss(tpu(x), tpu(x), 1, -1.0)
    with pytest.raises(RuntimeError):
        A.binary_cross_entropy(tpu(x), tpu(x.double()))
    with pytest.raises(NotImplementedError):
        A.mse_loss(tpu(torch.ones(3, dtype=torch.long)), tpu(torch.ones(3, dtype=torch.long)))


# ---- weight norm ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_interface(dtype, dim):
    torch.manual_seed(20)
    v = torch.randn(4, 3, 5).to(dtype)
    g = torch.randn((4, 1, 1) if dim == 0 else (1, 1, 5)).to(dtype)
    with native("_weight_norm_interface"):
        got = A._weight_norm_interface(*tpu(v, g), dim)
    exp = A._weight_norm_interface(v, g, dim)
    assert got[1].dtype == (torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype)
    for a, e in zip(got, exp):
        close(a, e, scale=2)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_backward(dtype, dim):
    """torch._weight_norm routes to the fused op for the first and last dim; its autograd
    node calls _weight_norm_interface_backward."""
    torch.manual_seed(21)
    v = torch.randn(6, 2, 7).to(dtype).requires_grad_()
    g = torch.randn((6, 1, 1) if dim == 0 else (1, 1, 7)).to(dtype).requires_grad_()
    fn = lambda v, g: torch._weight_norm(v, g, dim)
    oc, gc = grads(fn, (v, g))
    with native("_weight_norm_interface", "_weight_norm_interface_backward"):
        ot, gt = grads(fn, tpu(v, g))
    close(ot, oc.detach(), scale=2)
    for a, e in zip(gt, gc):
        close(a, e, scale=4)


def test_weight_norm_out_forms_and_middle_dim():
    torch.manual_seed(22)
    v, g = torch.randn(3, 4, 5), torch.randn(1, 4, 1)
    # the tpu kernel takes any dim (ATen's fused CPU kernel only the first and last):
    # compare with the composite formula
    with native("_weight_norm_interface"):
        w, norms = A._weight_norm_interface(*tpu(v, g), 1)
    ref_norms = A.norm_except_dim(v, 2, 1)
    close(norms, ref_norms)
    close(w, v * (g / ref_norms))
    v0, g0 = torch.randn(4, 3), torch.randn(4, 1)
    outs = [torch.empty(0, device=DEV) for _ in range(2)]
    with native("_weight_norm_interface"):
        r = A._weight_norm_interface.out(*tpu(v0, g0), 0, out0=outs[0], out1=outs[1])
    assert r[0] is outs[0] and r[1] is outs[1]
    w0, n0 = A._weight_norm_interface(v0, g0, 0)
    close(outs[0], w0)
    close(outs[1], n0)
    gw = torch.randn(4, 3)
    outs = [torch.empty(0, device=DEV) for _ in range(2)]
    with native("_weight_norm_interface_backward"):
        A._weight_norm_interface_backward.out(*tpu(gw, v0, g0, n0), 0, out0=outs[0], out1=outs[1])
    for a, e in zip(outs, A._weight_norm_interface_backward(gw, v0, g0, n0, 0)):
        close(a, e)


def test_weight_norm_parametrization_conv1d():
    """wav2vec2's positional convolution: weight_norm over dim 2 of a Conv1d weight."""
    torch.manual_seed(23)
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(8, 8, 5, padding=2, groups=2), dim=2)
    x = torch.randn(2, 8, 11)
    yc = conv(x)
    yc.sum().backward()
    gc = [p.grad.clone() for p in conv.parameters()]
    conv.zero_grad()
    ct = conv.to(DEV)
    with native("_weight_norm_interface", "_weight_norm_interface_backward"):
        yt = ct(tpu(x))
        yt.sum().backward()
    close(yt.detach(), yc.detach(), scale=2)
    for p, e in zip(ct.parameters(), gc):
        close(p.grad, e, scale=4)


def test_weight_norm_errors():
    v, g = torch.randn(3, 4), torch.randn(3, 1)
    with pytest.raises(NotImplementedError):
        A._weight_norm_interface(tpu(v.long()), tpu(g.long()), 0)
    with pytest.raises(RuntimeError, match="expected scalar type"):
        A._weight_norm_interface(tpu(v), tpu(g.double()), 0)
    with pytest.raises(RuntimeError):
        A._weight_norm_interface(tpu(v), tpu(torch.randn(4, 1)), 0)
    with pytest.raises(RuntimeError):
        A._weight_norm_interface(tpu(v), tpu(g), 2)
    _, n = A._weight_norm_interface(v, g, 0)
    with pytest.raises(RuntimeError):
        A._weight_norm_interface_backward(tpu(torch.randn(4, 3)), *tpu(v, g, n), 0)


# ---- group norm -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("affine", [True, False])
def test_native_group_norm(dtype, affine):
    torch.manual_seed(24)
    x = (torch.randn(3, 6, 4, 5) * 2 + 1).to(dtype)
    w = torch.randn(6).to(dtype) if affine else None
    b = torch.randn(6).to(dtype) if affine else None
    with native("native_group_norm"):
        got = A.native_group_norm(tpu(x), tpu(w), tpu(b), 3, 6, 20, 3, 1e-5)
    exp = A.native_group_norm(x, w, b, 3, 6, 20, 3, 1e-5)
    for a, e in zip(got, exp):
        close(a, e, scale=2)


def test_native_group_norm_mixed_and_out():
    torch.manual_seed(25)
    x = torch.randn(2, 4, 9).to(torch.bfloat16)
    w, b = torch.randn(4), torch.randn(4)
    with native("native_group_norm"):
        got = A.native_group_norm(tpu(x), *tpu(w, b), 2, 4, 9, 2, 1e-5)
    exp = A.native_group_norm(x, w, b, 2, 4, 9, 2, 1e-5)
    assert got[1].dtype == torch.float32 and got[2].dtype == torch.float32
    for a, e in zip(got, exp):
        close(a, e, scale=2)
    outs = [torch.empty(0, device=DEV, dtype=d) for d in (torch.bfloat16, torch.float32, torch.float32)]
    with native("native_group_norm"):
        r = A.native_group_norm.out(tpu(x), *tpu(w, b), 2, 4, 9, 2, 1e-5, out0=outs[0], out1=outs[1], out2=outs[2])
    assert r[0] is outs[0]
    for a, e in zip(outs, exp):
        close(a, e, scale=2)


@pytest.mark.parametrize("layout", ["channels_last", "transposed", "sliced"])
def test_group_norm_strided_inputs(layout):
    """F.group_norm on non-contiguous input; the composite path used to fail with 'view size
    is not compatible' (timm poolformerv2 feeds channels-last activations)."""
    torch.manual_seed(26)
    base = torch.randn(2, 6, 5, 7)
    if layout == "channels_last":
        x = base.to(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = base.transpose(2, 3)
    else:
        x = torch.randn(2, 12, 5, 7)[:, ::2]
    x.requires_grad_()
    w, b = torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)
    fn = lambda x, w, b: F.group_norm(x, 2, w, b)
    oc, gc = grads(fn, (x, w, b))
    xt = x.detach().to(DEV)
    if layout == "channels_last":
        assert xt.is_contiguous(memory_format=torch.channels_last)
    with native("native_group_norm", "native_group_norm_backward"):
        ot, gt = grads(fn, (xt.requires_grad_(), *tpu(w, b)))
    close(ot, oc.detach(), scale=2)
    for a, e in zip(gt, gc):
        close(a, e, scale=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_group_norm_backward(dtype):
    torch.manual_seed(27)
    x = torch.randn(4, 6, 10).to(dtype).requires_grad_()
    w = torch.randn(6).to(dtype).requires_grad_()
    b = torch.randn(6).to(dtype).requires_grad_()
    fn = lambda x, w, b: F.group_norm(x, 3, w, b)
    oc, gc = grads(fn, (x, w, b))
    with native("native_group_norm", "native_group_norm_backward"):
        ot, gt = grads(fn, tpu(x, w, b))
    close(ot, oc.detach(), scale=2)
    for a, e in zip(gt, gc):
        close(a, e, scale=4)


# ---- batch norm ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 6, 9, 7), (64, 16, 16, 16), (3, 5)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(dtype, shape, training):
    """Forward, backward and the running statistics, train and eval; the shapes give runs
    with and without a vector tail, enough channels x elements to run over the pool, and
    a 2-d input (inner size 1)."""
    torch.manual_seed(31)
    c = shape[1]
    x = (torch.randn(shape) * 2 + 0.5).to(dtype).requires_grad_()
    w, b = torch.randn(c).to(dtype).requires_grad_(), torch.randn(c).to(dtype).requires_grad_()
    rm, rv = torch.randn(c).to(dtype), torch.rand(c).to(dtype) + 0.5
    rm_t, rv_t = tpu(rm, rv)
    fn = lambda rm, rv: lambda x, w, b: F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.3)
    oc, gc = grads(fn(rm, rv), (x, w, b))
    with native("native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
                "_native_batch_norm_legit_no_training"):
        ot, gt = grads(fn(rm_t, rv_t), tpu(x, w, b))
    close(ot, oc.detach(), scale=2)
    for a, e in zip(gt, gc):
        close(a, e, scale=4)
    close(rm_t, rm)
    close(rv_t, rv)


@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_legit(training):
    """The batch norm ops AOTAutograd's graphs call (torch.compile): _native_batch_norm_legit
    (running statistics updated in place in training), its no_stats overload, and
    _native_batch_norm_legit_no_training (its composite, through the legit op), natively."""
    torch.manual_seed(33)
    A = torch.ops.aten
    x, w, b = torch.randn(4, 3, 5, 5), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rm_t, rv_t = tpu(rm, rv)
    with native("_native_batch_norm_legit", "_native_batch_norm_legit_no_training"):
        calls = [(A._native_batch_norm_legit, lambda rm, rv: (rm, rv, training, 0.1, 1e-5))]
        if training:
            calls.append((A._native_batch_norm_legit.no_stats, lambda rm, rv: (True, 0.1, 1e-5)))
        else:
            calls.append((A._native_batch_norm_legit_no_training, lambda rm, rv: (rm, rv, 0.1, 1e-5)))
        for op, rest in calls:
            expected = op(x, w, b, *rest(rm, rv))
            actual = op(*tpu(x, w, b), *rest(rm_t, rv_t))
            for a, e in zip(actual, expected):
                close(a, e, scale=2)
            close(rm_t, rm)
            close(rv_t, rv)
    # (CPU's kernel crashes the process on this call; tpu raises)
    with pytest.raises(RuntimeError, match="running_mean and running_var must be defined in evaluation mode"):
        A._native_batch_norm_legit.no_stats(tpu(x), None, None, False, 0.1, 1e-5)


def test_batch_norm_channels_last_and_input_grad_only():
    torch.manual_seed(32)
    x = torch.randn(4, 8, 5, 6).to(memory_format=torch.channels_last).requires_grad_()
    w, b = torch.randn(8), torch.randn(8)
    fn = lambda x: F.batch_norm(x, None, None, w.to(x.device), b.to(x.device), training=True)
    oc, gc = grads(fn, (x,))
    ot, gt = grads(fn, (tpu(x),))
    close(ot, oc.detach(), scale=2)
    close(gt[0], gc[0], scale=4)


def test_group_norm_backward_output_mask_out_and_empty():
    torch.manual_seed(28)
    x, dy, w = torch.randn(3, 4, 5), torch.randn(3, 4, 5), torch.randn(4)
    _, mean, rstd = A.native_group_norm(x, w, None, 3, 4, 5, 2, 1e-5)
    for mask in ([True, False, False], [False, True, True], [True, True, False]):
        exp = A.native_group_norm_backward(dy, x, mean, rstd, w, 3, 4, 5, 2, mask)
        with native("native_group_norm_backward"):
            got = A.native_group_norm_backward(*tpu(dy, x, mean, rstd, w), 3, 4, 5, 2, mask)
        for a, e, m in zip(got, exp, mask):
            assert (a is None) == (not m)
            close(a, e)
    # no weight: grad_weight/grad_bias take the input's dtype and shape (C,)
    exp = A.native_group_norm_backward(dy, x, mean, rstd, None, 3, 4, 5, 2, [True, True, True])
    outs = [torch.empty(0, device=DEV) for _ in range(3)]
    with native("native_group_norm_backward"):
        A.native_group_norm_backward.out(*tpu(dy, x, mean, rstd), None, 3, 4, 5, 2, [True, True, True],
                                         out0=outs[0], out1=outs[1], out2=outs[2])
    for a, e in zip(outs, exp):
        close(a, e)
    # an empty input: zero means, NaN rstd, zero parameter gradients
    xe = torch.randn(0, 4, 5)
    with native("native_group_norm"):
        got = A.native_group_norm(tpu(xe), tpu(w), None, 0, 4, 5, 2, 1e-5)
    for a, e in zip(got, A.native_group_norm(xe, w, None, 0, 4, 5, 2, 1e-5)):
        close(a, e)
    xe = torch.randn(2, 4, 0)
    with pytest.raises(RuntimeError, match="HxW"):  # as on CPU, the forward refuses HxW = 0
        A.native_group_norm(tpu(xe), tpu(w), None, 2, 4, 0, 2, 1e-5)
    me, re = torch.zeros(2, 2), torch.zeros(2, 2)
    with native("native_group_norm_backward"):
        got = A.native_group_norm_backward(*tpu(xe, xe, me, re, w), 2, 4, 0, 2, [True, True, True])
    for a, e in zip(got, A.native_group_norm_backward(xe, xe, me, re, w, 2, 4, 0, 2, [True, True, True])):
        close(a, e)


def test_group_norm_errors():
    x = torch.randn(2, 6, 4)
    cases = [
        (x, None, None, 2, 6, 4, 4),              # 6 channels in 4 groups
        (x, None, None, 2, 6, 4, 0),              # no groups
        (x, torch.ones(5), None, 2, 6, 4, 3),     # weight of the wrong size
        (x, torch.ones(6, dtype=torch.float64), None, 2, 6, 4, 3),  # mixed dtype, float input
        (x, None, None, 2, 6, 5, 3),              # numel != N * C * HxW
    ]
    for xx, w, b, n, c, hw, grp in cases:
        with pytest.raises(RuntimeError) as ec:
            A.native_group_norm(xx, w, b, n, c, hw, grp, 1e-5)
        with pytest.raises(RuntimeError) as et:
            A.native_group_norm(tpu(xx), tpu(w), tpu(b), n, c, hw, grp, 1e-5)
        assert type(et.value) is type(ec.value)
    with pytest.raises(NotImplementedError):
        A.native_group_norm(tpu(x.long()), None, None, 2, 6, 4, 3, 1e-5)
    _, m, r = A.native_group_norm(x, None, None, 2, 6, 4, 3, 1e-5)
    with pytest.raises(RuntimeError, match="X and dY"):
        A.native_group_norm_backward(*tpu(x.double(), x, m, r), None, 2, 6, 4, 3, [True, True, True])


# ---- reflection / replication padding ---------------------------------------------------

PADS = {1: [2, -1], 2: [1, 3, -1, 2], 3: [0, 2, 1, -1, 2, 1]}


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("dtype", FLOATS)
def test_edge_pad(mode, k, batched, dtype):
    torch.manual_seed(29)
    shape = ([2] if batched else []) + [3] + [4, 5, 6][3 - k:]
    x = torch.randn(shape).to(dtype).requires_grad_()
    fn = lambda x: F.pad(x, PADS[k], mode=mode)
    name = f"{'reflection' if mode == 'reflect' else 'replication'}_pad{k}d"
    oc, (gc,) = grads(fn, (x,))
    with native(name, name + "_backward"):
        ot, (gt,) = grads(fn, (tpu(x),))
    assert torch.equal(ot.detach().cpu(), oc.detach())  # pure data movement
    # the backward adds in the gradient's dtype, in ATen's order: equal, not just close
    assert torch.equal(gt.cpu(), gc), (gt.cpu() - gc).abs().max()


@pytest.mark.parametrize("op", ["reflection_pad2d", "replication_pad3d", "replication_pad1d"])
def test_edge_pad_ints_noncontiguous_and_out(op):
    torch.manual_seed(30)
    k = int(op[-2])
    x = torch.randint(-50, 50, (2, 3, 6, 7, 8)[3 - k:]).transpose(-1, -2)  # non-contiguous
    pad = [1, 2, 2, 1, 1, 1][:2 * k]
    f = getattr(A, op)
    with native(op):
        got = f(tpu(x), pad)
    close(got, f(x, pad))
    out = torch.empty(0, dtype=x.dtype, device=DEV)
    with native(op):
        r = f.out(tpu(x), pad, out=out)
    assert r is out
    close(out, f(x, pad))
    xf = x.float()
    g = torch.randn(f(xf, pad).shape)
    gi = torch.empty(0, device=DEV)
    bw = getattr(A, op + "_backward")
    with native(op + "_backward"):
        bw.grad_input(*tpu(g, xf), pad, grad_input=gi)
    close(gi, bw(g, xf, pad))


def test_edge_pad_channels_last_and_empty_batch():
    torch.manual_seed(31)
    x = torch.randn(2, 3, 5, 4).to(memory_format=torch.channels_last).requires_grad_()
    for mode in ("reflect", "replicate"):
        fn = lambda x: F.pad(x, [2, 1, 1, 3], mode=mode)
        oc, (gc,) = grads(fn, (x,))
        ot, (gt,) = grads(fn, (tpu(x),))
        close(ot, oc.detach())
        close(gt, gc)
    xe = torch.randn(0, 3, 4)
    for op in (A.reflection_pad1d, A.replication_pad1d):
        close(op(tpu(xe), [1, 2]), op(xe, [1, 2]))


def test_edge_pad_errors():
    x = torch.randn(2, 3, 4)
    cases = [
        (A.reflection_pad1d, x, [4, 1]),          # padding >= input size
        (A.reflection_pad1d, x, [1, 4]),
        (A.reflection_pad2d, x, [1, 1, 3, 0]),    # height 3, padding 3
        (A.reflection_pad1d, x, [1, 1, 1]),       # wrong padding length
        (A.replication_pad2d, x, [1, 1]),
        (A.reflection_pad1d, torch.randn(2, 2, 3, 4), [1, 1]),  # 4-D input to a 1-D pad
        (A.replication_pad1d, torch.randn(4), [1, 1]),
        (A.replication_pad1d, torch.randn(3, 0, 4), [1, 1]),   # empty non-batch dim
        (A.replication_pad2d, x, [-2, -2, 0, 0]),  # output width 0
        (A.replication_pad1d, x, [-2, -2]),
    ]
    for op, xx, pad in cases:
        with pytest.raises(RuntimeError) as ec:
            op(xx, pad)
        with pytest.raises(RuntimeError) as et:
            op(tpu(xx), pad)
        assert type(et.value) is type(ec.value), (op, pad)
    with pytest.raises(NotImplementedError):
        A.reflection_pad1d(tpu(x > 0), [1, 1])
    with pytest.raises(NotImplementedError):
        A.replication_pad1d_backward(*tpu(torch.ones(2, 3, 6, dtype=torch.long), x.long()), [1, 1])
    with pytest.raises(RuntimeError, match="expected scalar type"):
        A.reflection_pad1d_backward(*tpu(torch.ones(2, 3, 6, dtype=torch.float64), x), [1, 1])
    with pytest.raises(RuntimeError, match="width unexpected"):
        A.reflection_pad1d_backward(*tpu(torch.ones(2, 3, 5), x), [1, 1])
    with pytest.raises(RuntimeError, match="height unexpected"):
        A.replication_pad2d_backward(*tpu(torch.ones(2, 4, 6), x), [1, 1, 1, 1])


# ---- im2col / col2im --------------------------------------------------------------------

WINDOWS = [  # kernel_size, dilation, padding, stride
    ((2, 3), (1, 1), (0, 0), (1, 1)),
    ((3, 2), (2, 1), (1, 2), (2, 1)),
    ((1, 1), (1, 1), (0, 0), (3, 2)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("win", range(len(WINDOWS)))
@pytest.mark.parametrize("batched", [True, False])
def test_unfold_fold(dtype, win, batched):
    torch.manual_seed(32)
    ks, dil, pad, st = WINDOWS[win]
    x = torch.randn(([2] if batched else []) + [3, 7, 8]).to(dtype).requires_grad_()
    fn = lambda x: F.unfold(x, ks, dil, pad, st)
    oc, (gc,) = grads(fn, (x,))
    with native("im2col", "col2im"):
        ot, (gt,) = grads(fn, (tpu(x),))
    assert torch.equal(ot.detach().cpu(), oc.detach())
    # col2im adds in the tensor's dtype in ATen's order: equal, not just close
    assert torch.equal(gt.cpu(), gc), (gt.cpu() - gc).abs().max()
    cols = oc.detach().requires_grad_()
    fold = lambda c: F.fold(c, (7, 8), ks, dil, pad, st)
    oc2, (gc2,) = grads(fold, (cols,))
    with native("im2col", "col2im"):
        ot2, (gt2,) = grads(fold, (tpu(cols),))
    assert torch.equal(ot2.detach().cpu(), oc2.detach())
    assert torch.equal(gt2.cpu(), gc2)


def test_im2col_col2im_bool_noncontiguous_and_out():
    torch.manual_seed(33)
    x = torch.randn(2, 3, 6, 5).transpose(2, 3)  # non-contiguous
    args = ([2, 2], [1, 1], [1, 0], [1, 2])
    for t in (x, x > 0):
        with native("im2col"):
            got = A.im2col(tpu(t), *args)
        close(got, A.im2col(t, *args))
    out = torch.empty(0, device=DEV)
    with native("im2col"):
        r = A.im2col.out(tpu(x), *args, out=out)
    assert r is out
    close(out, A.im2col(x, *args))
    cols = A.im2col(x, *args)
    for c in (cols, cols > 0, cols.transpose(1, 2).contiguous().transpose(1, 2)):
        with native("col2im"):
            got = A.col2im(tpu(c), [5, 6], *args)
        close(got, A.col2im(c, [5, 6], *args))
    out = torch.empty(0, device=DEV)
    with native("col2im"):
        A.col2im.out(tpu(cols), [5, 6], *args, out=out)
    close(out, A.col2im(cols, [5, 6], *args))


def test_im2col_col2im_errors():
    x = torch.randn(1, 2, 4, 4)
    im2col_cases = [
        (x, [0, 2], [1, 1], [0, 0], [1, 1]),
        (x, [2, 2], [0, 1], [0, 0], [1, 1]),
        (x, [2, 2], [1, 1], [-1, 0], [1, 1]),
        (x, [2, 2], [1, 1], [0, 0], [1, 0]),
        (x, [2, 2, 2], [1, 1], [0, 0], [1, 1]),
        (x, [5, 2], [1, 1], [0, 0], [1, 1]),      # no sliding block fits
        (torch.randn(2, 4, 4, 4, 4), [2, 2], [1, 1], [0, 0], [1, 1]),
        (torch.randn(1, 0, 4, 4), [2, 2], [1, 1], [0, 0], [1, 1]),
    ]
    for a in im2col_cases:
        with pytest.raises(RuntimeError) as ec:
            A.im2col(*a)
        with pytest.raises(RuntimeError) as et:
            A.im2col(tpu(a[0]), *a[1:])
        assert type(et.value) is type(ec.value), a[1:]
    cols = A.im2col(x, [2, 2], [1, 1], [0, 0], [1, 1])  # (1, 8, 9)
    col2im_cases = [
        (cols, [4, 5], [2, 2], [1, 1], [0, 0], [1, 1]),   # 9 blocks != 12
        (cols, [4, 4], [3, 3], [1, 1], [0, 0], [1, 1]),   # 8 planes not divisible by 9
        (cols, [4], [2, 2], [1, 1], [0, 0], [1, 1]),
        (cols, [4, 4], [2, 2], [1, 1], [0, 0], [0, 1]),
        (torch.randn(8), [4, 4], [2, 2], [1, 1], [0, 0], [1, 1]),
    ]
    for a in col2im_cases:
        with pytest.raises(RuntimeError) as ec:
            A.col2im(*a)
        with pytest.raises(RuntimeError) as et:
            A.col2im(tpu(a[0]), *a[1:])
        assert type(et.value) is type(ec.value), a[1:]
    with pytest.raises(NotImplementedError):
        A.im2col(tpu(x.long()), [2, 2], [1, 1], [0, 0], [1, 1])
    with pytest.raises(NotImplementedError):
        A.col2im(tpu(cols.long()), [4, 4], [2, 2], [1, 1], [0, 0], [1, 1])


# ---- PyTorch's fused transformer inference path ("better transformer") ----------------------

def _fast_path_modules():
    torch.manual_seed(0)
    layer = lambda **kw: torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, **kw)
    return {
        "encoder": torch.nn.TransformerEncoder(layer(), 2, enable_nested_tensor=False),
        "encoder_gelu_norm_first": torch.nn.TransformerEncoder(layer(activation="gelu", norm_first=True), 2,
                                                               enable_nested_tensor=False),
        "mha": torch.nn.MultiheadAttention(32, 4, batch_first=True),
    }


@pytest.mark.parametrize("name", ["encoder", "encoder_gelu_norm_first", "mha"])
@pytest.mark.parametrize("masked", [False, True, "allpad"], ids=["nomask", "padmask", "allpad"])
def test_transformer_fast_path_runs_natively(name, masked):
    """nn.TransformerEncoder / nn.MultiheadAttention in eval take PyTorch's fused path
    (_transformer_encoder_layer_fwd, _native_multi_head_attention) on tpu too: it must
    match CPU with no op on the CPU fallback, key padding mask included (with every key
    of a sequence padded, CPU's fused path gives NaN rows; so does tpu's)."""

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    m = _fast_path_modules()[name].eval()
    x = torch.randn(2, 5, 32)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]]) if masked else None
    if masked == "allpad":
        pad = torch.tensor([[False] * 5, [True] * 5])
    fused = "_native_multi_head_attention" if name == "mha" else "_transformer_encoder_layer_fwd"
    # debug mode's NaN check would raise on the NaN rows CPU gives too
    nan_ok = torchtpu.set_debug_options(nan="warn") if masked == "allpad" else contextlib.nullcontext()
    with torch.no_grad(), nan_ok:
        with Seen() as seen:  # the CPU reference takes the fused path as well
            ref = m(x, x, x, key_padding_mask=pad, need_weights=False)[0] if name == "mha" \
                else m(x, src_key_padding_mask=pad)
        assert fused in seen.ops
        m.to("tpu")
        xt, pt = tpu(x), None if pad is None else tpu(pad)  # q, k, v the same tensor: self-attention
        with no_cpu_fallback(), Seen() as seen:
            got = m(xt, xt, xt, key_padding_mask=pt, need_weights=False)[0] if name == "mha" \
                else m(xt, src_key_padding_mask=pt)
        assert fused in seen.ops
    close(got, ref)
    assert ref.isnan().any() == (masked == "allpad")


# ---- the fast path's kernels one by one: _masked_softmax, _transform_bias_rescale_qkv,
# ---- _addmm_activation ------------------------------------------------------------------

def _pair(fn):
    """fn(device) on CPU and on tpu from the same random draws."""
    torch.manual_seed(7)
    exp = fn("cpu")
    torch.manual_seed(7)
    with native("_masked_softmax", "_transform_bias_rescale_qkv", "_addmm_activation", "relu", "gelu", "addmm"):
        got = fn(DEV)
    return got, exp


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_masked_softmax_general_mask(dtype, dim):
    """mask_type 2 (mask shaped like the input) over every dim; a row with every position
    masked is NaN throughout, as CPU's kernel gives it."""
    def f(dev):
        x = torch.randn(3, 7, 33).to(dtype)
        m = torch.rand(3, 7, 33) > 0.5
        m[0, 1], m[2, :, 4] = True, True  # fully masked rows along dims 2 and 1
        return A._masked_softmax(x.to(dev), m.to(dev), dim, 2)
    got, exp = _pair(f)
    assert exp.isnan().any()
    close(got, exp)


@pytest.mark.parametrize("mask_type", [0, 1])
@pytest.mark.parametrize("dim", [3, -1, 2, None])
def test_masked_softmax_attention_and_padding_masks(mask_type, dim):
    """mask_type 0: an [L, L] attention mask, 1: a [B, L] key padding mask, of a
    [B, heads, L, L] input; over the last dim and (expanded, as CPU does) any other."""
    def f(dev):
        x = torch.randn(2, 3, 5, 5)
        m = torch.rand(5, 5) > 0.6 if mask_type == 0 else torch.rand(2, 5) > 0.6
        m[1] = True
        return A._masked_softmax(x.to(dev), m.to(dev), dim, mask_type)
    close(*_pair(f))


def test_masked_softmax_values_edges_and_out():
    """Masked NaN is ignored, unmasked NaN / +inf / all -inf poison the row (NaN); a huge
    negative unmasked value is not confused with masking; 0-dim and empty inputs; out=
    needs the input's dtype; a non-contiguous mask."""
    x = torch.tensor([[1.0, float("inf"), float("-inf")], [1.0, float("nan"), 2.0], [float("-inf")] * 3,
                      [1.0, float("nan"), 5.0], [-3e38, -3e38, 0.0]])
    m = torch.tensor([[False] * 3, [False] * 3, [False, False, True], [False, True, False], [False, False, True]])
    got, exp = _pair(lambda dev: A._masked_softmax(x.to(dev), m.to(dev), -1, 2))
    close(got, exp)
    for xs, ms, d in [(torch.tensor(1.5), torch.tensor(False), None), (torch.tensor(1.5), torch.tensor(True), 0),
                      (torch.empty(0, 5), torch.empty(0, 5, dtype=torch.bool), -1)]:
        close(*_pair(lambda dev: A._masked_softmax(xs.to(dev), ms.to(dev), d, None)))
    mt = torch.rand(6, 4) > 0.5
    close(*_pair(lambda dev: A._masked_softmax(torch.randn(4, 6).to(dev), mt.to(dev).t(), 1, 2)))
    out = torch.empty(0, device=DEV)
    r = A._masked_softmax(tpu(x), tpu(m), -1, 2, out=out)
    assert r.data_ptr() == out.data_ptr()
    close(out, exp)
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float, but got double instead"):
        A._masked_softmax(tpu(x), tpu(m), -1, 2, out=torch.empty(0, device=DEV, dtype=torch.float64))


def test_masked_softmax_noncontiguous_input():
    """A non-contiguous input gives the softmax of its values. (CPU's kernel writes a
    non-contiguous input's result in contiguous order into an output with the input's
    strides, which scrambles it; compared here with CPU on a contiguous copy.)"""
    x = torch.randn(4, 6).t()
    m = torch.rand(6, 4) > 0.5
    with native("_masked_softmax"):
        got = A._masked_softmax(tpu(x), tpu(m), 0, 2)
    close(got, A._masked_softmax(x.contiguous(), m, 0, 2))


@pytest.mark.parametrize("call,exc,msg", [
    (lambda x, dev: A._masked_softmax(x, torch.ones(4, 4, dtype=torch.int32, device=dev), -1, 0), RuntimeError,
     "Mask should be a boolean tensor"),
    (lambda x, dev: A._masked_softmax(x, torch.ones(4, 4, dtype=torch.bool, device=dev), -1, None), RuntimeError,
     "Mask Type should be defined"),
    (lambda x, dev: A._masked_softmax(x, torch.ones(4, 4, dtype=torch.bool, device=dev), -1, 3), RuntimeError,
     r"Mask Type should be 0 \(src_mask\) or 1"),
    (lambda x, dev: A._masked_softmax(x, torch.ones(2, 4, dtype=torch.bool, device=dev), -1, 0), RuntimeError,
     r"For mask_type == 0 mask shape should be \(L, L\)"),
    (lambda x, dev: A._masked_softmax(x, torch.ones(4, 4, dtype=torch.bool, device=dev), -1, 1), RuntimeError,
     r"For mask_type == 1 mask shape should be \(B, L\)"),
    (lambda x, dev: A._masked_softmax(x[0], torch.ones(4, 4, dtype=torch.bool, device=dev), -1, 0), RuntimeError,
     "For mask_type == 2 mask shape should match input shape"),
    (lambda x, dev: A._masked_softmax(torch.randn(2, 3, 4, 5, device=dev), torch.ones(2, 4, dtype=torch.bool, device=dev),
                                      -1, 1), RuntimeError, "The expanded size of the tensor"),
    (lambda x, dev: A._masked_softmax(x, torch.ones(4, 4, dtype=torch.bool, device=dev), 4, 0), IndexError,
     "Dimension out of range"),
], ids=["mask_dtype", "type_none", "type_3", "type0_shape", "type1_shape", "type2_shape", "type1_expand", "dim"])
def test_masked_softmax_errors_match_cpu(call, exc, msg):
    x = torch.randn(2, 3, 4, 4)
    with pytest.raises(exc, match=msg):
        call(x, "cpu")
    with pytest.raises(exc, match=msg):
        call(tpu(x), DEV)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,dh", [(2, 2), (4, 8), (3, 5), (2, 64)])
def test_transform_bias_rescale_qkv(dtype, heads, dh):
    """q, k, v of the fused attention's input projection: bit-identical to CPU (its
    float32 arithmetic for bf16/f16 included); a non-contiguous qkv and bias; out=."""
    D = heads * dh
    def f(dev):
        qkv = torch.randn(5, 2, 3 * D).to(dtype).to(dev).transpose(0, 1)  # [2, 5, 3D], non-contiguous
        bias = torch.randn(6 * D).to(dtype).to(dev)[::2]
        return A._transform_bias_rescale_qkv(qkv, bias, heads)
    got, exp = _pair(f)
    for g, e in zip(got, exp):
        assert g.device.type == DEV and g.dtype == e.dtype and g.shape == e.shape
        assert torch.equal(g.cpu(), e)
    qkv, bias = torch.randn(2, 3, 3 * D).to(dtype), torch.randn(1, 3 * D).to(dtype)
    outs = [torch.empty(0, device=DEV, dtype=dtype) for _ in range(3)]
    A._transform_bias_rescale_qkv.out(tpu(qkv), tpu(bias), heads, out0=outs[0], out1=outs[1], out2=outs[2])
    for g, e in zip(outs, A._transform_bias_rescale_qkv(qkv, bias, heads)):
        assert torch.equal(g.cpu(), e)


def test_transform_bias_rescale_qkv_edges_and_errors():
    close(*_pair(lambda dev: A._transform_bias_rescale_qkv(torch.randn(2, 0, 12, device=dev),
                                                           torch.randn(12, device=dev), 2)[2]))
    x, b = torch.randn(2, 5, 12), torch.randn(12)
    for args, exc, msg in [((x, b, 5), RuntimeError, "Expected D % num_head == 0"),
                           ((torch.randn(2, 5, 13), torch.randn(13), 1), RuntimeError, "Expected _3D % 3 == 0"),
                           ((torch.randn(5, 12), b, 2), IndexError, "Dimension out of range")]:
        for dev in ["cpu", DEV]:
            with pytest.raises(exc, match=msg.replace("%", "%")):
                A._transform_bias_rescale_qkv(*(a.to(dev) if isinstance(a, torch.Tensor) else a for a in args))
    # inputs CPU reads out of bounds (or divides by zero with): refused with a message
    for bias, heads, msg in [(torch.randn(11), 2, "expected qkv_bias of 12 elements"),
                             (torch.randn(12).double(), 2, "expected qkv_bias of 12 elements of dtype Float"),
                             (b, 0, "num_heads must be positive")]:
        with pytest.raises(RuntimeError, match=msg):
            A._transform_bias_rescale_qkv(tpu(x), tpu(bias), heads)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("use_gelu", [False, True])
def test_addmm_activation(dtype, use_gelu):
    """addmm then relu / exact gelu, with beta and alpha, non-contiguous operands, a
    broadcast bias, an out= tensor with the wrong shape and strides; bf16/f16 round the
    addmm result before the activation, as CPU does."""
    def f(dev):
        c, x, y = torch.randn(33).to(dtype), torch.randn(20, 17).to(dtype), torch.randn(33, 20).to(dtype)
        return A._addmm_activation(c.to(dev), x.to(dev).t(), y.to(dev).t(), beta=0.5, alpha=2.0, use_gelu=use_gelu)
    got, exp = _pair(f)
    close(got, exp)
    assert (exp == 0).any() or use_gelu
    c, x, y = torch.randn(3).to(dtype), torch.randn(2, 4).to(dtype), torch.randn(4, 3).to(dtype)
    out = torch.empty(3, 2, device=DEV, dtype=dtype).t()
    with native("_addmm_activation"):
        r = A._addmm_activation(*tpu(c, x, y), use_gelu=use_gelu, out=out)
    assert r is out
    close(out, A._addmm_activation(c, x, y, use_gelu=use_gelu))


def test_addmm_activation_edges_and_errors():
    for shapes in [((3,), (0, 4), (4, 3)), ((3,), (2, 0), (0, 3))]:
        for g in [False, True]:
            close(*_pair(lambda dev: A._addmm_activation(*(torch.randn(s).to(dev) for s in shapes),
                                                         beta=0.5, use_gelu=g)))
    ints = [torch.randint(-3, 3, s) for s in [(3,), (2, 4), (4, 3)]]
    with native("_addmm_activation"):
        got = A._addmm_activation(*tpu(*ints))
    assert torch.equal(got.cpu(), A._addmm_activation(*ints))
    c, x, y = torch.randn(3), torch.randn(2, 4), torch.randn(4, 3)
    for args, kw, exc, msg in [((c, x, torch.randn(5, 3)), {}, RuntimeError, "mat1 and mat2 shapes cannot be multiplied"),
                               ((c, x.double(), y), {}, RuntimeError, "mat1 and mat2 must have the same dtype"),
                               ((c, x, y), {"out": torch.empty(2, 3, dtype=torch.double)}, RuntimeError,
                                "Expected out tensor to have dtype float, but got double instead"),
                               ((c.bool(), x.bool(), y.bool()), {}, NotImplementedError, "addmm_impl_cpu_"),
                               ((*ints,), {"use_gelu": True}, NotImplementedError, "GeluKernelImpl")]:
        with pytest.raises(exc, match=msg):
            A._addmm_activation(*args, **kw)
        with pytest.raises(exc, match=msg):
            A._addmm_activation(*tpu(*args), **{k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in kw.items()})


def test_addmm_activation_fuses_in_defer_and_fuse():
    """The activation is its own elementwise node after the product, so defer_and_fuse can
    join it with the elementwise ops that follow (here: + 1, * 2)."""
    c, x, y = torch.randn(8), torch.randn(4, 16), torch.randn(16, 8)
    ct, xt, yt = tpu(c, x, y)
    with torchtpu.set_eager_mode("defer_and_fuse"):
        torch.tpu.synchronize()
        torchtpu.explain(clear=True)
        with native("_addmm_activation"):
            got = (A._addmm_activation(ct, xt, yt, use_gelu=True) + 1) * 2
            torch.tpu.synchronize()
        cuts = torchtpu.explain()
    close(got, (A._addmm_activation(c, x, y, use_gelu=True) + 1) * 2)
    assert sum(cut["ops"] for cut in cuts) == 4, str(cuts)  # addmm, gelu_, add, mul
    assert sum(cut["fused_ops"] for cut in cuts) == 3, str(cuts)
