"""linalg family on tpu vs PyTorch CPU: matrix products, triangular solves, convolution,
2-d pooling.

Every case runs the same call on CPU tensors and on their tpu copies and compares with the
per-dtype tolerances of tolerances.py; the linalg ops must not go through the CPU
fallback (other families' ops used along the way, e.g. by autograd, may)."""
import math

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from tolerances import assert_close

DEV = "tpu"
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int64, torch.int32, torch.int8, torch.uint8]

LINALG_OPS = (
    "aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::addmv",
    "aten::mv", "aten::dot", "aten::vdot", "aten::convolution_overrideable",
    "aten::convolution_backward_overrideable", "aten::max_pool2d_with_indices",
    "aten::avg_pool2d", "aten::_adaptive_avg_pool2d", "aten::adaptive_max_pool2d",
    "aten::linalg_solve_triangular", "aten::triangular_solve",
)


def _ours(name):
    base = name if name.startswith("aten::") else "aten::" + name
    return any(base == op or base.startswith(op + ".") or base.startswith(op + "_") for op in LINALG_OPS)


@pytest.fixture
def native():
    """Fails the test if one of this family's ops ran through the CPU fallback."""
    torchtpu.reset_fallback_report()
    yield
    torch.tpu.synchronize()
    ours = {k: v for k, v in torchtpu.fallback_report().items() if _ours(k)}
    assert not ours, f"linalg ops ran through the CPU fallback: {ours}"


def make(shape, dtype, gen):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, shape, generator=gen, dtype=dtype)


def tpu(t):
    return t.to(DEV)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


# ---- matrix products -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_products(dtype, gen, native):
    a, b = make((5, 7), dtype, gen), make((7, 3), dtype, gen)
    ba, bb = make((4, 5, 7), dtype, gen), make((4, 7, 3), dtype, gen)
    v, v5 = make((7,), dtype, gen), make((5,), dtype, gen)
    c, bc = make((5, 3), dtype, gen), make((4, 5, 3), dtype, gen)
    beta, alpha = (2, 3) if not dtype.is_floating_point else (0.5, -1.5)
    cases = [
        (torch.mm, (a, b), {}),
        (torch.bmm, (ba, bb), {}),
        (torch.mv, (a, v), {}),
        (torch.dot, (v, v), {}),
        (torch.vdot, (v, v), {}),
        (torch.addmm, (c, a, b), dict(beta=beta, alpha=alpha)),
        (torch.baddbmm, (bc, ba, bb), dict(beta=beta, alpha=alpha)),
        (torch.addbmm, (c, ba, bb), dict(beta=beta, alpha=alpha)),
        (torch.addmv, (v5, a, v), dict(beta=beta, alpha=alpha)),
    ]
    for fn, args, kw in cases:
        want = fn(*args, **kw)
        got = fn(*[tpu(x) for x in args], **kw)
        assert got.device.type == DEV and got.dtype == want.dtype, fn.__name__
        assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_products_noncontiguous_and_broadcast(dtype, gen, native):
    at = make((7, 5), dtype, gen)          # used transposed: strides (1, 5)
    wide = make((7, 6), dtype, gen)        # column slice: row stride 6
    both = make((10, 12), dtype, gen)      # strided in both dims: packed
    a, b, s = at.t(), wide[:, ::2], both[::2, ::2]
    for x, y in [(a, b), (s, b[:6]), (a, b.t().contiguous().t())]:
        assert_close(torch.mm(tpu(x), tpu(y)), torch.mm(x, y), dtype)
    bias_row, bias_scalar = make((3,), dtype, gen), make((), dtype, gen)
    assert_close(torch.addmm(tpu(bias_row), tpu(a), tpu(b)), torch.addmm(bias_row, a, b), dtype)
    assert_close(torch.addmv(tpu(bias_scalar), tpu(a), tpu(wide[:, 0])),
                 torch.addmv(bias_scalar, a, wide[:, 0]), dtype)
    ba = make((3, 7, 5), dtype, gen).transpose(1, 2)
    bb = make((1, 7, 4), dtype, gen).expand(3, 7, 4)
    bias = make((5, 4), dtype, gen)
    assert_close(torch.baddbmm(tpu(bias), tpu(ba), tpu(bb)), torch.baddbmm(bias, ba, bb), dtype)
    assert_close(torch.bmm(tpu(ba), tpu(bb)), torch.bmm(ba, bb), dtype)
    # beta = 0 ignores NaN in the added tensor, as CPU does
    if dtype.is_floating_point:
        nan = torch.full((5, 3), float("nan"), dtype=dtype)
        assert_close(torch.addmm(tpu(nan), tpu(a), tpu(b), beta=0), torch.addmm(nan, a, b, beta=0), dtype)


# Row-major A times transposed B (both K-contiguous, as a convolution's weight gradient):
# f32 products with few rows or fewer than 64 columns run as dot products on AVX-512
# machines; the shapes cover row, column and K tails, K below one vector, and a product
# large enough to split over the pool; (40, 80, 300) takes the packed path for contrast.
# Non-negative operands: sums of thousands of signed terms cancel, and their rounding
# differences (a sum's order is the kernel's) would exceed the f32 table's tolerance.
@pytest.mark.parametrize("m,n,k", [(16, 27, 256), (13, 21, 37), (3, 5, 9), (1, 1, 1), (7, 64, 20),
                                   (96, 40, 3001), (40, 80, 300)])
