"""gated family on tpu: glu, prelu and the fused LSTM / GRU cells, forward and backward,
functional and out= forms.

glu and prelu are compared with PyTorch's CPU kernels. The fused cells have no CPU kernel
in PyTorch (CPU LSTM/GRU take a composite path; every other device calls the fused
cells), so they are compared with the CUDA kernels' math written in plain torch ops
(float64), workspace layout included, and, as models see them, torch.nn.LSTM / GRU /
LSTMCell / GRUCell on tpu against the same modules on CPU. The native kernels must not
go through the CPU fallback (torchtpu.fallback_report())."""
import functools
import itertools

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from op_helpers import close, grads, native, no_cpu_fallback, tpu

A = torch.ops.aten
DEV = "tpu"
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
CELL_OPS = ("_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell",
            "_thnn_fused_gru_cell_backward")


def test_native_guard_can_fail():
    """The fallback guard itself: an op forced through the CPU fallback is caught."""
    with pytest.raises(AssertionError, match="glu"):
        with native("glu"):
            with pytest.raises(NotImplementedError):  # integer input: libtpurt defers to the CPU
                A.glu(torch.ones(2, 4, dtype=torch.long).to(DEV), 1)


def rand(*shape, dtype=torch.float32, seed=None, scale=1.0):
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


# ---- glu --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,dim", [((4, 6), -1), ((4, 6), 0), ((2, 8, 3), 1), ((6,), 0), ((2, 3, 4, 2), 3)])
def test_glu(dtype, shape, dim):
    x = rand(*shape, dtype=dtype, seed=1, scale=2)
    with native("glu"):
        got = F.glu(tpu(x), dim)
    close(got, F.glu(x, dim))


def test_glu_noncontiguous_and_out():
    x = rand(6, 8, seed=2).t()  # (8, 6), non-contiguous
    exp = A.glu(x, 0)
    with native("glu"):
        close(A.glu(tpu(x), 0), exp)
    for dt in (torch.float32, torch.float64, torch.float16):
        out = torch.empty(0, device=DEV, dtype=dt)
        with native("glu"):
            r = A.glu.out(tpu(x), 0, out=out)
        assert r is out
        close(out, A.glu.out(x, 0, out=torch.empty(0, dtype=dt)))
    # a bf16 result into a float32 out= tensor is rounded to bf16 first, as on CPU
    xb = x.to(torch.bfloat16)
    out = torch.empty(0, device=DEV)
    A.glu.out(tpu(xb), 1, out=out)
    close(out, A.glu.out(xb, 1, out=torch.empty(0)), dtype=torch.float32)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [1, -1, 0])
def test_glu_backward(dtype, dim):
    x = rand(4, 6, 2, dtype=dtype, seed=3, scale=2).requires_grad_()
    oc, (gc,) = grads(lambda x: F.glu(x, dim), (x,))
    with native("glu", "glu_backward"):
        ot, (gt,) = grads(lambda x: F.glu(x, dim), (tpu(x),))
    close(ot, oc.detach())
    close(gt, gc, scale=2)


def test_glu_backward_direct_broadcast_and_out():
    x, g = rand(4, 6, seed=4), rand(3, seed=5)  # grad broadcasts to the halved shape
    exp = A.glu_backward(g, x, 1)
    with native("glu_backward"):
        close(A.glu_backward(*tpu(g, x), 1), exp)
    out = torch.empty(0, device=DEV)
    with native("glu_backward"):
        r = A.glu_backward.grad_input(*tpu(g, x), 1, grad_input=out)
    assert r is out
    close(out, exp)
    xs = rand(6, 4, seed=6).t()  # strided self and grad
    gs = rand(3, 4, seed=7).t()
    close(A.glu_backward(*tpu(gs, xs), 1), A.glu_backward(gs, xs, 1))


@pytest.mark.parametrize("dtype", FLOATS)
def test_glu_jvp(dtype):
    """CPU's glu_jvp lacks f16/bf16 (CUDA's has them): those compare with float32 math."""
    x, dx = rand(3, 8, dtype=dtype, seed=8), rand(3, 8, dtype=dtype, seed=9)
    y = F.glu(x, 1)
    wide = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    exp = A.glu_jvp(y.to(wide), x.to(wide), dx.to(wide), 1).to(dtype)
    with native("glu_jvp"):
        close(A.glu_jvp(*tpu(y, x, dx), 1), exp, scale=2)
    out = torch.empty(0, device=DEV, dtype=dtype)
    A.glu_jvp.out(*tpu(y, x, dx), 1, out=out)
    close(out, exp, scale=2)


