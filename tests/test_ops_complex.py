"""Complex dtypes on tpu against PyTorch CPU: copies (host <-> tpu, tpu <-> tpu, strided,
real <-> complex, conjugate and negative bits), the views between complex and real
(view_as_real, view_as_complex, .real, .imag), complex arithmetic, polar / complex /
angle / abs / sgn / conj, the FFTs (_fft_r2c, _fft_c2c, _fft_c2r through torch.fft), the
rotary-embedding and FNet patterns with their backward, and the fallback of complex ops
that have no tpu kernel.

Runs in whichever eager mode TORCHTPU_EAGER_MODE selects (strict, defer_and_fuse, debug)."""
import warnings

import pytest
import torch

import torchtpu
from op_helpers import close, native, no_cpu_fallback, tpu
from tolerances import tol

DEV = "tpu"
CDTYPES = [torch.complex64, torch.complex128]


def crand(*shape, dtype=torch.complex64, seed=0):
    g = torch.Generator().manual_seed(seed)
    real = torch.float64 if dtype == torch.complex128 else torch.float32
    return torch.complex(torch.randn(shape, generator=g, dtype=real), torch.randn(shape, generator=g, dtype=real))


def rrand(*shape, dtype=torch.float32, seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---- allocation, fills, copies ----------------------------------------------------------

@pytest.mark.parametrize("dtype", CDTYPES)
def test_host_roundtrip_exact(dtype):
    x = crand(3, 5, dtype=dtype)
    t = x.to(DEV)
    assert t.dtype == dtype and t.device.type == DEV
    assert torch.equal(t.cpu(), x)
    # strided sources both ways: a transposed CPU tensor, a sliced tpu tensor
    assert torch.equal(x.t().to(DEV).cpu(), x.t())
    assert torch.equal(t[:, 1::2].cpu(), x[:, 1::2])
    assert torch.equal(t.t().contiguous().cpu(), x.t().contiguous())


@pytest.mark.parametrize("dtype", CDTYPES)
def test_factories_and_fills(dtype):
    with no_cpu_fallback():
        z = torch.zeros(2, 3, dtype=dtype, device=DEV)
        o = torch.ones(2, 3, dtype=dtype, device=DEV)
        f = torch.full((2, 3), 1.5 - 2j, dtype=dtype, device=DEV)
        e = torch.empty(4, dtype=dtype, device=DEV).fill_(3)
        s = torch.zeros(3, dtype=dtype, device=DEV)
        s.fill_(torch.tensor(2 + 1j, dtype=dtype, device=DEV))
    assert torch.equal(z.cpu(), torch.zeros(2, 3, dtype=dtype))
    assert torch.equal(o.cpu(), torch.ones(2, 3, dtype=dtype))
    assert torch.equal(f.cpu(), torch.full((2, 3), 1.5 - 2j, dtype=dtype))
    assert torch.equal(e.cpu(), torch.full((4,), 3, dtype=dtype))
    assert torch.equal(s.cpu(), torch.full((3,), 2 + 1j, dtype=dtype))
    x = crand(2, 3, dtype=dtype).to(DEV)
    x.zero_()
    assert torch.equal(x.cpu(), torch.zeros(2, 3, dtype=dtype))


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("dst", CDTYPES)
def test_real_to_complex_on_device(src, dst):
    x = (rrand(4, 6) * 3).to(src)
    with no_cpu_fallback():
        y = x.to(DEV).to(dst)                  # _to_copy: a tpu -> tpu copy node
        ys = x.to(DEV).t().to(dst)             # strided source
    assert torch.equal(y.cpu(), x.to(dst))
    assert torch.equal(ys.cpu(), x.t().to(dst))


@pytest.mark.parametrize("dst", [torch.float32, torch.float64, torch.int64])
def test_complex_to_real_keeps_real_part(dst):
    x = crand(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = x.to(dst)
        with no_cpu_fallback():
            actual = x.to(DEV).to(dst)
    assert torch.equal(actual.cpu(), expected)


def test_complex_precision_casts():
    x = crand(5, dtype=torch.complex128)
    with no_cpu_fallback():
        a = x.to(DEV).to(torch.complex64)
        b = a.to(torch.complex128)
    assert torch.equal(a.cpu(), x.to(torch.complex64))
    assert torch.equal(b.cpu(), x.to(torch.complex64).to(torch.complex128))


def test_copy_into_strided_destination():
    x = crand(4, 3)
    d = torch.zeros(3, 4, dtype=torch.complex64, device=DEV)
    with no_cpu_fallback():
        d.t().copy_(x.to(DEV))
        d[:, 0].copy_(rrand(3).to(DEV))     # real into a complex column
    e = torch.zeros(3, 4, dtype=torch.complex64)
    e.t().copy_(x)
    e[:, 0].copy_(rrand(3))
    assert torch.equal(d.cpu(), e)


def test_conjugate_and_negative_bits_resolve_in_copies():
    x = crand(3, 4)
    t = x.to(DEV)
    with no_cpu_fallback():
        c = t.conj()
        assert c.is_conj()
        assert torch.equal(c.cpu(), x.conj())                       # tpu -> host
        assert torch.equal(c.resolve_conj().cpu(), x.conj().resolve_conj())  # tpu -> tpu
        assert torch.equal(c.clone().cpu(), x.conj())
        n = torch._neg_view(t)
        assert torch.equal(n.clone().cpu(), -x)
        assert torch.equal(n.cpu(), -x)
        # host -> tpu into a conjugated view: the stored bytes are the conjugate
        dst = torch.zeros(3, 4, dtype=torch.complex64, device=DEV)
        dst.conj().copy_(x)
        assert torch.equal(dst.cpu(), x.conj())
        # tpu -> tpu into a conjugated view
        dst2 = torch.zeros(3, 4, dtype=torch.complex64, device=DEV)
        dst2.conj().copy_(t)
        assert torch.equal(dst2.cpu(), x.conj())
    # a conjugated operand of arithmetic (ATen's conjugate fallback resolves it by a copy)
    y = crand(3, 4, seed=3)
    with native("mul"):
        r = t.conj() * y.to(DEV)
    close(r, x.conj() * y)


# ---- views ----------------------------------------------------------------------------------

def _meta(t):
    return t.dtype, tuple(t.shape), t.stride(), t.storage_offset()


@pytest.mark.parametrize("dtype", CDTYPES)
def test_view_as_real_and_complex_metadata(dtype):
    x = crand(4, 6, dtype=dtype)
    t = x.to(DEV)
    for view in [lambda a: a, lambda a: a[1:, ::2], lambda a: a.t(), lambda a: a[2]]:
        assert _meta(torch.view_as_real(view(t))) == _meta(torch.view_as_real(view(x)))
        assert torch.equal(torch.view_as_real(view(t)).cpu(), torch.view_as_real(view(x)))
    r = torch.view_as_real(x)
    rt = torch.view_as_real(t)
    for view in [lambda a: a, lambda a: a[1:], lambda a: a[:, 2:4]]:
        assert _meta(torch.view_as_complex(view(rt))) == _meta(torch.view_as_complex(view(r)))
        assert torch.equal(torch.view_as_complex(view(rt)).cpu(), torch.view_as_complex(view(r)))
    # the views share storage: writes through one show in the other
    rt[0, 0, 1] = 7.0
    assert t[0, 0].item() == complex(x[0, 0].real.item(), 7.0)


def test_view_as_complex_errors_like_cpu():
    base = rrand(4, 2)
    for make_bad in [lambda a: a[:, :1].reshape(2, 2)[:, :1], lambda a: a[:, :1], lambda a: a.t(),
                     lambda a: a.reshape(-1)[1:7].reshape(3, 2)]:
        with pytest.raises(RuntimeError) as cpu_err:
            torch.view_as_complex(make_bad(base))
        with pytest.raises(RuntimeError) as tpu_err:
            torch.view_as_complex(make_bad(base.to(DEV)))
        assert str(cpu_err.value).split("\n")[0] == str(tpu_err.value).split("\n")[0]
    with pytest.raises(RuntimeError, match="conjugated"):
        torch.view_as_real(crand(3).to(DEV).conj())


def test_real_and_imag_are_views():
    x = crand(3, 4)
    t = x.to(DEV)
    assert torch.equal(t.real.cpu(), x.real) and torch.equal(t.imag.cpu(), x.imag)
    assert _meta(t.real) == _meta(x.real) and _meta(t.imag) == _meta(x.imag)
    with no_cpu_fallback():
        t.real.mul_(2)
        t.imag.zero_()
    assert torch.equal(t.cpu(), torch.complex(x.real * 2, torch.zeros_like(x.imag)))


# ---- elementwise ----------------------------------------------------------------------------

BINARY = [torch.add, torch.sub, torch.mul, torch.div]


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("op", BINARY, ids=lambda f: f.__name__)
def test_binary_complex(op, dtype):
    x, y = crand(4, 5, dtype=dtype), crand(5, dtype=dtype, seed=2)
    with native(op.__name__):
        close(op(*tpu(x, y)), op(x, y))                        # broadcasting
        close(op(*tpu(x.t().contiguous().t(), y)), op(x, y))   # non-contiguous
        r = rrand(4, 5, dtype=torch.float64 if dtype == torch.complex128 else torch.float32)
        close(op(*tpu(x, r)), op(x, r))                        # complex with real tensor
        close(op(*tpu(r, x)), op(r, x))
        close(op(tpu(x), 1.5), op(x, 1.5))                     # Python numbers
        close(op(tpu(x), 0.5 - 2j), op(x, 0.5 - 2j))
        close(op(tpu(r), 0.5 - 2j), op(r, 0.5 - 2j))           # real tensor, complex number
        a = tpu(x).clone()
        getattr(a, op.__name__ + "_")(tpu(y))                  # in-place
        close(a, op(x, y))
        out = torch.empty(0, dtype=dtype, device=DEV)
        op(*tpu(x, y), out=out)                                # out=
        close(out, op(x, y))


def test_add_sub_alpha_complex():
    x, y = crand(6), crand(6, seed=4)
    with native("add", "sub"):
        close(torch.add(*tpu(x, y), alpha=2 - 1j), torch.add(x, y, alpha=2 - 1j))
        close(torch.sub(*tpu(x, y), alpha=0.5), torch.sub(x, y, alpha=0.5))


def test_inplace_real_self_complex_other_raises_like_cpu():
    r, x = rrand(3), crand(3)
    with pytest.raises(RuntimeError):
        r.clone().mul_(x)
    with pytest.raises(RuntimeError):
        tpu(r).mul_(tpu(x))


@pytest.mark.parametrize("dtype", CDTYPES)
def test_unary_complex(dtype):
    x = crand(3, 7, dtype=dtype)
    x[0, 0] = 0
    with native("neg", "abs", "angle", "sgn", "conj_physical", "_conj_physical"):
        close(torch.neg(tpu(x)), -x)
        close(torch.abs(tpu(x)), torch.abs(x))
        close(torch.angle(tpu(x)), torch.angle(x))
        close(torch.sgn(tpu(x)), torch.sgn(x))
        close(torch.conj_physical(tpu(x)), torch.conj_physical(x))
        a = tpu(x).clone()
        a.conj_physical_()
        close(a, torch.conj_physical(x))
        close(torch.abs(tpu(x).t()), torch.abs(x.t()))
    with pytest.raises(RuntimeError, match="In-place abs is not supported for complex tensors"):
        tpu(x).abs_()


def test_angle_of_real():
    r = torch.tensor([-2.0, -0.0, 0.0, 3.0, float("nan"), float("-inf")])
    with native("angle"), torchtpu.set_debug_options(nan="off"):  # NaN/Inf inputs on purpose
        close(torch.angle(tpu(r)), torch.angle(r))
        close(torch.angle(tpu(torch.tensor([-2, 0, 5]))), torch.angle(torch.tensor([-2, 0, 5])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_polar_and_complex(dtype):
    a, t = rrand(4, 5, dtype=dtype).abs(), rrand(5, dtype=dtype, seed=2) * 3
    with native("polar", "complex"):
        close(torch.polar(*tpu(a, t)), torch.polar(a, t))
        close(torch.complex(*tpu(a, t)), torch.complex(a, t))
        out = torch.empty(0, dtype=torch.polar(a, t).dtype, device=DEV)
        torch.polar(*tpu(a, t), out=out)
        close(out, torch.polar(a, t))
    with pytest.raises(RuntimeError):
        torch.polar(a.double().to(DEV), t.float().to(DEV))


# ---- FFT ------------------------------------------------------------------------------------

def fclose(actual, expected):
    """FFT results: an FFT's rounding error is bounded relative to the norm of the whole
    signal (about eps log n |x|), not to each output element, and CPU's pocketfft rounds
    in the part dtype; so the table's atol grows with the largest output magnitude (by the
    table's rtol), and the table's rtol stays as it is."""
    kw = tol(expected.dtype)
    scale = 1.0 + expected.abs().max().item() if expected.numel() else 1.0
    assert actual.device.type == DEV and actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected, rtol=kw["rtol"], atol=kw["atol"] + kw["rtol"] * scale)


# powers of two (radix-2), smooth others (mixed radix: 5, 12 = 4 * 3, 100, 96 = 4 * 4 * 2 * 3),
# lengths with a prime factor above 64 (Bluestein: 127, 134 = 2 * 67), and 1
LENGTHS = [1, 2, 5, 8, 12, 64, 96, 100, 127, 134, 256]
NORMS = [None, "ortho", "forward"]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("norm", NORMS)
def test_fft_ifft_c2c(n, norm):
    x = crand(3, n)
    with native("_fft_c2c"):
        fclose(torch.fft.fft(tpu(x), norm=norm), torch.fft.fft(x, norm=norm))
        fclose(torch.fft.ifft(tpu(x), norm=norm), torch.fft.ifft(x, norm=norm))


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("norm", NORMS)
def test_rfft_irfft(n, norm):
    r = rrand(2, n)
    with native("_fft_r2c", "_fft_c2r"):
        fclose(torch.fft.rfft(tpu(r), norm=norm), torch.fft.rfft(r, norm=norm))
        fclose(torch.fft.fft(tpu(r), norm=norm), torch.fft.fft(r, norm=norm))   # r2c, two-sided
        h = torch.fft.rfft(r)
        fclose(torch.fft.irfft(tpu(h), n=n, norm=norm), torch.fft.irfft(h, n=n, norm=norm))
        # a spectrum longer than n // 2 + 1 (irfft's n smaller than 2 (m - 1))
        fclose(torch.fft.irfft(tpu(h), n=max(1, n // 2), norm=norm), torch.fft.irfft(h, n=max(1, n // 2), norm=norm))


@pytest.mark.parametrize("dim", [(0,), (1,), (-1,), (0, 2), (1, 2), (2, 0), None])
def test_fftn_dims(dim):
    r = rrand(6, 7, 10)
    x = crand(6, 7, 10)
    with native("_fft_r2c", "_fft_c2c", "_fft_c2r"):
        fclose(torch.fft.fftn(tpu(r), dim=dim), torch.fft.fftn(r, dim=dim))
        fclose(torch.fft.fftn(tpu(x), dim=dim, norm="ortho"), torch.fft.fftn(x, dim=dim, norm="ortho"))
        fclose(torch.fft.ifftn(tpu(x), dim=dim), torch.fft.ifftn(x, dim=dim))
        fclose(torch.fft.rfftn(tpu(r), dim=dim), torch.fft.rfftn(r, dim=dim))
        fclose(torch.fft.irfftn(tpu(x), dim=dim), torch.fft.irfftn(x, dim=dim))


def test_fft_strided_and_double():
    x = crand(8, 12, dtype=torch.complex128)
    r = rrand(12, 8, dtype=torch.float64)
    with native("_fft_r2c", "_fft_c2c", "_fft_c2r"):
        fclose(torch.fft.fft(tpu(x).t(), dim=0), torch.fft.fft(x.t(), dim=0))
        fclose(torch.fft.fft(tpu(x)[:, 1::2]), torch.fft.fft(x[:, 1::2]))
        fclose(torch.fft.rfft(tpu(r).t()), torch.fft.rfft(r.t()))
        fclose(torch.fft.irfft(tpu(x)[::2]), torch.fft.irfft(x[::2]))
        fclose(torch.fft.fft2(tpu(r)), torch.fft.fft2(r))


def test_fft_out_and_errors():
    x = crand(4, 9)
    out = torch.empty(0, dtype=torch.complex64, device=DEV)
    with native("_fft_c2c"):
        torch.fft.fft(tpu(x), out=out)
    fclose(out, torch.fft.fft(x))
    with pytest.raises(RuntimeError):
        torch.fft.fft(tpu(x), n=0)
    with pytest.raises(RuntimeError):
        torch.ops.aten._fft_c2c(tpu(x), [0, 0], 0, True)


# ---- the models' patterns, with backward ---------------------------------------------------

def _rotary(xq, freqs):  # Llama4 / DeepseekV2 apply_rotary_emb
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    return torch.view_as_real(xq_ * freqs[:, :, None, :]).flatten(3).type_as(xq)


def test_rotary_embedding_forward_and_backward():
    pos = torch.arange(6.0)[None]
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    xq = rrand(1, 6, 3, 8).requires_grad_()

    def run(xq, pos, inv):
        freqs = pos[..., None] * inv
        cis = torch.polar(torch.ones_like(freqs), freqs) * 1.0
        return _rotary(xq, cis)

    g = rrand(1, 6, 3, 8, seed=5)
    out = run(xq, pos, inv)
    (gx,) = torch.autograd.grad(out, xq, g)
    with no_cpu_fallback():
        xt = tpu(xq)
        out_t = run(xt, *tpu(pos, inv))
        (gx_t,) = torch.autograd.grad(out_t, xt, g.to(DEV))
    close(out_t, out)
    close(gx_t, gx)


def test_fnet_fourier_forward_and_backward():
    h = rrand(2, 7, 16).requires_grad_()
    g = rrand(2, 7, 16, seed=6)
    out = torch.fft.fftn(h, dim=(1, 2)).real
    (gh,) = torch.autograd.grad(out, h, g)
    with no_cpu_fallback():
        ht = tpu(h)
        out_t = torch.fft.fftn(ht, dim=(1, 2)).real
        (gh_t,) = torch.autograd.grad(out_t, ht, g.to(DEV))
    close(out_t, out)
    close(gh_t, gh, scale=2)  # sums of 112 terms on both sides


def test_rfft_irfft_backward():
    r = rrand(3, 10).requires_grad_()
    g = rrand(3, 10, seed=7)
    out = torch.fft.irfft(torch.fft.rfft(r) * 2, n=10)
    (gr,) = torch.autograd.grad(out, r, g)
    with no_cpu_fallback():
        rt = tpu(r)
        out_t = torch.fft.irfft(torch.fft.rfft(rt) * 2, n=10)
        (gr_t,) = torch.autograd.grad(out_t, rt, g.to(DEV))
    close(out_t, out)
    close(gr_t, gr)


# ---- fallback and fusion safety ------------------------------------------------------------

def test_unsupported_complex_op_falls_back_with_warning():
    x = crand(3, 4)
    torchtpu.reset_fallback_report()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        r = torch.exp(tpu(x))
    close(r, torch.exp(x))
    assert any("exp" in k for k in torchtpu.fallback_report()), torchtpu.fallback_report()
    old = torchtpu.get_fallback()
    torchtpu.set_fallback("error")
    try:
        with pytest.raises(NotImplementedError, match="exp.*complex dtypes.*ComplexFloat"):
            torch.exp(tpu(x))
            torch.tpu.synchronize()
    finally:
        torchtpu.set_fallback(old)


def test_real_and_complex_ops_in_one_graph():
    """In defer_and_fuse, real elementwise chains around complex ops still fuse among
    themselves; the complex ops run as their own kernels (results match either way)."""
    r = rrand(4, 16)
    z = crand(4, 16)

    def f(r, z):
        a = (r * 2 + 1).sigmoid()
        c = a.to(torch.complex64) * z + z
        return (c.real * 3 - c.imag).relu() + a

    expected = f(r, z)
    with no_cpu_fallback():
        actual = f(*tpu(r, z))
    close(actual, expected)


def test_complex_kernels_are_never_fused():
    """The fused tile loop computes in real dtypes only: the driver must report every
    complex op as not fusable (defer_and_fuse then runs it as its own kernel), while the
    real ops around it stay fusable."""
    r, z = tpu(rrand(4, 8), crand(4, 8))
    with torchtpu.eager_mode("debug"):
        torchtpu.trace(clear=True)
        a = r * 2 + 1
        c = a.to(torch.complex64) * z
        d = c + z
        e = torch.angle(d) - a
        torch.tpu.synchronize()
        rec = torchtpu.trace(clear=True)
    ops = [(t["op"], t["shapes"], t["fusable"]) for t in rec]
    complex_ops = [o for o in ops if "complex" in o[1]]
    real_ops = [o for o in ops if "complex" not in o[1]]
    assert len(complex_ops) >= 4, ops   # the cast, mul, add, angle
    assert not any(f for _, _, f in complex_ops), ops
    assert any(f for _, _, f in real_ops), ops
    close(e, torch.angle(a.cpu().to(torch.complex64) * z.cpu() + z.cpu()) - a.cpu())


@pytest.mark.parametrize("dtype", CDTYPES)
def test_data_movement_ops(dtype):
    """Shape and index ops that only move elements take complex tensors as they are."""
    x, y = crand(4, 5, dtype=dtype), crand(2, 5, dtype=dtype, seed=8)
    r = rrand(3, 5, dtype=torch.float64 if dtype == torch.complex128 else torch.float32)
    idx = torch.tensor([3, 0, 3, 1])
    cases = [
        ("cat", lambda a, b, c: torch.cat([a, b])),
        ("cat", lambda a, b, c: torch.cat([a, c])),            # promotes the real part
        ("cat", lambda a, b, c: torch.stack([a[:2], b], dim=1)),
        ("index_select", lambda a, b, c: a.index_select(0, idx.to(a.device))),
        ("index", lambda a, b, c: a[idx.to(a.device)]),
        ("flip", lambda a, b, c: a.flip(1)),
        ("roll", lambda a, b, c: a.roll(2, 1)),
        ("repeat", lambda a, b, c: a.repeat(2, 1)),
        ("tril", lambda a, b, c: a.tril()),
        ("triu", lambda a, b, c: a.triu(1)),
        ("constant_pad_nd", lambda a, b, c: torch.nn.functional.pad(a, (1, 2))),
        ("constant_pad_nd", lambda a, b, c: torch.constant_pad_nd(a, (0, 1, 1, 0), 2 - 3j)),
    ]
    for name, fn in cases:
        with native(name):
            close(fn(*tpu(x, y, r)), fn(x, y, r))
    with native("_fft_c2c", "constant_pad_nd"):
        fclose(torch.fft.fft(tpu(x), n=9), torch.fft.fft(x, n=9))


@pytest.mark.parametrize("dtype", CDTYPES)
def test_sum_mean(dtype):
    x = crand(3, 4, 5, dtype=dtype)
    with native("sum", "mean"):
        for dim, keep in [(None, False), (0, False), ((0, 2), True), (-1, True), ((), False)]:
            kw = {} if dim is None else dict(dim=dim, keepdim=keep)
            close(torch.sum(tpu(x), **kw), torch.sum(x, **kw))
            close(torch.mean(tpu(x), **kw), torch.mean(x, **kw))
        close(tpu(x).transpose(0, 2).sum(0), x.transpose(0, 2).sum(0))
        close(torch.sum(tpu(x)[:, :0], 1), torch.sum(x[:, :0], 1))
    # the broadcast reduction of a complex gradient (a complex operand that requires grad)
    f = crand(5, dtype=dtype).requires_grad_()
    z = crand(3, 5, dtype=dtype, seed=9)
    g = crand(3, 5, dtype=dtype, seed=10)
    (gf,) = torch.autograd.grad(z * f, f, g)
    with no_cpu_fallback():
        ft = tpu(f)
        (gft,) = torch.autograd.grad(tpu(z) * ft, ft, g.to(DEV))
    close(gft, gf)


def test_complex_values_into_real_tensors_behave_like_cpu():
    """A complex number filled into a real tensor, and real operands with a complex out=,
    take the CPU path (same result or same exception as CPU)."""
    for fn in [lambda t: t.fill_(2 + 0j), lambda t: t.fill_(1j)]:
        try:
            expected = fn(torch.zeros(3))
        except Exception as e:  # noqa: BLE001  the class is what we compare
            with pytest.raises(type(e)):
                fn(torch.zeros(3, device=DEV))
                torch.tpu.synchronize()
            continue
        close(fn(torch.zeros(3, device=DEV)), expected)
    a, b = (rrand(4) * 3).bfloat16(), (rrand(4, seed=3) * 3).bfloat16()
    out_c = torch.empty(4, dtype=torch.complex64)
    torch.mul(a, b, out=out_c)
    out_t = torch.empty(4, dtype=torch.complex64, device=DEV)
    torch.mul(*tpu(a, b), out=out_t)
    assert torch.equal(out_t.cpu(), out_c)