def test_products_k_contiguous(m, n, k, gen, native):
    a, bt = make((m, k), torch.float32, gen).abs(), make((n, k), torch.float32, gen).abs()
    c = make((m, n), torch.float32, gen)
    assert_close(torch.mm(tpu(a), tpu(bt).t()), torch.mm(a, bt.t()), torch.float32)
    assert_close(torch.addmm(tpu(c), tpu(a), tpu(bt).t(), beta=0.5, alpha=-1.5),
                 torch.addmm(c, a, bt.t(), beta=0.5, alpha=-1.5), torch.float32)
    nan = torch.full((m, n), float("nan"))
    assert_close(torch.addmm(tpu(nan), tpu(a), tpu(bt).t(), beta=0), torch.addmm(nan, a, bt.t(), beta=0),
                 torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_products_inplace_and_out(dtype, gen, native):
    a, b = make((4, 6), dtype, gen), make((6, 3), dtype, gen)
    ba, bb = make((2, 4, 6), dtype, gen), make((2, 6, 3), dtype, gen)
    v = make((6,), dtype, gen)
    for name, self_shape, args in [("addmm_", (4, 3), (a, b)), ("baddbmm_", (2, 4, 3), (ba, bb)),
                                   ("addbmm_", (4, 3), (ba, bb)), ("addmv_", (4,), (a, v))]:
        c = make(self_shape, dtype, gen)
        ct = tpu(c)
        r = getattr(ct, name)(*[tpu(x) for x in args], beta=2, alpha=3)
        getattr(c, name)(*args, beta=2, alpha=3)
        assert r is ct
        assert_close(ct, c, dtype)
    # in-place into a non-contiguous self
    c = make((3, 4), dtype, gen)
    ct = tpu(c)
    ct.t().addmm_(tpu(a), tpu(b))
    c.t().addmm_(a, b)
    assert_close(ct, c, dtype)
    for fn, args in [(torch.mm, (a, b)), (torch.bmm, (ba, bb)), (torch.mv, (a, v)), (torch.dot, (v, v))]:
        want = fn(*args)
        out = torch.empty(0, dtype=dtype, device=DEV)
        r = fn(*[tpu(x) for x in args], out=out)
        assert r is out
        assert_close(out, want, dtype)
    out = torch.empty((4, 3), dtype=dtype, device=DEV)
    torch.addmm(tpu(make((3,), dtype, gen)), tpu(a), tpu(b), out=out)


@pytest.mark.parametrize("m, k, n", [(64, 64, 64), (37, 45, 70), (96, 1024, 33), (5, 40, 48), (64, 2048, 64),
                                     (40, 2100, 70)])
def test_bf16_products_rounded_as_stored(m, k, n, gen, native):
    """bf16 products big enough for the native kernel's tiles, whole and partial blocks,
    K past one pass of the AMX kernel (1024), with the bf16 result rounded as the kernel
    stores it (mm, bmm, linear with a
    transposed weight, baddbmm with beta 0 and alpha 2, a non-contiguous out): against
    PyTorch CPU, and bit for bit against the same product through the f32 path (addmm
    with a zero C keeps the f32 scratch and rounds once afterwards)."""
    bf = torch.bfloat16
    a, b = make((m, k), bf, gen), make((k, n), bf, gen)
    ba, bb = make((3, m, k), bf, gen), make((3, k, n), bf, gen)
    w = make((n, k), bf, gen)
    got = torch.mm(tpu(a), tpu(b))
    assert_close(got, torch.mm(a, b), bf)
    zero = torch.zeros(m, n, dtype=bf, device=DEV)
    assert torch.equal(got, torch.addmm(zero, tpu(a), tpu(b)))
    assert_close(torch.bmm(tpu(ba), tpu(bb)), torch.bmm(ba, bb), bf)
    assert_close(F.linear(tpu(a), tpu(w)), F.linear(a, w), bf)
    c = make((3, m, n), bf, gen)
    assert_close(torch.baddbmm(tpu(c), tpu(ba), tpu(bb), beta=0, alpha=2),
                 torch.baddbmm(c, ba, bb, beta=0, alpha=2), bf)
    out = torch.empty((n, m), dtype=bf, device=DEV).t()
    torch.mm(tpu(a), tpu(b), out=out)
    assert_close(out, torch.mm(a, b), bf)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_products_backward(dtype, gen, native):
    a, b, c = make((4, 5), dtype, gen), make((5, 3), dtype, gen), make((3,), dtype, gen)
    ba, bb = make((2, 4, 5), dtype, gen), make((2, 5, 3), dtype, gen)
    v = make((5,), dtype, gen)
    fns = [
        (lambda x, y, z: torch.addmm(z, x, y, beta=0.5, alpha=2), (a, b, c)),
        (lambda x, y: torch.bmm(x, y), (ba, bb)),
        (lambda x, y: torch.mv(x, y), (a, v)),
        (lambda x, y: torch.dot(x, y), (v, v * 2)),
        (lambda x, y: x @ y, (a, b)),
    ]
    for fn, args in fns:
        cpu_in = [x.clone().requires_grad_() for x in args]
        tpu_in = [tpu(x).requires_grad_() for x in args]
        want, got = fn(*cpu_in), fn(*tpu_in)
        g = make(want.shape, dtype, gen)
        gw = torch.autograd.grad(want, cpu_in, g)
        gt = torch.autograd.grad(got, tpu_in, tpu(g))
        for x, y in zip(gt, gw):
            assert_close(x, y, dtype)


def _same_error(fn, *args, **kw):
    with pytest.raises(Exception) as cpu_err:
        fn(*args, **kw)
    targs = [tpu(a) if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(cpu_err.type) as tpu_err:
        fn(*targs, **kw)
        torch.tpu.synchronize()
    return str(cpu_err.value), str(tpu_err.value)


def test_product_errors():
    o = torch.ones
    cpu_msg, tpu_msg = _same_error(torch.mm, o(2, 3), o(4, 5))
    assert "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)" in tpu_msg
    _, tpu_msg = _same_error(torch.mm, o(2, 3), o(3, 5, dtype=torch.float64))
    assert "expected m1 and m2 to have the same dtype, but got: float != double" in tpu_msg
    _same_error(torch.bmm, o(2, 3, 4), o(3, 4, 5))
    _same_error(torch.addmm, o(3, 3), o(2, 3), o(3, 3))
    _same_error(torch.addmm, o(2, 2, dtype=torch.float64), o(2, 3), o(3, 2))
    _same_error(torch.baddbmm, o(2, 3, 3), o(2, 3, 4), o(2, 4, 3, dtype=torch.float64))
    _same_error(torch.mv, o(2, 3), o(4))
    _same_error(torch.dot, o(3), o(4))
    _same_error(torch.dot, o(3), o(3, 1))
    _same_error(torch.mm, o(2, 3, dtype=torch.bool), o(3, 2, dtype=torch.bool))


# ---- convolution -----------------------------------------------------------------------

CONV_CASES = [
    # (input shape, weight shape, kwargs)
    ((2, 4, 9), (6, 2, 3), dict(stride=2, padding=1, dilation=1, groups=2)),
    ((2, 3, 7, 6), (5, 3, 3, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2))),
    ((1, 4, 5, 5), (4, 1, 3, 3), dict(stride=1, padding=1, groups=4)),
    ((3, 6, 4, 4), (8, 6, 1, 1), dict()),
    ((1, 2, 4, 5, 4), (3, 2, 2, 3, 2), dict(stride=(1, 2, 1), padding=1)),
    # batches of small images run as blocks of images per GEMM (19: a partial last block)
    ((19, 4, 6, 5), (6, 2, 3, 3), dict(stride=1, padding=1, groups=2)),
    ((19, 6, 3, 3), (4, 6, 1, 1), dict()),
    ((21, 3, 17), (5, 3, 4), dict(stride=3, padding=2)),
    # positions filling whole GEMM column tiles (8x8, 16x16): one image per GEMM, in place
    ((19, 4, 8, 8), (6, 2, 3, 3), dict(padding=1, groups=2)),
    ((6, 3, 16, 16), (5, 3, 3, 3), dict(padding=1)),
    # stride 1 with the output as wide as the input: im2col copies whole runs of lines
    ((3, 2, 7, 9), (3, 2, 3, 3), dict(padding=2, dilation=2)),
    ((2, 3, 6, 7), (4, 3, 2, 3), dict(padding=(0, 1))),
    ((2, 2, 3, 4), (2, 2, 5, 3), dict(padding=(3, 1))),  # taps entirely above/below the image
    # small images, weight gradient of 1 MiB or more: one product per block of images
    ((3, 256, 4, 4), (256, 128, 3, 3), dict(padding=1, groups=2)),
    ((3, 512, 3, 3), (512, 512, 1, 1), dict()),
    ((26, 2048, 3, 3), (16, 2048, 3, 3), dict(padding=1)),  # blocks of 25 (f64: 12), one partial
    # f32 3x3 at stride 1 with 128+ channels: Winograd F(2x2, 3x3) forward (odd output
    # sizes crop the last tiles; 136 input channels end in a partial group of 16)
    ((2, 128, 7, 9), (128, 128, 3, 3), dict(padding=1)),
    ((3, 136, 6, 5), (128, 136, 3, 3), dict()),
    ((1, 128, 5, 4), (144, 128, 3, 3), dict(padding=2)),
    ((3, 128, 64, 64), (128, 128, 3, 3), dict(padding=1)),  # Winograd blocks of 2 images and 1
    ((2, 136, 17, 16), (128, 136, 3, 3), dict(padding=1)),  # weight gradient too, a cropped row of tiles
]
CONV_FNS = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


def conv_weight(ws, dtype, gen):
    """Scaled by 1/sqrt(fan-in), as nn.Conv initializes it: outputs stay near 1, so the
    dtype's tolerances hold for sums over thousands of products too."""
    return make(ws, dtype, gen) * math.prod(ws[1:]) ** -0.5


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv_forward(dtype, case, gen, native):
    xs, ws, kw = CONV_CASES[case]
    x, w, b = make(xs, dtype, gen), conv_weight(ws, dtype, gen), make((ws[0],), dtype, gen)
    fn = CONV_FNS[len(xs)]
    for bias in (b, None):
        want = fn(x, w, bias, **kw)
        got = fn(tpu(x), tpu(w), None if bias is None else tpu(bias), **kw)
        assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv_backward(dtype, case, gen, native):
    xs, ws, kw = CONV_CASES[case]
    fn = CONV_FNS[len(xs)]
    args = [make(xs, dtype, gen), conv_weight(ws, dtype, gen), make((ws[0],), dtype, gen)]
    cpu_in = [t.clone().requires_grad_() for t in args]
    tpu_in = [tpu(t).requires_grad_() for t in args]
    want, got = fn(*cpu_in, **kw), fn(*tpu_in, **kw)
    # grad_output scaled by 1/sqrt(images x positions), as the weights by 1/sqrt(fan-in):
    # the weight gradient's sums over those products then stay near 1 too
    g = make(want.shape, dtype, gen) * (want.numel() / want.shape[1]) ** -0.5
    for a, c in zip(torch.autograd.grad(got, tpu_in, tpu(g)), torch.autograd.grad(want, cpu_in, g)):
        assert_close(a, c, dtype)
    # only the input needs a gradient (weight frozen, no bias)
    x = tpu(args[0]).requires_grad_()
    (gx,) = torch.autograd.grad(fn(x, tpu(args[1]), None, **kw), x, tpu(g))
    xc = args[0].clone().requires_grad_()
    (gc,) = torch.autograd.grad(fn(xc, args[1], None, **kw), xc, g)
    assert_close(gx, gc, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n, ws, kw", [
    (2, (4, 3, 3, 2), dict(stride=(2, 1), padding=(1, 0), output_padding=(1, 0), groups=2, dilation=(1, 2))),
    (19, (4, 3, 3, 2), dict(stride=(2, 1), padding=(1, 0), output_padding=(1, 0), groups=2, dilation=(1, 2))),
    (19, (4, 6, 1, 1), dict()),  # 1x1: no col2im
])
def test_conv_transposed(dtype, n, ws, kw, gen, native):
    x, w, b = make((n, 4, 5, 4), dtype, gen), make(ws, dtype, gen), make((ws[1] * kw.get("groups", 1),), dtype, gen)
    cpu_in = [t.clone().requires_grad_() for t in (x, w, b)]
    tpu_in = [tpu(t).requires_grad_() for t in (x, w, b)]
    want, got = F.conv_transpose2d(*cpu_in, **kw), F.conv_transpose2d(*tpu_in, **kw)
    assert_close(got, want, dtype)
    g = make(want.shape, dtype, gen)
    for a, c in zip(torch.autograd.grad(got, tpu_in, tpu(g)), torch.autograd.grad(want, cpu_in, g)):
        assert_close(a, c, dtype)