def test_glu_forward_ad():
    import torch.autograd.forward_ad as fwAD
    x, dx = rand(2, 6, seed=10), rand(2, 6, seed=11)

    def jvp(x, dx):
        with fwAD.dual_level():
            y = F.glu(fwAD.make_dual(x, dx), 1)
            return fwAD.unpack_dual(y).tangent

    exp = jvp(x, dx)
    with native("glu", "glu_jvp"):
        close(jvp(*tpu(x, dx)), exp)


def test_glu_errors():
    cases = [
        (lambda d: A.glu(torch.tensor(1.0).to(d), 0), RuntimeError),  # 0-dim
        (lambda d: A.glu(torch.ones(3, 5).to(d), 1), RuntimeError),  # odd size
        (lambda d: A.glu(torch.ones(4, 6).to(d), 2), IndexError),
        (lambda d: A.glu(torch.ones(4, 6, dtype=torch.long).to(d), 1), NotImplementedError),
        (lambda d: A.glu_backward(torch.ones(4, 3, dtype=torch.float64).to(d), torch.ones(4, 6).to(d), 1), RuntimeError),
        (lambda d: A.glu_backward(torch.ones(4, 4).to(d), torch.ones(4, 6).to(d), 1), RuntimeError),
        (lambda d: A.glu.out(torch.ones(4, 6).to(d), 1, out=torch.empty(0, dtype=torch.long, device=d)), RuntimeError),
    ]
    for fn, exc in cases:
        with pytest.raises(exc) as ec:
            fn("cpu")
        with pytest.raises(exc) as et:
            fn(DEV)
            torch.tpu.synchronize()
        assert type(et.value) is type(ec.value)
    with pytest.raises(RuntimeError, match="Halving dimension must be even, but dimension 1 is size 5"):
        A.glu(torch.ones(3, 5).to(DEV), 1)
    with pytest.raises(RuntimeError, match="Found dtype Double but expected Float"):
        A.glu_backward(tpu(torch.ones(4, 3, dtype=torch.float64)), tpu(torch.ones(4, 6)), 1)


# ---- prelu ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,channels", [((2, 3, 4, 4), 3), ((2, 3, 4, 4), 1), ((5, 7), 7), ((6,), 1),
                                            ((2, 4, 5), 4), ((3, 2, 2, 2, 2), 2)])
def test_prelu_module(dtype, shape, channels):
    x = rand(*shape, dtype=dtype, seed=12).requires_grad_()
    w = (torch.rand(channels) * 0.5 + 0.1).to(dtype).requires_grad_()
    oc, gc = grads(F.prelu, (x, w))
    with native("_prelu_kernel", "_prelu_kernel_backward"):
        ot, gt = grads(F.prelu, tpu(x, w))
    close(ot, oc.detach())
    close(gt[0], gc[0])
    # grad_weight is a sum over every other dimension: its error grows with the count
    close(gt[1], gc[1], scale=4 if dtype in (torch.float32, torch.float64) else 8)


def test_prelu_kernel_direct_broadcast():
    x = rand(4, 6, seed=13)
    for w in (rand(1, seed=14), rand(6, seed=15), rand(4, 1, seed=16), rand(2, 4, 6, seed=17)):
        with native("_prelu_kernel"):
            close(A._prelu_kernel(*tpu(x, w)), A._prelu_kernel(x, w))
    xs = rand(6, 4, seed=18).t()
    close(A._prelu_kernel(tpu(xs), tpu(torch.tensor([0.25]))), A._prelu_kernel(xs, torch.tensor([0.25])))


def test_prelu_kernel_backward_direct():
    x, w = rand(4, 6, seed=19), rand(4, 1, seed=20)
    for g in (rand(4, 6, seed=21), rand(6, seed=22), rand(2, 4, 6, seed=23)):
        exp = A._prelu_kernel_backward(g, x, w)
        with native("_prelu_kernel_backward"):
            got = A._prelu_kernel_backward(*tpu(g, x, w))
        for a, e in zip(got, exp):
            close(a, e)


def test_prelu_zero_and_nan():
    x = torch.tensor([-1.0, 0.0, -0.0, 2.0, float("nan"), float("-inf")])
    w = torch.tensor([0.5])
    close(A._prelu_kernel(*tpu(x, w)), A._prelu_kernel(x, w))
    g = torch.ones(6)
    for a, e in zip(A._prelu_kernel_backward(*tpu(g, x, w)), A._prelu_kernel_backward(g, x, w)):
        close(a, e)