def test_conv_noncontiguous_and_int(gen, native):
    x = make((2, 3, 8, 8), torch.float32, gen).permute(0, 1, 3, 2)  # transposed spatial
    w = make((4, 3, 3, 3), torch.float32, gen)[:, :, ::1, :]
    assert_close(F.conv2d(tpu(x), tpu(w), padding=1), F.conv2d(x, w, padding=1))
    cl = make((2, 3, 6, 6), torch.float32, gen).to(memory_format=torch.channels_last)
    assert_close(F.conv2d(tpu(cl), tpu(w)), F.conv2d(cl, w))
    xi, wi = make((1, 2, 5, 5), torch.int64, gen), make((3, 2, 2, 2), torch.int64, gen)
    assert_close(F.conv2d(tpu(xi), tpu(wi)), F.conv2d(xi, wi))


def test_conv_errors():
    o = torch.ones
    _same_error(F.conv2d, o(1, 3, 5, 5), o(4, 2, 3, 3))
    _same_error(F.conv2d, o(1, 3, 2, 2), o(4, 3, 3, 3))
    _same_error(F.conv2d, o(1, 3, 5, 5), o(4, 3, 3, 3, dtype=torch.float64))
    _same_error(F.conv2d, o(1, 3, 5, 5), o(4, 3, 3, 3), o(5))


# ---- pooling ----------------------------------------------------------------------------

POOL_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


@pytest.mark.parametrize("dtype", POOL_DTYPES + [torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), dilation=(1, 2),
                                     ceil_mode=True)])
def test_max_pool2d(dtype, kw, gen, native):
    x = make((2, 3, 7, 6), dtype, gen)
    want, wi = F.max_pool2d(x, return_indices=True, **kw)
    got, gi = F.max_pool2d(tpu(x), return_indices=True, **kw)
    assert_close(got, want, dtype)
    if dtype.is_floating_point and dtype != torch.float64:
        return  # ties after rounding may pick another index; values above agree
    assert torch.equal(gi.cpu(), wi)
    x3 = x[0]  # unbatched 3-D input
    assert_close(F.max_pool2d(tpu(x3), **kw), F.max_pool2d(x3, **kw), dtype)


def test_max_pool2d_nan_and_out(gen, native):
    x = make((1, 2, 4, 4), torch.float32, gen)
    x[0, 0, 1, 1] = float("nan")
    want, wi = torch.ops.aten.max_pool2d_with_indices(x, [2], [2], [0], [1], False)
    out, ind = torch.empty(0, device=DEV), torch.empty(0, dtype=torch.int64, device=DEV)
    torch.ops.aten.max_pool2d_with_indices.out(tpu(x), [2], [2], [0], [1], False, out=out, indices=ind)
    assert_close(out, want, equal_nan=True)
    assert torch.equal(ind.cpu(), wi)


@pytest.mark.parametrize("dtype", POOL_DTYPES + [torch.int64])
@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
                                dict(kernel_size=(3, 2), stride=2, padding=1, ceil_mode=True),
                                dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                                     count_include_pad=False),
                                dict(kernel_size=2, stride=1, padding=1, divisor_override=3)])
def test_avg_pool2d(dtype, kw, gen, native):
    x = make((2, 3, 7, 6), dtype, gen)
    assert_close(F.avg_pool2d(tpu(x), **kw), F.avg_pool2d(x, **kw), dtype)


@pytest.mark.parametrize("dtype", POOL_DTYPES)
@pytest.mark.parametrize("size", [(3, 2), (7, 6), (1, 1), (4, 5)])
def test_adaptive_pools(dtype, size, gen, native):
    x = make((2, 3, 7, 6), dtype, gen)
    assert_close(F.adaptive_avg_pool2d(tpu(x), size), F.adaptive_avg_pool2d(x, size), dtype)
    want, wi = F.adaptive_max_pool2d(x, size, return_indices=True)
    got, gi = F.adaptive_max_pool2d(tpu(x), size, return_indices=True)
    assert_close(got, want, dtype)
    if dtype == torch.float64:
        assert torch.equal(gi.cpu(), wi)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pool_backward(dtype, gen, native):
    x = make((2, 3, 7, 6), dtype, gen)
    fns = [
        lambda t: F.max_pool2d(t, 3, 2, 1),
        lambda t: F.max_pool2d(t, (3, 2), (2, 1), (1, 1), (1, 2), ceil_mode=True),
        lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        lambda t: F.avg_pool2d(t, 2, 1, 1, divisor_override=3),
        lambda t: F.avg_pool2d(t, 2),  # 2x2 windows side by side (the last row in none)
        lambda t: F.avg_pool2d(t, 2, divisor_override=3),
        lambda t: F.avg_pool2d(t, (2, 3), 2),
        lambda t: F.adaptive_avg_pool2d(t, (4, 5)),
        lambda t: F.adaptive_max_pool2d(t, (3, 4)),
    ]
    for fn in fns:
        xc, xt = x.clone().requires_grad_(), tpu(x).requires_grad_()
        want, got = fn(xc), fn(xt)
        g = make(want.shape, dtype, gen)
        (gc,) = torch.autograd.grad(want, xc, g)
        (gt,) = torch.autograd.grad(got, xt, tpu(g))
        assert_close(gt, gc, dtype)