def test_prelu_errors():
    x = torch.randn(4, 6)
    cases = [
        (lambda d: A._prelu_kernel(x.to(d), torch.ones(5).to(d)), RuntimeError),
        (lambda d: A._prelu_kernel(x.to(d), torch.ones(6, dtype=torch.float64).to(d)), RuntimeError),
        (lambda d: A._prelu_kernel(x.long().to(d), torch.ones(6, dtype=torch.long).to(d)), NotImplementedError),
        (lambda d: A._prelu_kernel_backward(x.double().to(d), x.to(d), torch.ones(6).to(d)), RuntimeError),
        (lambda d: F.prelu(x.to(d), torch.ones(5).to(d)), RuntimeError),
    ]
    for fn, exc in cases:
        with pytest.raises(exc) as ec:
            fn("cpu")
        with pytest.raises(exc) as et:
            fn(DEV)
            torch.tpu.synchronize()
        assert type(et.value) is type(ec.value)


# ---- fused cells: reference math (PyTorch's CUDA kernels, in float64) ---------------------


def lstm_ref(ig, hg, cx, bi, bh):
    ig, hg, cx = ig.double(), hg.double(), cx.double()
    gates = ig + hg
    if bi is not None:
        gates = gates + bi.double() + bh.double()
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def lstm_bwd_ref(ghy, gcy, cx, cy, ws, has_bias):
    cx, cy, ws = cx.double(), cy.double(), ws.double()
    i, f, g, o = ws.chunk(4, 1)
    go = ghy.double() if ghy is not None else torch.zeros_like(cx)
    goc = gcy.double() if gcy is not None else torch.zeros_like(cx)
    t = cy.tanh()
    gc = go * o * (1 - t * t) + goc
    gates = torch.cat([gc * g * (1 - i) * i, gc * cx * (1 - f) * f, gc * i * (1 - g * g), go * t * (1 - o) * o], 1)
    return gates, gc * f, gates.sum(0) if has_bias else None


def gru_ref(ig, hg, hx, bi, bh):
    ig, hg, hx = ig.double(), hg.double(), hx.double()
    if bi is not None:
        ig, hg = ig + bi.double(), hg + bh.double()
    ir, ii, in_ = ig.chunk(3, 1)
    hr, hi, hn = hg.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def gru_bwd_ref(ghy, ws, has_bias):
    r, z, n, hx, hn = ws.double().chunk(5, 1)
    go = ghy.double()
    gin = go * (1 - z) * (1 - n * n)
    grg = gin * hn * (1 - r) * r
    gz = go * (hx - n) * (1 - z) * z
    gi, gh = torch.cat([grg, gz, gin], 1), torch.cat([grg, gz, gin * r], 1)
    return gi, gh, go * z, gi.sum(0) if has_bias else None, gh.sum(0) if has_bias else None


def cast(ts, dtype):
    return tuple(None if t is None else t.to(dtype) for t in ts)


def cell_inputs(B, H, factor, dtype, bias, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)
    return r(B, factor * H), r(B, factor * H), r(B, H), r(factor * H) if bias else None, r(factor * H) if bias else None


def gru_bias_unsupported(e):
    """The GRU backward's fifth result needs TPU_NODE_MAX_OUT >= 5 (core/internal.h)."""
    return "TPU_NODE_MAX_OUT" in str(e)


@functools.lru_cache(None)
def gru_five_outputs():
    """Whether the runtime's nodes hold the GRU backward's five results. Without room for
    the fifth, a bias-free cell still works (its fifth result, never read by autograd,
    comes back as an empty tensor instead of None) and one with biases raises."""
    try:
        A._thnn_fused_gru_cell_backward(torch.ones(1, 1, device=DEV), torch.ones(1, 5, device=DEV), True)
        return True
    except RuntimeError as e:
        if gru_bias_unsupported(e):
            return False
        raise


# ---- fused LSTM cell ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell_forward(dtype, bias):
    ins = cell_inputs(3, 5, 4, dtype, bias, seed=30)
    with native("_thnn_fused_lstm_cell"):
        got = A._thnn_fused_lstm_cell(*tpu(*ins))
    exp = cast(lstm_ref(*ins), dtype)
    assert [t.shape for t in got] == [(3, 5), (3, 5), (3, 20)]
    for g, e in zip(got, exp):
        close(g, e, scale=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("which", ["both", "hy", "cy"])
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell_backward_impl(dtype, which, bias):
    ig, hg, cx, bi, bh = cell_inputs(4, 3, 4, dtype, bias, seed=31)
    hy, cy, ws = A._thnn_fused_lstm_cell(*tpu(ig, hg, cx, bi, bh))
    ghy = rand(4, 3, dtype=dtype, seed=32) if which in ("both", "hy") else None
    gcy = rand(4, 3, dtype=dtype, seed=33) if which in ("both", "cy") else None
    with native("_thnn_fused_lstm_cell_backward_impl"):
        got = A._thnn_fused_lstm_cell_backward_impl(tpu(ghy), tpu(gcy), tpu(cx), cy, ws, bias)
    exp = cast(lstm_bwd_ref(ghy, gcy, cx, cy.cpu(), ws.cpu(), bias), dtype)
    for g, e in zip(got, exp):
        close(g, e, scale=4)


def test_lstm_cell_backward_matches_autograd_of_the_math():
    """The CUDA backward formula is the derivative of the forward: checked with autograd
    on the float64 reference (input gates, hidden gates, cx and both biases)."""
    ig, hg, cx, bi, bh = (t.requires_grad_() for t in cell_inputs(3, 4, 4, torch.float64, True, seed=34))
    ghy, gcy = rand(3, 4, dtype=torch.float64, seed=35), rand(3, 4, dtype=torch.float64, seed=36)
    hy, cy, _ = lstm_ref(ig, hg, cx, bi, bh)
    exp = torch.autograd.grad((hy, cy), (ig, hg, cx, bi, bh), (ghy, gcy))
    hy_t, cy_t, ws_t = A._thnn_fused_lstm_cell(*tpu(ig, hg, cx, bi, bh))
    gg, gcx, gb = A._thnn_fused_lstm_cell_backward_impl(*tpu(ghy, gcy, cx), cy_t, ws_t, True)
    close(gg, exp[0])
    close(gg, exp[1])
    close(gcx, exp[2])
    close(gb, exp[3])
    close(gb, exp[4])


def test_lstm_cell_backward_without_grads():
    ig, hg, cx, _, _ = cell_inputs(2, 3, 4, torch.float32, False, seed=37)
    hy, cy, ws = A._thnn_fused_lstm_cell(*tpu(ig, hg, cx))
    got = A._thnn_fused_lstm_cell_backward_impl(None, None, tpu(cx), cy, ws, True)
    assert all(t is None for t in got)


def test_lstm_cell_noncontiguous_mixed_and_out():
    B, H = 3, 4
    ig = rand(4 * H, B, seed=38).t()  # strided gates
    hg = rand(B, 8 * H, seed=39)[:, ::2]
    cx = rand(H, B, seed=40).t()
    bi, bh = rand(8 * H, seed=41)[::2], rand(4 * H, seed=42)
    exp = lstm_ref(ig, hg, cx, bi, bh)
    with native("_thnn_fused_lstm_cell"):
        got = A._thnn_fused_lstm_cell(*tpu(ig, hg, cx, bi, bh))
    for g, e in zip(got, cast(exp, torch.float32)):
        close(g, e)
    # out= (one of them float64): each output receives its values
    outs = [torch.empty(0, device=DEV), torch.empty(0, device=DEV, dtype=torch.float64), torch.empty(0, device=DEV)]
    with native("_thnn_fused_lstm_cell"):
        r = A._thnn_fused_lstm_cell.out(*tpu(ig, hg, cx, bi, bh), out0=outs[0], out1=outs[1], out2=outs[2])
    assert all(a is b for a, b in zip(r, outs))
    for g, e in zip(outs, exp):
        close(g, e.to(g.dtype), dtype=torch.float32)
    # mixed dtypes, as autocast produces them: bf16 gates, float32 state and biases
    igb, hgb = ig.bfloat16(), hg.bfloat16()
    hy, cy, ws = A._thnn_fused_lstm_cell(*tpu(igb, hgb, cx, bi, bh))
    assert (hy.dtype, cy.dtype, ws.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    e = lstm_ref(igb, hgb, cx, bi, bh)
    close(hy, e[0].float(), scale=10)
    close(cy, e[1].float(), scale=10)
    close(ws, e[2].bfloat16())
    # backward out=
    ghy = rand(B, H, seed=43)
    exp_b = lstm_bwd_ref(ghy, None, cx, got[1].cpu(), got[2].cpu(), True)
    outs = [torch.empty(0, device=DEV) for _ in range(3)]
    with native("_thnn_fused_lstm_cell_backward_impl"):
        A._thnn_fused_lstm_cell_backward_impl.out(tpu(ghy), None, tpu(cx), got[1], got[2], True,
                                                  out0=outs[0], out1=outs[1], out2=outs[2])
    for g, e in zip(outs, cast(exp_b, torch.float32)):
        close(g, e)


def test_lstm_cell_out_aliases_state():
    """cy written into cx's own storage (out1 = cx): every element reads before it writes."""
    ig, hg, cx, bi, bh = cell_inputs(2, 5, 4, torch.float32, True, seed=44)
    exp = cast(lstm_ref(ig, hg, cx, bi, bh), torch.float32)
    igt, hgt, cxt, bit, bht = tpu(ig, hg, cx, bi, bh)
    hy, ws = torch.empty(0, device=DEV), torch.empty(0, device=DEV)
    A._thnn_fused_lstm_cell.out(igt, hgt, cxt, bit, bht, out0=hy, out1=cxt, out2=ws)
    close(hy, exp[0])
    close(cxt, exp[1])
    close(ws, exp[2])


def test_lstm_cell_large_batch_runs_in_parallel():
    """Enough rows for the pool (B * 4H >= 32768): same result as the reference."""
    ins = cell_inputs(64, 160, 4, torch.float32, True, seed=45)
    hy, cy, ws = A._thnn_fused_lstm_cell(*tpu(*ins))
    exp = cast(lstm_ref(*ins), torch.float32)
    for g, e in zip((hy, cy, ws), exp):
        close(g, e)
    ghy, gcy = rand(64, 160, seed=46), rand(64, 160, seed=47)
    got = A._thnn_fused_lstm_cell_backward_impl(*tpu(ghy, gcy, ins[2]), cy, ws, True)
    for g, e in zip(got, cast(lstm_bwd_ref(ghy, gcy, ins[2], cy.cpu(), ws.cpu(), True), torch.float32)):
        close(g, e, scale=4)


def test_lstm_cell_errors():
    ig, hg, cx = torch.randn(2, 8), torch.randn(2, 8), torch.randn(2, 2)
    b = torch.randn(8)
    with pytest.raises(RuntimeError, match="Expected 2-dimensional tensor"):
        A._thnn_fused_lstm_cell(tpu(torch.randn(8)), tpu(torch.randn(8)), tpu(cx))
    with pytest.raises(RuntimeError, match="hidden_gates"):
        A._thnn_fused_lstm_cell(tpu(ig), tpu(torch.randn(2, 4)), tpu(cx))
    with pytest.raises(RuntimeError, match="prev_hidden"):
        A._thnn_fused_lstm_cell(tpu(ig), tpu(hg), tpu(torch.randn(2, 3)))
    with pytest.raises(RuntimeError, match="input_bias"):
        A._thnn_fused_lstm_cell(tpu(ig), tpu(hg), tpu(cx), tpu(torch.randn(6)), tpu(torch.randn(6)))
    with pytest.raises(RuntimeError, match="both"):
        A._thnn_fused_lstm_cell(tpu(ig), tpu(hg), tpu(cx), tpu(b), None)
    with pytest.raises(RuntimeError, match="multiple of 4"):
        A._thnn_fused_lstm_cell(tpu(torch.randn(2, 6)), tpu(torch.randn(2, 6)), tpu(torch.randn(3)))
    with pytest.raises(RuntimeError, match="workspace"):
        A._thnn_fused_lstm_cell_backward_impl(tpu(cx), None, tpu(cx), tpu(cx), tpu(torch.randn(2, 6)), False)
    with pytest.raises(RuntimeError, match="cy"):
        A._thnn_fused_lstm_cell_backward_impl(tpu(cx), None, tpu(cx), tpu(torch.randn(2, 3)), tpu(ig), False)
    with pytest.raises(NotImplementedError):
        A._thnn_fused_lstm_cell(tpu(ig.long()), tpu(hg.long()), tpu(cx.long()))


# ---- fused GRU cell -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bias", [True, False])
def test_gru_cell_forward(dtype, bias):
    ins = cell_inputs(3, 5, 3, dtype, bias, seed=50)
    with native("_thnn_fused_gru_cell"):
        hy, ws = A._thnn_fused_gru_cell(*tpu(*ins))
    e_hy, e_ws = cast(gru_ref(*ins), dtype)
    assert ws.shape == (3, 25)
    close(hy, e_hy, scale=2)
    close(ws, e_ws, scale=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_gru_cell_backward(dtype, bias):
    ins = cell_inputs(4, 3, 3, dtype, bias, seed=51)
    hy, ws = A._thnn_fused_gru_cell(*tpu(*ins))
    ghy = rand(4, 3, dtype=dtype, seed=52)
    try:
        with native("_thnn_fused_gru_cell_backward"):
            got = A._thnn_fused_gru_cell_backward(tpu(ghy), ws, bias)
    except RuntimeError as e:
        if bias and gru_bias_unsupported(e):
            pytest.xfail(str(e))
        raise
    exp = cast(gru_bwd_ref(ghy, ws.cpu(), bias), dtype)
    if not bias and not gru_five_outputs():
        assert got[4].numel() == 0
        got = got[:4] + (None,)
    for g, e in zip(got, exp):
        close(g, e, scale=4)


def test_gru_cell_backward_matches_autograd_of_the_math():
    ig, hg, hx, bi, bh = (t.requires_grad_() for t in cell_inputs(3, 4, 3, torch.float64, True, seed=53))
    ghy = rand(3, 4, dtype=torch.float64, seed=54)
    hy, _ = gru_ref(ig, hg, hx, bi, bh)
    exp = torch.autograd.grad(hy, (ig, hg, hx, bi, bh), ghy)
    _, ws = A._thnn_fused_gru_cell(*tpu(ig, hg, hx, bi, bh))
    try:
        got = A._thnn_fused_gru_cell_backward(tpu(ghy), ws, True)
    except RuntimeError as e:
        if gru_bias_unsupported(e):
            pytest.xfail(str(e))
        raise
    for g, e in zip(got, exp):
        close(g, e)


def test_gru_cell_noncontiguous_mixed_and_out():
    B, H = 3, 4
    ig, hg = rand(3 * H, B, seed=55).t(), rand(B, 6 * H, seed=56)[:, 1::2]
    hx = rand(H, B, seed=57).t()
    bi, bh = rand(3 * H, seed=58), rand(6 * H, seed=59)[::2]
    e_hy, e_ws = gru_ref(ig, hg, hx, bi, bh)
    with native("_thnn_fused_gru_cell"):
        hy, ws = A._thnn_fused_gru_cell(*tpu(ig, hg, hx, bi, bh))
    close(hy, e_hy.float())
    close(ws, e_ws.float())
    outs = [torch.empty(0, device=DEV, dtype=torch.float64), torch.empty(0, device=DEV)]
    with native("_thnn_fused_gru_cell"):
        r = A._thnn_fused_gru_cell.out(*tpu(ig, hg, hx, bi, bh), out0=outs[0], out1=outs[1])
    assert r[0] is outs[0] and r[1] is outs[1]
    close(outs[0], e_hy, dtype=torch.float32)
    close(outs[1], e_ws.float())
    # mixed dtypes (autocast): bf16 gates, float32 state and biases
    hy_m, ws_m = A._thnn_fused_gru_cell(*tpu(ig.bfloat16(), hg.bfloat16(), hx, bi, bh))
    assert (hy_m.dtype, ws_m.dtype) == (torch.float32, torch.float32)
    close(hy_m, gru_ref(ig.bfloat16(), hg.bfloat16(), hx, bi, bh)[0].float(), scale=10)
    # backward out= (no bias: four of the five results)
    ghy = rand(B, H, seed=60)
    exp = gru_bwd_ref(ghy, ws.cpu(), False)
    outs = [torch.empty(0, device=DEV) for _ in range(5)]
    with native("_thnn_fused_gru_cell_backward"):
        A._thnn_fused_gru_cell_backward.out(tpu(ghy), ws, False, out0=outs[0], out1=outs[1], out2=outs[2],
                                            out3=outs[3], out4=outs[4])
    for g, e in zip(outs[:3], exp[:3]):
        close(g, e.float())


def test_gru_cell_large_batch_runs_in_parallel():
    ins = cell_inputs(64, 200, 3, torch.float32, False, seed=61)
    hy, ws = A._thnn_fused_gru_cell(*tpu(*ins))
    e_hy, e_ws = cast(gru_ref(*ins), torch.float32)
    close(hy, e_hy)
    close(ws, e_ws)
    ghy = rand(64, 200, seed=62)
    got = A._thnn_fused_gru_cell_backward(tpu(ghy), ws, False)
    for g, e in zip(got[:3], cast(gru_bwd_ref(ghy, ws.cpu(), False), torch.float32)[:3]):
        close(g, e, scale=4)


def test_gru_cell_errors():
    ig, hg, hx = torch.randn(2, 9), torch.randn(2, 9), torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="prev_hidden"):
        A._thnn_fused_gru_cell(tpu(ig), tpu(hg), tpu(torch.randn(2, 4)))
    with pytest.raises(RuntimeError, match="input_bias"):
        A._thnn_fused_gru_cell(tpu(ig), tpu(hg), tpu(hx), tpu(torch.randn(8)), tpu(torch.randn(8)))
    with pytest.raises(RuntimeError, match="Expected 2-dimensional tensor"):
        A._thnn_fused_gru_cell_backward(tpu(torch.randn(6)), tpu(torch.randn(2, 15)), False)
    with pytest.raises(RuntimeError, match="workspace"):
        A._thnn_fused_gru_cell_backward(tpu(hx), tpu(torch.randn(2, 9)), False)


# ---- torch.nn recurrent modules, as models use them -------------------------------------------


def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in flat(o)]


def module_check(cls, kwargs, x, hx=None, dtype=torch.float32, scale=10.0):
    """Runs the module on CPU and on tpu (same weights): outputs, and the gradients of
    the input, the initial state and every parameter."""
    torch.manual_seed(0)
    m = cls(**kwargs).to(dtype)
    mt = cls(**kwargs).to(dtype).to(DEV)
    mt.load_state_dict(m.state_dict())
    x = x.to(dtype).requires_grad_()
    xt = tpu(x)
    args, args_t = (x,), (xt,)
    if hx is not None:
        hx = tuple(h.to(dtype).requires_grad_() for h in hx) if isinstance(hx, tuple) else hx.to(dtype).requires_grad_()
        hx_t = tuple(tpu(h) for h in hx) if isinstance(hx, tuple) else tpu(hx)
        args, args_t = (x, hx), (xt, hx_t)
    oc, ot = flat(m(*args)), flat(mt(*args_t))
    for a, e in zip(ot, oc):
        close(a, e.detach(), scale=scale)
    gs = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)).to(dtype) for i, o in enumerate(oc)]
    leaves = [x] + (list(hx) if isinstance(hx, tuple) else [hx] if hx is not None else []) + list(m.parameters())
    leaves_t = [xt] + (list(hx_t) if isinstance(hx, tuple) else [hx_t] if hx is not None else []) + list(mt.parameters())
    gc = torch.autograd.grad(oc, leaves, gs)
    gt = torch.autograd.grad(ot, leaves_t, [g.to(DEV) for g in gs])
    for a, e in zip(gt, gc):
        close(a, e, scale=scale)