def test_pool_errors():
    o = torch.ones
    _same_error(F.max_pool2d, o(1, 1, 4, 4), 5)
    _same_error(F.max_pool2d, o(1, 1, 4, 4), 2, 1, 2)
    _same_error(F.avg_pool2d, o(1, 1, 4, 4), 2, 2, 0, False, True, 0)
    _same_error(F.avg_pool2d, o(1, 1, 4, 4, dtype=torch.int32), 2)
    _same_error(F.adaptive_avg_pool2d, o(1, 1, 0, 4), 2)
    _same_error(torch.ops.aten.max_pool2d_with_indices_backward, o(1, 1, 3, 2), o(1, 1, 4, 4),
                [2], [2], [0], [1], False, torch.zeros(1, 1, 2, 2, dtype=torch.long))


def test_maxpool_backward_strided_and_bad_index():
    """grad_output and indices are read in place when dense and packed when not; an index
    outside its plane is an error naming the op (CPU's kernel writes out of the plane)."""
    mp = torch.ops.aten.max_pool2d_with_indices_backward
    x = torch.randn(4, 3, 8, 8)
    _, ind = torch.ops.aten.max_pool2d_with_indices(x, [2, 2], [2, 2])
    g = torch.randn(4, 4, 4, 3).permute(0, 3, 1, 2)  # [4, 3, 4, 4], not dense
    ind_t = ind.transpose(2, 3).contiguous().transpose(2, 3)
    want = mp(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, ind)
    for gi, ii in ((g, ind), (g.contiguous(), ind_t)):
        got = mp(tpu(gi), tpu(x), [2, 2], [2, 2], [0, 0], [1, 1], False, tpu(ii))
        assert_close(got, want, torch.float32)
    bad = ind.clone()
    bad[0, 1, 1, 1] = 64
    with pytest.raises(IndexError, match="max_pool2d_with_indices_backward: index 64 out of range"):
        mp(tpu(g), tpu(x), [2, 2], [2, 2], [0, 0], [1, 1], False, tpu(bad)).cpu()


# ---- triangular solves ----------------------------------------------------------------------


def triangular(shape, dtype, gen, upper):
    """A well-conditioned triangular matrix (a dominant diagonal)."""
    a = make(shape, dtype, gen) * 0.3 + 3 * torch.eye(shape[-1], dtype=dtype)
    return a.triu() if upper else a.tril()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular(dtype, upper, left, unit, gen, native):
    for a_batch, b_batch in [((), ()), ((3,), (3,)), ((2, 1), (4,)), ((), (2, 3)), ((1,), ())]:
        a = triangular(a_batch + (5, 5), dtype, gen, upper)
        b = make(b_batch + ((5, 3) if left else (3, 5)), dtype, gen)
        kw = dict(upper=upper, left=left, unitriangular=unit)
        want = torch.linalg.solve_triangular(a, b, **kw)
        got = torch.linalg.solve_triangular(tpu(a), tpu(b), **kw)
        assert got.shape == want.shape
        assert_close(got, want, dtype)
    # non-contiguous operands, the other triangle ignored, B of another dtype (cast to A's)
    a = make((5, 5), dtype, gen) + 3 * torch.eye(5, dtype=dtype)
    b = make((7, 5), torch.float64 if dtype is torch.float32 else torch.float32, gen)
    bb = b.t() if left else b
    want = torch.linalg.solve_triangular(a.t(), bb, upper=upper, left=left, unitriangular=unit)
    got = torch.linalg.solve_triangular(tpu(a).t(), tpu(bb), upper=upper, left=left, unitriangular=unit)
    assert got.dtype == want.dtype
    assert_close(got, want, dtype)
    out = tpu(torch.empty(0, dtype=dtype))
    assert torch.linalg.solve_triangular(tpu(a), tpu(bb).to(dtype), upper=upper, left=left, out=out) is out
    assert_close(out, torch.linalg.solve_triangular(a, bb.to(dtype), upper=upper, left=left), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
def test_triangular_solve(dtype, upper, transpose, gen, native):
    a = triangular((2, 4, 4), dtype, gen, upper)
    b = make((3, 1, 4, 2), dtype, gen)
    want = torch.triangular_solve(b, a, upper=upper, transpose=transpose)
    got = torch.triangular_solve(tpu(b), tpu(a), upper=upper, transpose=transpose)
    assert_close(got.solution, want.solution, dtype)
    assert_close(got.cloned_coefficient, want.cloned_coefficient, dtype)
    x, m = tpu(torch.empty(0, dtype=dtype)), tpu(torch.empty(0, dtype=dtype))
    torch.triangular_solve(tpu(b), tpu(a), upper=upper, transpose=transpose, unitriangular=True, out=(x, m))
    want = torch.triangular_solve(b, a, upper=upper, transpose=transpose, unitriangular=True)
    assert_close(x, want.solution, dtype)
    assert_close(m, want.cloned_coefficient, dtype)


def test_solve_triangular_empty_and_singular(native):
    for a, b in [(torch.zeros(0, 3, 3), torch.zeros(0, 3, 2)), (torch.eye(3), torch.zeros(3, 0)),
                 (torch.zeros(0, 0), torch.zeros(0, 4))]:
        want = torch.linalg.solve_triangular(a, b, upper=True)
        got = torch.linalg.solve_triangular(tpu(a), tpu(b), upper=True)
        assert got.shape == want.shape
    a = torch.tensor([[2.0, 1.0], [0.0, 0.0]])  # a zero pivot gives inf/nan, as on CPU
    b = torch.tensor([[1.0], [1.0]])
    want = torch.linalg.solve_triangular(a, b, upper=True)
    assert_close(torch.linalg.solve_triangular(tpu(a), tpu(b), upper=True), want, torch.float32, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_solve_triangular_backward(dtype, gen, native):
    """The derivative formula is composite over solve_triangular, matmul and triu/tril."""
    for upper, left in [(True, True), (False, False)]:
        a = triangular((2, 4, 4), dtype, gen, upper).requires_grad_()
        b = make((2, 4, 3) if left else (2, 3, 4), dtype, gen).requires_grad_()
        at, bt = tpu(a.detach()).requires_grad_(), tpu(b.detach()).requires_grad_()
        want = torch.linalg.solve_triangular(a, b, upper=upper, left=left)
        got = torch.linalg.solve_triangular(at, bt, upper=upper, left=left)
        g = make(want.shape, dtype, gen)
        for x, y in zip(torch.autograd.grad(got, (at, bt), tpu(g)), torch.autograd.grad(want, (a, b), g)):
            assert_close(x, y, dtype)
    a = triangular((3, 3), dtype, gen, True).requires_grad_()
    b = make((3, 2), dtype, gen).requires_grad_()
    at, bt = tpu(a.detach()).requires_grad_(), tpu(b.detach()).requires_grad_()
    g = make((3, 2), dtype, gen)
    want = torch.autograd.grad(torch.triangular_solve(b, a).solution, (a, b), g)
    got = torch.autograd.grad(torch.triangular_solve(bt, at).solution, (at, bt), tpu(g))
    for x, y in zip(got, want):
        assert_close(x, y, dtype)


def test_solve_triangular_errors():
    o = torch.ones
    st = torch.linalg.solve_triangular
    _same_error(lambda a, b: st(a, b, upper=True), o(3, 4), o(3, 2))
    _same_error(lambda a, b: st(a, b, upper=True), o(3), o(3, 2))
    _same_error(lambda a, b: st(a, b, upper=True), o(3, 3), o(3))
    _same_error(lambda a, b: st(a, b, upper=True), o(3, 3), o(2, 2))
    _same_error(lambda a, b: st(a, b, upper=True, left=False), o(3, 3), o(3, 2))
    _same_error(lambda a, b: st(a, b, upper=True), o(4, 3, 3), o(2, 3, 2))
    _same_error(lambda a, b: st(a, b, upper=True, out=torch.empty(0, dtype=torch.float64, device=a.device)),
                o(3, 3), o(3, 2))
    _same_error(torch.triangular_solve, o(3), o(3, 3))
    _same_error(torch.triangular_solve, o(3, 2), o(3, 3, dtype=torch.float64))
    _same_error(torch.triangular_solve, o(2, 2), o(3, 3))
    _same_error(torch.triangular_solve, o(3, 2), o(3, 4))


# ---- LAPACK decompositions (the lapack family) -----------------------------------------
# Each op runs natively for float32/float64 (op_helpers.native fails on a CPU fallback);
# inputs are well conditioned, so CPU's LAPACK and ours agree within the table's
# tolerances. Where `info` reports a failed factorization, the factor's contents are
# LAPACK-implementation specific and only info is compared; the raising wrappers must
# raise CPU's exception type with CPU's message.

from op_helpers import close, grads  # noqa: E402
from op_helpers import native as native_ops  # noqa: E402

LAPACK_FLOATS = [torch.float32, torch.float64]
aten = torch.ops.aten


def well_conditioned(shape, dtype, gen):
    n = shape[-1]
    return (torch.randn(shape, generator=gen, dtype=torch.float64) + 2 * n ** 0.5 * torch.eye(n, dtype=torch.float64)).to(dtype)


def spd(shape, dtype, gen):
    a = torch.randn(shape, generator=gen, dtype=torch.float64)
    return (a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=torch.float64)).to(dtype)


def close_all(got, want, **kw):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        close(g, w, **kw)


def same_raise(fn, *args, **kw):
    """fn raises the same exception type with the same message on CPU and tpu."""
    cpu_msg, tpu_msg = _same_error(fn, *args, **kw)
    assert cpu_msg.splitlines()[0] in tpu_msg, (cpu_msg, tpu_msg)


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 2, 3, 3), (1, 1), (0, 3, 3), (2, 0, 0)])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex(dtype, shape, upper, gen):
    a = spd(shape, dtype, gen)
    with native_ops("linalg_cholesky_ex"):
        got = torch.linalg.cholesky_ex(tpu(a), upper=upper)
        close_all(got, torch.linalg.cholesky_ex(a, upper=upper))
        close(torch.linalg.cholesky(tpu(a), upper=upper), torch.linalg.cholesky(a, upper=upper))
        out = (torch.empty(0, dtype=dtype, device=DEV), torch.empty(0, dtype=torch.int32, device=DEV))
        torch.linalg.cholesky_ex(tpu(a), upper=upper, out=out)
        close_all(out, torch.linalg.cholesky_ex(a, upper=upper))


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
def test_cholesky_not_positive_definite(dtype, gen):
    a = spd((4, 3, 3), dtype, gen)
    a[1] = -a[1]
    a[3, 2, 2] = -100.0
    with native_ops("linalg_cholesky_ex"):
        L, info = torch.linalg.cholesky_ex(tpu(a))
        Lc, infoc = torch.linalg.cholesky_ex(a)
        close(info, infoc)
        assert infoc.tolist() == [0, 1, 0, 3]
        ok = infoc == 0
        close(L.cpu()[ok].to(DEV), Lc[ok])
    same_raise(torch.linalg.cholesky, a)
    same_raise(torch.linalg.cholesky, a[3])


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 3, 5), (2, 5, 3), (2, 2, 1, 4), (0, 3, 3), (3, 0, 2)])
def test_lu_factor_ex(dtype, shape, gen):
    a = torch.randn(shape, generator=gen, dtype=dtype)
    with native_ops("linalg_lu_factor_ex"):
        close_all(torch.linalg.lu_factor_ex(tpu(a)), torch.linalg.lu_factor_ex(a))
        close_all(torch.linalg.lu_factor(tpu(a)), torch.linalg.lu_factor(a))
        out = (torch.empty(0, dtype=dtype, device=DEV), torch.empty(0, dtype=torch.int32, device=DEV),
               torch.empty(0, dtype=torch.int32, device=DEV))
        torch.linalg.lu_factor_ex(tpu(a), out=out)
        close_all(out, torch.linalg.lu_factor_ex(a))


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
def test_lu_factor_singular(dtype, gen):
    a = torch.randn(3, 4, 4, generator=gen, dtype=dtype)
    a[1, :, 2] = 0
    a[2] = 0
    with native_ops("linalg_lu_factor_ex"):
        got, want = torch.linalg.lu_factor_ex(tpu(a)), torch.linalg.lu_factor_ex(a)
        close(got.info, want.info)
        assert want.info.tolist()[0] == 0 and want.info.tolist()[1:] != [0, 0]
        close(got.pivots, want.pivots)
    same_raise(torch.linalg.lu_factor, a)


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("ashape,bshape", [((4, 4), (4, 2)), ((3, 4, 4), (3, 4, 1)), ((2, 1, 3, 3), (4, 3, 5)),
                                           ((3, 3), (2, 3, 3)), ((0, 3, 3), (0, 3, 2))])
def test_lu_solve(dtype, left, adjoint, ashape, bshape, gen):
    a = well_conditioned(ashape, dtype, gen)
    b = torch.randn(bshape, generator=gen, dtype=dtype)
    if not left:
        b = b.mT
    LU, piv = torch.linalg.lu_factor(a)
    with native_ops("linalg_lu_solve"):
        got = torch.linalg.lu_solve(tpu(LU), tpu(piv), tpu(b), left=left, adjoint=adjoint)
        close(got, torch.linalg.lu_solve(LU, piv, b, left=left, adjoint=adjoint))


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("ashape,bshape", [((4, 4), (4, 2)), ((4, 4), (4,)), ((3, 4, 4), (3, 4)), ((3, 4, 4), (4,)),
                                           ((3, 4, 4), (3, 4, 1)), ((2, 1, 3, 3), (4, 3, 5)), ((3, 3), (2, 3, 3)),
                                           ((1, 3, 3), (2, 3, 3)), ((0, 3, 3), (0, 3, 2))])