RNN_CONFIGS = [dict(num_layers=nl, bidirectional=bd, batch_first=bf, bias=b)
               for nl, bd, bf, b in itertools.product((1, 2), (False, True), (False, True), (True, False))]


def _id(c):
    return "-".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in c.items())


@pytest.mark.parametrize("config", RNN_CONFIGS, ids=_id)
def test_nn_lstm(config):
    x = rand(3, 5, 4, seed=70) if config["batch_first"] else rand(5, 3, 4, seed=70)
    with no_cpu_fallback():
        module_check(torch.nn.LSTM, dict(input_size=4, hidden_size=6, **config), x)


@pytest.mark.parametrize("config", RNN_CONFIGS, ids=_id)
def test_nn_gru(config):
    x = rand(3, 5, 4, seed=71) if config["batch_first"] else rand(5, 3, 4, seed=71)
    try:
        with no_cpu_fallback():
            module_check(torch.nn.GRU, dict(input_size=4, hidden_size=6, **config), x)
    except RuntimeError as e:
        if config["bias"] and gru_bias_unsupported(e):
            pytest.xfail(str(e))
        raise


def test_nn_lstm_proj_initial_state_unbatched():
    D, L, H, P = 2, 2, 6, 3
    with no_cpu_fallback():
        module_check(torch.nn.LSTM, dict(input_size=4, hidden_size=H, num_layers=L, proj_size=P, bidirectional=True),
                     rand(5, 2, 4, seed=72), hx=(rand(D * L, 2, P, seed=73), rand(D * L, 2, H, seed=74)))
        module_check(torch.nn.LSTM, dict(input_size=4, hidden_size=H), rand(5, 4, seed=75),
                     hx=(rand(1, H, seed=76), rand(1, H, seed=77)))


def test_nn_gru_initial_state():
    with native(*CELL_OPS):
        module_check(torch.nn.GRU, dict(input_size=4, hidden_size=6, num_layers=2, bias=False),
                     rand(5, 2, 4, seed=78), hx=rand(2, 2, 6, seed=79))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_nn_cells(dtype):
    scale = 10 if dtype != torch.bfloat16 else 2
    with no_cpu_fallback():
        module_check(torch.nn.LSTMCell, dict(input_size=4, hidden_size=5), rand(3, 4, seed=80),
                     hx=(rand(3, 5, seed=81), rand(3, 5, seed=82)), dtype=dtype, scale=scale)
        module_check(torch.nn.LSTMCell, dict(input_size=4, hidden_size=5, bias=False), rand(4, seed=83),
                     dtype=dtype, scale=scale)
        module_check(torch.nn.GRUCell, dict(input_size=4, hidden_size=5, bias=False), rand(3, 4, seed=84),
                     hx=rand(3, 5, seed=85), dtype=dtype, scale=scale)
    try:
        with no_cpu_fallback():
            module_check(torch.nn.GRUCell, dict(input_size=4, hidden_size=5), rand(3, 4, seed=86), dtype=dtype,
                         scale=scale)
    except RuntimeError as e:
        if gru_bias_unsupported(e):
            pytest.xfail(str(e))
        raise