def test_solve_ex(dtype, left, ashape, bshape, gen):
    a = well_conditioned(ashape, dtype, gen)
    b = torch.randn(bshape, generator=gen, dtype=dtype)
    if not left and b.dim() >= 2 and not (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1]):
        b = b.mT.contiguous()
    try:
        want = aten._linalg_solve_ex(a, b, left=left)
    except RuntimeError:  # a vector B has no XA = B form unless n == 1
        same_raise(lambda x, y: aten._linalg_solve_ex(x, y, left=left), a, b)
        return
    with native_ops("_linalg_solve_ex"):
        close_all(aten._linalg_solve_ex(tpu(a), tpu(b), left=left), want)
        close(torch.linalg.solve(tpu(a), tpu(b), left=left), torch.linalg.solve(a, b, left=left))


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
def test_solve_singular(dtype, gen):
    a = well_conditioned((3, 3, 3), dtype, gen)
    a[1, 2] = 0
    b = torch.randn(3, 3, 2, generator=gen, dtype=dtype)
    with native_ops("_linalg_solve_ex"):
        got, want = torch.linalg.solve_ex(tpu(a), tpu(b)), torch.linalg.solve_ex(a, b)
        close(got.info, want.info)
        assert want.info.tolist() == [0, 3, 0]
    same_raise(torch.linalg.solve, a, b)
    same_raise(torch.linalg.solve, a[1], b[1])


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 2, 3, 3), (1, 1), (0, 2, 2)])
def test_inv_ex(dtype, shape, gen):
    a = well_conditioned(shape, dtype, gen)
    with native_ops("linalg_inv_ex"):
        close_all(torch.linalg.inv_ex(tpu(a)), torch.linalg.inv_ex(a))
        close(torch.linalg.inv(tpu(a)), torch.linalg.inv(a))
        close(torch.inverse(tpu(a)), torch.inverse(a))


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
def test_inv_singular(dtype, gen):
    a = well_conditioned((3, 3, 3), dtype, gen)
    a[2, :, 1] = 0
    with native_ops("linalg_inv_ex"):
        got, want = torch.linalg.inv_ex(tpu(a)), torch.linalg.inv_ex(a)
        close(got.info, want.info)
        assert want.info.tolist() == [0, 0, 2]
        close(got.inverse[:2], want.inverse[:2])
    same_raise(torch.linalg.inv, a)
    same_raise(torch.linalg.inv, a[2])


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 2, 3, 3), (1, 1), (0, 0), (0, 2, 2)])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_det_slogdet(dtype, shape, layout, gen):
    base = torch.randn(shape + ((2,) if layout == "strided" else ()), generator=gen, dtype=dtype)
    view = {"contiguous": lambda t: t, "transposed": lambda t: t.mT, "strided": lambda t: t[..., 0]}[layout]
    a, ta = view(base), view(tpu(base))  # ATen factors A^T for a contiguous A, else A
    assert ta.is_contiguous() == a.is_contiguous()
    with native_ops("_linalg_det", "_linalg_slogdet"):
        close_all(aten._linalg_det(ta), aten._linalg_det(a))
        close_all(aten._linalg_slogdet(ta), aten._linalg_slogdet(a))
        close(torch.linalg.det(ta), torch.linalg.det(a))
        close_all(torch.linalg.slogdet(ta), torch.linalg.slogdet(a))
        close(torch.logdet(ta), torch.logdet(a))


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
def test_det_singular(dtype, gen):
    a = torch.randn(3, 4, 4, generator=gen, dtype=dtype)
    a[1, :, 3] = 0
    a[2] = 0
    with native_ops("_linalg_det", "_linalg_slogdet"):
        close(torch.linalg.det(tpu(a)), torch.linalg.det(a))
        close_all(torch.linalg.slogdet(tpu(a)), torch.linalg.slogdet(a))


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 3, 5), (2, 5, 3), (2, 2, 1, 4), (0, 3, 3), (3, 0, 2)])
def test_linalg_lu_and_unpack(dtype, shape, gen):
    a = torch.randn(shape, generator=gen, dtype=dtype)
    LU, piv = torch.linalg.lu_factor(a)
    with native_ops("linalg_lu", "lu_unpack"):
        close_all(torch.linalg.lu(tpu(a)), torch.linalg.lu(a))
        for data in (True, False):
            for pivots in (True, False):
                got = torch.lu_unpack(tpu(LU), tpu(piv), unpack_data=data, unpack_pivots=pivots)
                close_all(got, torch.lu_unpack(LU, piv, unpack_data=data, unpack_pivots=pivots))


def test_lapack_errors():
    o, f = torch.ones, torch.randn
    same_raise(torch.linalg.cholesky_ex, o(3, 4))
    same_raise(torch.linalg.cholesky_ex, o(3))
    same_raise(torch.linalg.cholesky_ex, o(3, 3, dtype=torch.int64))
    same_raise(torch.linalg.cholesky_ex, o(3, 3, dtype=torch.float16))  # the CPU fallback's own error
    same_raise(torch.linalg.lu_factor_ex, o(3))
    same_raise(lambda a: torch.linalg.lu_factor_ex(a, pivot=False), o(3, 3))
    same_raise(lambda a: torch.linalg.lu(a, pivot=False), o(3, 3))
    same_raise(torch.linalg.lu, o(3))
    same_raise(torch.linalg.inv_ex, o(3, 4))
    same_raise(torch.linalg.inv_ex, o(2, 3, dtype=torch.int32))
    for fn in (aten._linalg_det, aten._linalg_slogdet):
        same_raise(fn, o(3, 4))
        same_raise(fn, o(4))
        same_raise(fn, o(3, 3, dtype=torch.int64))
    same_raise(aten._linalg_solve_ex, o(3, 4), o(3, 2))
    same_raise(aten._linalg_solve_ex, o(3, 3), o(3, 2, dtype=torch.float64))
    same_raise(aten._linalg_solve_ex, o(3, 3, dtype=torch.int64), o(3, 2, dtype=torch.int64))
    same_raise(aten._linalg_solve_ex, o(3, 3), o(4, 2))
    same_raise(aten._linalg_solve_ex, o(3, 3), o(4))
    same_raise(lambda a, b: aten._linalg_solve_ex(a, b, left=False), o(3, 3), o(2, 4))
    same_raise(aten._linalg_solve_ex, o(2, 3, 3), o(3, 3, 2))
    LU, piv = torch.linalg.lu_factor(f(3, 3))
    same_raise(torch.linalg.lu_solve, LU, piv, o(4, 2))
    same_raise(torch.linalg.lu_solve, LU, piv, o(3))
    same_raise(torch.linalg.lu_solve, LU, piv, o(3, 2, dtype=torch.float64))
    same_raise(torch.linalg.lu_solve, LU, piv.long(), o(3, 2))
    same_raise(torch.linalg.lu_solve, LU, piv[:2], o(3, 2))
    same_raise(torch.linalg.lu_solve, o(3, 4), piv, o(3, 2))
    same_raise(torch.lu_unpack, LU, piv.long())
    same_raise(torch.lu_unpack, LU, piv[:2])
    same_raise(torch.lu_unpack, o(3), piv)


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
def test_lapack_grads(dtype, gen):
    """Autograd through the native ops vs CPU (the backward formulas call them again)."""
    a = well_conditioned((2, 4, 4), dtype, gen)
    s = spd((2, 4, 4), dtype, gen)
    b = torch.randn(2, 4, 3, generator=gen, dtype=dtype)
    r = torch.randn(2, 5, 3, generator=gen, dtype=dtype)
    cases = [
        (lambda x: torch.linalg.cholesky(x), (s,)),
        (lambda x: torch.linalg.cholesky(x, upper=True), (s,)),
        (lambda x, y: torch.linalg.solve(x, y), (a, b)),
        (lambda x, y: torch.linalg.solve(x, y, left=False), (a, b.mT)),
        (lambda x: torch.linalg.inv(x), (a,)),
        (lambda x: torch.linalg.det(x), (a,)),
        (lambda x: torch.linalg.det(x.mT), (a,)),
        (lambda x: torch.linalg.slogdet(x).logabsdet, (a,)),
        (lambda x: torch.linalg.lu_factor(x).LU, (a,)),
        (lambda x: torch.cat([t.flatten(1) for t in torch.linalg.lu(x)[1:]], 1), (r,)),
        (lambda x, y: torch.linalg.lu_solve(*torch.linalg.lu_factor(x), y), (a, b)),
        (lambda x, y: torch.linalg.lu_solve(*torch.linalg.lu_factor(x), y, adjoint=True), (a, b)),
    ]
    for fn, args in cases:
        cpu_in = [t.clone().requires_grad_() for t in args]
        tpu_in = [tpu(t).requires_grad_() for t in args]
        want, gw = grads(fn, cpu_in)
        got, gt = grads(fn, tpu_in)
        close(got, want)
        for x, y in zip(gt, gw):
            close(x, y, scale=10)


def gauge(vectors, *others, dim=-2):
    """Eigen/singular vectors are unique up to each one's sign, which CPU's LAPACK (MKL)
    and ours may pick differently: flips each vector (a column; dim=-1: a row) so that
    its largest-magnitude entry is positive, and the matching rows of `others` with it."""
    if vectors.numel() == 0:
        return (vectors,) + others
    idx = vectors.abs().argmax(dim=dim, keepdim=True)
    s = torch.sign(vectors.gather(dim, idx))
    s = torch.where(s == 0, torch.ones_like(s), s)
    return (vectors * s,) + tuple(o * s.mT for o in others)


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 3), (2, 3, 5), (2, 2, 4, 1), (0, 3, 3), (3, 0), (0, 2)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(dtype, shape, mode, gen):
    a = torch.randn(shape, generator=gen, dtype=dtype)
    with native_ops("linalg_qr"):
        close_all(torch.linalg.qr(tpu(a), mode=mode), torch.linalg.qr(a, mode=mode))


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 2, 3, 3), (1, 1), (0, 3, 3)])
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh(dtype, shape, uplo, gen):
    a = torch.randn(shape, generator=gen, dtype=dtype)  # not symmetric: only `uplo` is read
    with native_ops("_linalg_eigh"):
        w, v = torch.linalg.eigh(tpu(a), UPLO=uplo)
        wc, vc = torch.linalg.eigh(a, UPLO=uplo)
        close(w, wc, scale=10)
        close(gauge(v.cpu())[0].to(DEV), gauge(vc)[0], scale=10)
        close(torch.linalg.eigvalsh(tpu(a), UPLO=uplo), wc, scale=10)
        w2, v2 = aten._linalg_eigh(tpu(a), uplo, False)
        close(w2, wc, scale=10)
        assert v2.shape == (0,)


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 3), (2, 3, 5), (2, 2, 4, 1), (0, 3, 3), (3, 0), (0, 2)])
@pytest.mark.parametrize("full", [False, True])
def test_svd(dtype, shape, full, gen):
    a = torch.randn(shape, generator=gen, dtype=dtype)
    with native_ops("_linalg_svd"):
        U, S, Vh = torch.linalg.svd(tpu(a), full_matrices=full)
        Uc, Sc, Vhc = torch.linalg.svd(a, full_matrices=full)
        close(S, Sc, scale=10)
        k = S.shape[-1]
        # the first k singular vectors pair up; a full basis' other vectors are any
        # orthonormal completion, so those are checked for orthonormality only
        u, vh = gauge(U.cpu()[..., :k], Vh.cpu()[..., :k, :])
        uc, vhc = gauge(Uc[..., :k], Vhc[..., :k, :])
        close(u.to(DEV), uc, scale=10)
        close(vh.to(DEV), vhc, scale=10)
        if k == 0:  # an empty matrix's full factors are identities
            close(U, Uc)
            close(Vh, Vhc)
        eye = lambda n: torch.eye(n, dtype=dtype).expand(U.shape[:-2] + (n, n))  # noqa: E731
        torch.testing.assert_close((U.mT @ U).cpu(), eye(U.shape[-1]), atol=1e-5, rtol=0)
        torch.testing.assert_close((Vh @ Vh.mT).cpu(), eye(Vh.shape[-2]), atol=1e-5, rtol=0)
        close(torch.linalg.svdvals(tpu(a)), torch.linalg.svdvals(a), scale=10)
        U2, S2, V2 = aten._linalg_svd(tpu(a), full, False)
        assert U2.shape == (0,) and V2.shape == (0,)
        close(S2, Sc, scale=10)


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
def test_svd_users(dtype, gen):
    """matrix_norm ord=2/nuc, cond, pinv and matrix_rank run on the native SVD/eigh."""
    a = torch.randn(3, 5, 4, generator=gen, dtype=dtype)
    s = a.mT @ a
    with native_ops("_linalg_svd", "_linalg_eigh"):
        for ordv in (2, -2, "nuc"):
            close(torch.linalg.matrix_norm(tpu(a), ord=ordv), torch.linalg.matrix_norm(a, ord=ordv), scale=10)
        close(torch.linalg.pinv(tpu(a)), torch.linalg.pinv(a), scale=100)
        close(torch.linalg.pinv(tpu(s), hermitian=True), torch.linalg.pinv(s, hermitian=True), scale=100)
        close(torch.linalg.matrix_rank(tpu(a)), torch.linalg.matrix_rank(a))


def test_decomposition_errors():
    o = torch.ones
    same_raise(torch.linalg.qr, o(3))
    same_raise(torch.linalg.qr, o(3, 3, dtype=torch.int64))
    same_raise(lambda a: torch.linalg.qr(a, mode="x"), o(3, 3))
    same_raise(aten._linalg_eigh, o(3, 4))
    same_raise(aten._linalg_eigh, o(3))
    same_raise(lambda a: aten._linalg_eigh(a, "X"), o(3, 3))
    same_raise(aten._linalg_eigh, o(3, 3, dtype=torch.int64))  # the CPU fallback's own error
    same_raise(aten._linalg_svd, o(3))
    same_raise(aten._linalg_svd, o(3, 3, dtype=torch.int64))
    same_raise(lambda a: aten._linalg_svd(a, driver="gesvd"), o(3, 3))


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
def test_decomposition_grads(dtype, gen):
    """Gradients of gauge-invariant functions of QR, eigh and SVD vs CPU."""
    a = torch.randn(2, 5, 3, generator=gen, dtype=dtype)
    w = torch.randn(2, 3, 5, generator=gen, dtype=dtype)
    sq = torch.randn(2, 4, 4, generator=gen, dtype=dtype)
    cases = [
        (lambda x: torch.cat([t.flatten(1) for t in torch.linalg.qr(x)], 1), (a,)),
        (lambda x: torch.cat([t.flatten(1) for t in torch.linalg.qr(x)], 1), (w[:, :, :3],)),
        (lambda x: torch.linalg.eigvalsh(x), (sq,)),
        (lambda x: (lambda wv: wv[1] @ torch.diag_embed(wv[0].exp()) @ wv[1].mT)(torch.linalg.eigh(x)), (sq,)),
        (lambda x: torch.linalg.svdvals(x), (a,)),
        (lambda x: torch.linalg.svdvals(x), (w,)),
        (lambda x: (lambda usv: usv[0] @ torch.diag_embed(usv[1] ** 2) @ usv[2])(torch.linalg.svd(x, False)), (a,)),
        (lambda x: (lambda usv: usv[0] @ torch.diag_embed(usv[1] ** 2) @ usv[2])(torch.linalg.svd(x, False)), (w,)),
        (lambda x: torch.linalg.matrix_norm(x, ord="nuc"), (a,)),
        (lambda x: torch.linalg.pinv(x), (a,)),
    ]
    for fn, args in cases:
        cpu_in = [t.clone().requires_grad_() for t in args]
        tpu_in = [tpu(t).requires_grad_() for t in args]
        want, gw = grads(fn, cpu_in)
        got, gt = grads(fn, tpu_in)
        close(got, want, scale=10)
        for x, y in zip(gt, gw):
            close(x, y, scale=100)


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("bshape,ashape", [((4, 2), (4, 4)), ((3, 4, 1), (3, 4, 4)), ((2, 1, 3, 5), (4, 3, 3)),
                                           ((0, 3, 2), (0, 3, 3))])