def test_nn_lstm_packed_sequence():
    torch.manual_seed(0)
    m = torch.nn.LSTM(4, 6, num_layers=2, bidirectional=True)
    mt = torch.nn.LSTM(4, 6, num_layers=2, bidirectional=True).to(DEV)
    mt.load_state_dict(m.state_dict())
    x = rand(5, 3, 4, seed=87)
    lengths = torch.tensor([5, 3, 2])
    pk = torch.nn.utils.rnn.pack_padded_sequence(x, lengths)
    pkt = torch.nn.utils.rnn.pack_padded_sequence(x.to(DEV), lengths)
    with native(*CELL_OPS):
        (yc, (hc, cc)), (yt, (ht, ct)) = m(pk), mt(pkt)
        close(yt.data, yc.data.detach(), scale=10)
        close(ht, hc.detach(), scale=10)
        close(ct, cc.detach(), scale=10)
        g = rand(*yc.data.shape, seed=88)
        gc = torch.autograd.grad(yc.data, list(m.parameters()), g)
        gt = torch.autograd.grad(yt.data, list(mt.parameters()), g.to(DEV))
    for a, e in zip(gt, gc):
        close(a, e, scale=10)


def test_nn_lstm_autocast():
    """Under autocast the gate GEMMs are bf16 while the state stays float32: the cell
    takes the mixed operands and the result tracks the float32 CPU module."""
    torch.manual_seed(0)
    m = torch.nn.LSTM(8, 16, num_layers=2)
    mt = torch.nn.LSTM(8, 16, num_layers=2).to(DEV)
    mt.load_state_dict(m.state_dict())
    x = rand(6, 2, 8, seed=89)
    with native(*CELL_OPS):
        with torch.autocast(DEV, dtype=torch.bfloat16):
            yt, (ht, ct) = mt(x.to(DEV))
        yt.float().sum().backward()
    y, _ = m(x)
    torch.testing.assert_close(yt.float().cpu(), y.detach(), rtol=5e-2, atol=5e-2)
    assert all(p.grad is not None and torch.isfinite(p.grad.cpu()).all() for p in mt.parameters())


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
def test_gated_ops_in_every_mode(mode):
    x = rand(2, 6, 3, seed=90)
    ig, hg, cx, bi, bh = cell_inputs(3, 4, 4, torch.float32, True, seed=91)
    with torchtpu.set_eager_mode(mode):
        glu = F.glu(tpu(x), 1)
        pre = F.prelu(tpu(x), tpu(torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])))
        hy, cy, ws = A._thnn_fused_lstm_cell(*tpu(ig, hg, cx, bi, bh))
        gg, gcx, gb = A._thnn_fused_lstm_cell_backward_impl(hy, None, tpu(cx), cy, ws, True)
        torch.tpu.synchronize()
    close(glu, F.glu(x, 1))
    close(pre, F.prelu(x, torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])))
    e = cast(lstm_ref(ig, hg, cx, bi, bh), torch.float32)
    for g, r in zip((hy, cy, ws), e):
        close(g, r)
    eb = cast(lstm_bwd_ref(e[0], None, cx, e[1], e[2], True), torch.float32)
    for g, r in zip((gg, gcx, gb), eb):
        close(g, r, scale=4)