def test_cholesky_solve_and_inverse(dtype, upper, bshape, ashape, gen):
    f = torch.linalg.cholesky(spd(ashape, dtype, gen), upper=upper)
    b = torch.randn(bshape, generator=gen, dtype=dtype)
    with native_ops("_cholesky_solve_helper", "cholesky_inverse"):
        close(torch.cholesky_solve(tpu(b), tpu(f), upper=upper), torch.cholesky_solve(b, f, upper=upper))
        close(torch.cholesky_inverse(tpu(f), upper=upper), torch.cholesky_inverse(f, upper=upper))
        out = torch.empty(0, dtype=dtype, device=DEV)
        torch.cholesky_inverse(tpu(f), upper=upper, out=out)
        close(out, torch.cholesky_inverse(f, upper=upper))
    fr, br = f.clone().requires_grad_(), b.clone().requires_grad_()
    ft, bt = tpu(f).requires_grad_(), tpu(b).requires_grad_()
    want, gw = grads(lambda x, y: torch.cholesky_solve(x, y, upper=upper), (br, fr))
    got, gt = grads(lambda x, y: torch.cholesky_solve(x, y, upper=upper), (bt, ft))
    close(got, want)
    for x, y in zip(gt, gw):
        close(x, y, scale=10)


def test_cholesky_solve_inverse_errors():
    o = torch.ones
    same_raise(torch.cholesky_inverse, o(3))
    same_raise(torch.cholesky_inverse, o(3, 4))
    same_raise(torch.cholesky_inverse, o(3, 3, dtype=torch.int64))  # the CPU fallback's own error
    same_raise(torch.cholesky_solve, o(3, 2), o(3, 3, dtype=torch.float64))
    same_raise(torch.cholesky_solve, o(3), o(3, 3))
    same_raise(torch.cholesky_solve, o(4, 2), o(3, 3))
    same_raise(torch.cholesky_solve, o(2, 3, 2), o(3, 3, 3))
    # a zero on the factor's diagonal: CPU raises LinAlgError from inside the op; the tpu
    # kernel's error is a RuntimeError with the same message at the next synchronization
    z = torch.eye(3).expand(2, 3, 3).clone()
    z[1, 1, 1] = 0
    for a in (z, z[1]):
        with pytest.raises(torch.linalg.LinAlgError) as cpu_err:
            torch.cholesky_inverse(a)
        with pytest.raises(RuntimeError) as tpu_err:
            torch.cholesky_inverse(tpu(a))
            torch.tpu.synchronize()
        assert str(cpu_err.value) in str(tpu_err.value), (str(cpu_err.value), str(tpu_err.value))


@pytest.mark.parametrize("dtype", LAPACK_FLOATS)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 3), (2, 3, 5), (2, 2, 4, 1), (0, 3, 3), (3, 0)])
def test_geqrf_householder_product(dtype, shape, gen):
    a = torch.randn(shape, generator=gen, dtype=dtype)
    with native_ops("geqrf", "linalg_householder_product"):
        got, want = torch.geqrf(tpu(a)), torch.geqrf(a)
        close_all(got, want)
        if shape[-2] >= shape[-1]:
            close(torch.linalg.householder_product(*got), torch.linalg.householder_product(*want))
            t = want.tau[..., : max(shape[-1] - 1, 0)]  # fewer reflectors than columns
            close(torch.linalg.householder_product(tpu(want.a), tpu(t)), torch.linalg.householder_product(want.a, t))
    if shape[-2] >= shape[-1] and a.numel() > 0:
        fn = torch.linalg.householder_product
        ins = [t.clone().requires_grad_() for t in want]
        wo, gw = grads(fn, ins)
        go, gt = grads(fn, [tpu(t).requires_grad_() for t in want])
        close(go, wo)
        for x, y in zip(gt, gw):
            close(x, y, scale=100)


def test_geqrf_householder_errors():
    o, hp = torch.ones, torch.linalg.householder_product
    same_raise(torch.geqrf, o(3))
    same_raise(torch.geqrf, o(3, 3, dtype=torch.int64))  # the CPU fallback's own error
    same_raise(hp, o(5), o(2))
    same_raise(hp, o(3, 5), o(2))
    same_raise(hp, o(5, 3), o(4))
    same_raise(hp, o(2, 5, 3), o(3, 2))
    same_raise(hp, o(5, 3), o(2, dtype=torch.float64))
    same_raise(hp, o(5, 3), o(1, 2))


@pytest.mark.parametrize("fn", [torch.linalg.eigh, torch.linalg.svd, torch.linalg.svdvals])
@pytest.mark.parametrize("shape", [(3, 3), (2, 3, 3)])
def test_decomposition_non_finite(fn, shape):
    """A NaN input: CPU raises LinAlgError from inside the op; the tpu kernel's error is a
    RuntimeError with the same message (batch element included) at the next sync."""
    a = torch.full(shape, float("nan"))
    with pytest.raises(torch.linalg.LinAlgError) as cpu_err:
        fn(a)
    with pytest.raises(RuntimeError) as tpu_err:
        fn(tpu(a))
        torch.tpu.synchronize()
    assert str(cpu_err.value) in str(tpu_err.value), (str(cpu_err.value), str(tpu_err.value))


# ATen's CPU capability needs the same AVX512F/BW/VL/DQ as libtpurt's f32 GEMM
AVX512_GEMM = torch.backends.cpu.get_cpu_capability() == "AVX512"


def _rms_err(x, ref):
    return (x.double() - ref).pow(2).mean().sqrt().item()


@pytest.mark.skipif(not AVX512_GEMM, reason="the AVX-512 f32 GEMM (elsewhere OpenBLAS's sgemm runs)")
@pytest.mark.parametrize("M,N,K,bt", [(512, 256, 2048, False),  # packed
                                      (4, 512, 4096, False),    # few rows, B read in place
                                      (4, 512, 4096, True),     # dot products
                                      (64, 27, 16384, True)])   # dot products, a weight gradient's K
def test_f32_matmul_error_at_most_cpus(M, N, K, bt, native):
    """Rounding error of long sums: every running sum is added into its total after at
    most KFOLD products (host/gemm_avx512f32.c). Summing 512-4096 products in one register
    gave 1.1-4.2x the rms error (vs float64) of PyTorch CPU's matmul on these shapes."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=g)
    b = (torch.randn(N, K, generator=g).t() if bt else torch.randn(K, N, generator=g)) / math.sqrt(K)
    ref = a.double() @ b.double()
    assert _rms_err((a.to(DEV) @ b.to(DEV)).cpu(), ref) <= _rms_err(a @ b, ref)


@pytest.mark.skipif(not AVX512_GEMM, reason="the AVX-512 f32 GEMM (elsewhere OpenBLAS's sgemm runs)")
def test_winograd_conv_error_within_2x_cpus(native):
    """A 512-channel 3x3 convolution runs Winograd F(2x2, 3x3), whose 16 products per tile
    sum over the input channels and are then combined: its rms error vs float64 stays
    within 2x that of PyTorch CPU's direct convolution (3.0x before the GEMM's sums were
    folded; keypointrcnn_resnet50_fpn's outputs then failed validation's float64 re-check)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 512, 14, 14, generator=g)
    w = torch.randn(512, 512, 3, 3, generator=g) / (3 * math.sqrt(512))
    ref = F.conv2d(x.double(), w.double(), padding=1)
    got = F.conv2d(x.to(DEV), w.to(DEV), padding=1).cpu()
    assert _rms_err(got, ref) <= 2 * _rms_err(F.conv2d(x, w, padding=1), ref)
