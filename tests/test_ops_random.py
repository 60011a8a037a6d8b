"""Random family on tpu: distributions, random_, randperm, multinomial, dropout.

The tpu generator is Philox (libtpurt), not CPU's mt19937, so values cannot be compared
with CPU. These tests check what must hold anyway: ranges, moments over 1e5 samples
(bounds several standard errors wide), reproducibility under torch.manual_seed and
explicit Generators, independence of the output's strides, and CPU's exception type for
bad arguments. Each test also asserts its ops ran natively (no CPU fallback)."""
import math

import pytest
import torch
import torch.nn.functional as F

import torchtpu

DEV = "tpu"
N = 100_000
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int64, torch.int32, torch.int8, torch.uint8]
ALL = FLOATS + INTS + [torch.bool]

MY_OPS = {
    "uniform_", "normal_", "normal.Tensor_float", "normal.Tensor_float_out", "normal.float_Tensor",
    "normal.float_Tensor_out", "normal.Tensor_Tensor", "normal.Tensor_Tensor_out",
    "bernoulli_.float", "bernoulli_.Tensor", "bernoulli", "bernoulli.out", "random_",
    "random_.to", "random_.from", "exponential_", "log_normal_", "geometric_", "cauchy_",
    "randperm.generator_out", "multinomial", "multinomial.out", "native_dropout",
    "native_dropout_backward",
}


@pytest.fixture(autouse=True)
def native_only(request):
    """The family's ops must not go through the CPU fallback. Error tests are exempt: a
    builder that rejects a dtype with NotImplementedError hands the call to the fallback,
    which then raises CPU's own error."""
    torchtpu.reset_fallback_report()
    yield
    if request.node.name.endswith("errors"):
        return
    torch.tpu.synchronize()
    used = {k.split("::")[-1] for k in torchtpu.fallback_report()}
    assert not (used & MY_OPS), f"random ops ran through the CPU fallback: {used & MY_OPS}"


def host(t):
    return t.cpu().double()


def moments(t):
    x = host(t).flatten()
    return x.mean().item(), x.var().item()


def same_error(fn_cpu, fn_tpu):
    """Both raise, with the same exception class."""
    with pytest.raises(Exception) as ec:
        fn_cpu()
    with pytest.raises(type(ec.value)):
        fn_tpu()
        torch.tpu.synchronize()


# ---- uniform_ --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_uniform_range_and_moments(dtype):
    x = torch.empty(N, device=DEV, dtype=dtype).uniform_(-2, 3)
    h = host(x)
    assert h.min() >= -2 and h.max() < 3
    assert h.min() < -1.9 and h.max() > 2.9
    m, v = moments(x)
    assert abs(m - 0.5) < 0.05 and abs(v - 25 / 12) < 0.1


def test_uniform_narrow_dtype_stays_half_open():
    x = torch.empty(N, device=DEV, dtype=torch.bfloat16).uniform_(0.99, 1.0)
    assert host(x).max() < 1.0


def test_uniform_errors():
    same_error(lambda: torch.empty(3).uniform_(2, 1), lambda: torch.empty(3, device=DEV).uniform_(2, 1))
    same_error(lambda: torch.empty(3, dtype=torch.int64).uniform_(),
               lambda: torch.empty(3, device=DEV, dtype=torch.int64).uniform_())
    same_error(lambda: torch.empty(3, dtype=torch.float16).uniform_(0, 1e6),
               lambda: torch.empty(3, device=DEV, dtype=torch.float16).uniform_(0, 1e6))


# ---- reproducibility and strides -------------------------------------------------------

def test_manual_seed_reproduces_and_seeds_differ():
    torch.manual_seed(123)
    a = torch.empty(1000, device=DEV).normal_()
    torch.manual_seed(123)
    b = torch.empty(1000, device=DEV).normal_()
    c = torch.empty(1000, device=DEV).normal_()  # the generator advanced
    torch.manual_seed(124)
    d = torch.empty(1000, device=DEV).normal_()
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(b.cpu(), c.cpu())
    assert not torch.equal(a.cpu(), d.cpu())


def test_explicit_generator():
    g = torch.Generator(device=DEV)
    g.manual_seed(7)
    a = torch.empty(500, device=DEV).uniform_(generator=g)
    g.manual_seed(7)
    b = torch.empty(500, device=DEV).uniform_(generator=g)
    assert torch.equal(a.cpu(), b.cpu())


def test_non_contiguous_output_fills_in_logical_order():
    torch.manual_seed(5)
    a = torch.empty(64, 48, device=DEV).uniform_()
    torch.manual_seed(5)
    base = torch.zeros(48, 64, device=DEV)
    t = base.t()
    t.uniform_()
    assert torch.equal(a.cpu(), t.cpu())
    # a strided slice: only its elements change
    torch.manual_seed(5)
    big = torch.full((10, 10), -1.0, device=DEV)
    big[:, ::2].uniform_()
    h = big.cpu()
    assert (h[:, 1::2] == -1).all() and (h[:, ::2] >= 0).all() and (h[:, ::2] < 1).all()


# ---- normal ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_normal_moments(dtype):
    x = torch.empty(N, device=DEV, dtype=dtype).normal_(3.0, 2.0)
    m, v = moments(x)
    assert abs(m - 3) < 0.05 and abs(v - 4) < 0.15


def test_normal_tensor_forms():
    mean = torch.tensor([[10.0], [-10.0]], device=DEV)
    std = torch.tensor([0.0, 1.0, 0.0], device=DEV, dtype=torch.float64)
    y = torch.normal(mean, std)
    assert y.shape == (2, 3) and y.dtype == torch.float32
    h = y.cpu()
    assert h[0, 0] == 10 and h[1, 2] == -10 and h[0, 1] != 10
    out = torch.empty(2, 3, device=DEV, dtype=torch.float64)
    torch.normal(mean, std, out=out)
    assert out.cpu()[1, 0] == -10
    z = torch.normal(torch.full((N,), 1.0, device=DEV), 0.5)
    m, v = moments(z)
    assert abs(m - 1) < 0.02 and abs(v - 0.25) < 0.02
    w = torch.normal(2.0, torch.full((N,), 3.0, device=DEV))
    m, v = moments(w)
    assert abs(m - 2) < 0.1 and abs(v - 9) < 0.4
    outw = torch.empty(N, device=DEV)
    torch.normal(2.0, torch.full((N,), 3.0, device=DEV), out=outw)
    assert abs(moments(outw)[0] - 2) < 0.1


def test_normal_errors():
    same_error(lambda: torch.empty(3).normal_(0, -1), lambda: torch.empty(3, device=DEV).normal_(0, -1))
    same_error(lambda: torch.empty(3, dtype=torch.int64).normal_(),
               lambda: torch.empty(3, device=DEV, dtype=torch.int64).normal_())
    same_error(lambda: torch.normal(torch.zeros(2), torch.ones(3)),
               lambda: torch.normal(torch.zeros(2, device=DEV), torch.ones(3, device=DEV)))
    same_error(lambda: torch.normal(0.0, -torch.ones(3)), lambda: torch.normal(0.0, -torch.ones(3, device=DEV)))


# ---- bernoulli -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL)
def test_bernoulli_scalar_p(dtype):
    x = torch.empty(N, device=DEV, dtype=dtype).bernoulli_(0.3)
    h = host(x)
    assert ((h == 0) | (h == 1)).all()
    assert abs(h.mean().item() - 0.3) < 0.01


@pytest.mark.parametrize("dtype", FLOATS)
def test_bernoulli_tensor_p_and_functional(dtype):
    p = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0], device=DEV, dtype=dtype)
    assert torch.equal(torch.bernoulli(p).cpu(), p.cpu())
    assert torch.bernoulli(p).dtype == dtype
    x = torch.empty(5, device=DEV, dtype=torch.int64).bernoulli_(p)
    assert x.cpu().tolist() == [0, 1, 0, 1, 1]
    out = torch.empty(5, device=DEV, dtype=torch.bool)
    torch.bernoulli(p, out=out)
    assert out.cpu().tolist() == [False, True, False, True, True]
    # broadcast p of shape (1,), non-contiguous self
    big = torch.zeros(200, 300, device=DEV, dtype=dtype)
    big.t().bernoulli_(torch.tensor([0.25], device=DEV, dtype=dtype))
    assert abs(host(big).mean().item() - 0.25) < 0.02
    half = torch.full((N,), 0.5, device=DEV, dtype=dtype)
    assert abs(host(torch.bernoulli(half)).mean().item() - 0.5) < 0.01


def test_bernoulli_errors():
    same_error(lambda: torch.empty(3).bernoulli_(1.5), lambda: torch.empty(3, device=DEV).bernoulli_(1.5))
    same_error(lambda: torch.empty(5).bernoulli_(torch.full((3,), 0.5)),
               lambda: torch.empty(5, device=DEV).bernoulli_(torch.full((3,), 0.5, device=DEV)))
    same_error(lambda: torch.bernoulli(torch.ones(3, dtype=torch.int64)),
               lambda: torch.bernoulli(torch.ones(3, dtype=torch.int64, device=DEV)))
    same_error(lambda: torch.bernoulli(torch.full((3,), 2.0)),
               lambda: torch.bernoulli(torch.full((3,), 2.0, device=DEV)))


# ---- random_ ---------------------------------------------------------------------------

DEFAULT_HI = {torch.float32: 2 ** 24, torch.bfloat16: 2 ** 8, torch.float16: 2 ** 11, torch.float64: 2 ** 53,
              torch.int64: 2 ** 63 - 1, torch.int32: 2 ** 31 - 1, torch.int8: 127, torch.uint8: 255, torch.bool: 1}


@pytest.mark.parametrize("dtype", ALL)
def test_random_default_range(dtype):
    x = torch.empty(N, device=DEV, dtype=dtype).random_()
    h = x.cpu().to(torch.float64) if dtype != torch.int64 else x.cpu()
    assert h.min() >= 0 and h.max() <= DEFAULT_HI[dtype]
    assert (h == h.floor()).all()
    assert h.max() >= 0.99 * DEFAULT_HI[dtype] if dtype != torch.int64 else h.max() > 2 ** 62


@pytest.mark.parametrize("dtype", [d for d in ALL if d != torch.bool])
def test_random_from_to(dtype):
    lo = 0 if dtype == torch.uint8 else -3
    x = torch.empty(N, device=DEV, dtype=dtype).random_(lo, lo + 7)
    h = x.cpu().to(torch.int64)
    assert sorted(h.unique().tolist()) == list(range(lo, lo + 7))
    counts = torch.bincount(h - lo).double()
    assert ((counts / (N / 7) - 1).abs() < 0.1).all()
    y = torch.empty(N, device=DEV, dtype=dtype).random_(5)
    assert sorted(y.cpu().to(torch.int64).unique().tolist()) == [0, 1, 2, 3, 4]


def test_random_from_to_none_and_full_range():
    x = torch.empty(N, device=DEV, dtype=torch.int8).random_(100, None)
    h = x.cpu()
    assert h.min() == 100 and h.max() == 127
    y = torch.empty(N, device=DEV, dtype=torch.int64).random_(-2 ** 63, None)
    neg = (y.cpu() < 0).double().mean().item()
    assert 0.45 < neg < 0.55
    b = torch.empty(100, device=DEV, dtype=torch.bool).random_(0, 2)
    assert set(b.cpu().tolist()) == {False, True}


def test_random_errors():
    for dt, a, b in [(torch.float32, 5, 3), (torch.uint8, 0, 300), (torch.uint8, -1, 5),
                     (torch.int8, -129, 0), (torch.bool, 0, 3), (torch.float16, 0, 70000)]:
        same_error(lambda: torch.empty(3, dtype=dt).random_(a, b),
                   lambda: torch.empty(3, device=DEV, dtype=dt).random_(a, b))
    same_error(lambda: torch.empty(3, dtype=torch.float16).random_(2048, None),
               lambda: torch.empty(3, device=DEV, dtype=torch.float16).random_(2048, None))
    for dt in (torch.float16, torch.int32):
        same_error(lambda: torch.empty(3, dtype=dt).random_(-2 ** 63, None),
                   lambda: torch.empty(3, device=DEV, dtype=dt).random_(-2 ** 63, None))


# ---- exponential_, log_normal_, geometric_, cauchy_ -----------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_continuous_distributions(dtype):
    e = torch.empty(N, device=DEV, dtype=dtype).exponential_(2.0)
    m, v = moments(e)
    assert host(e).min() >= 0 and abs(m - 0.5) < 0.01 and abs(v - 0.25) < 0.015
    ln = torch.empty(N, device=DEV, dtype=dtype).log_normal_(0.0, 0.5)
    assert abs(host(ln).log().mean().item()) < 0.02
    c = torch.empty(N, device=DEV, dtype=dtype).cauchy_(1.0, 2.0)
    h = host(c)
    assert abs((h < 1).double().mean().item() - 0.5) < 0.01
    assert abs(((h > -1) & (h < 3)).double().mean().item() - 0.5) < 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
def test_geometric(dtype):
    g = torch.empty(N, device=DEV, dtype=dtype).geometric_(0.25)
    h = host(g)
    assert h.min() >= 1 and (h == h.floor()).all()
    m, v = moments(g)
    assert abs(m - 4) < 0.1 and abs(v - 12) < 0.8


def test_distribution_errors():
    for f in [lambda t: t.exponential_(0), lambda t: t.log_normal_(0, 0), lambda t: t.geometric_(1.0),
              lambda t: t.cauchy_(0, -1)]:
        same_error(lambda: f(torch.empty(3)), lambda: f(torch.empty(3, device=DEV)))
    for f in [lambda t: t.exponential_(), lambda t: t.log_normal_(), lambda t: t.cauchy_()]:
        same_error(lambda: f(torch.empty(3, dtype=torch.int64)),
                   lambda: f(torch.empty(3, device=DEV, dtype=torch.int64)))
    same_error(lambda: torch.empty(3, dtype=torch.bool).geometric_(0.5),
               lambda: torch.empty(3, device=DEV, dtype=torch.bool).geometric_(0.5))


# ---- randperm --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,n", [(torch.int64, 5000), (torch.int32, 1000), (torch.float32, 1000),
                                     (torch.float16, 2049), (torch.bfloat16, 257), (torch.int8, 128),
                                     (torch.uint8, 256), (torch.float64, 3)])
def test_randperm_is_permutation(dtype, n):
    p = torch.randperm(n, device=DEV, dtype=dtype)
    assert p.dtype == dtype and p.shape == (n,)
    assert torch.equal(p.cpu().to(torch.int64).sort().values, torch.arange(n))


def test_randperm_reproducible_and_uniform():
    g = torch.Generator(device=DEV)
    g.manual_seed(3)
    a = torch.randperm(100, device=DEV, generator=g)
    g.manual_seed(3)
    b = torch.randperm(100, device=DEV, generator=g)
    assert torch.equal(a.cpu(), b.cpu())
    first = torch.stack([torch.randperm(4, device=DEV) for _ in range(2000)]).cpu()[:, 0]
    counts = torch.bincount(first, minlength=4).double()
    assert ((counts / 500 - 1).abs() < 0.2).all()
    out = torch.empty(7, device=DEV, dtype=torch.int64)
    torch.randperm(7, out=out)
    assert sorted(out.cpu().tolist()) == list(range(7))
    assert torch.randperm(0, device=DEV).shape == (0,)


def test_randperm_errors():
    same_error(lambda: torch.randperm(3000, dtype=torch.float16),
               lambda: torch.randperm(3000, dtype=torch.float16, device=DEV))
    same_error(lambda: torch.randperm(300, dtype=torch.int8), lambda: torch.randperm(300, dtype=torch.int8, device=DEV))
    same_error(lambda: torch.randperm(5, dtype=torch.bool), lambda: torch.randperm(5, dtype=torch.bool, device=DEV))


# ---- multinomial -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_multinomial(dtype):
    p = torch.tensor([[0.0, 1.0, 0.0, 3.0], [1.0, 1.0, 1.0, 1.0]], device=DEV, dtype=dtype)
    s = torch.multinomial(p, 20000, replacement=True)
    assert s.dtype == torch.int64 and s.shape == (2, 20000)
    c0 = torch.bincount(s.cpu()[0], minlength=4)
    c1 = torch.bincount(s.cpu()[1], minlength=4).double()
    assert c0[0] == 0 and c0[2] == 0 and 14500 < c0[3] < 15500
    assert ((c1 / 5000 - 1).abs() < 0.1).all()
    w = torch.multinomial(p, 4).cpu()
    assert set(w[0, :2].tolist()) == {1, 3} and set(w[0, 2:].tolist()) == {0, 2}
    assert sorted(w[1].tolist()) == [0, 1, 2, 3]
    one = torch.multinomial(p[1], 1)
    assert one.shape == (1,)
    out = torch.empty(0, device=DEV, dtype=torch.int64)
    torch.multinomial(p, 3, out=out)
    assert out.shape == (2, 3)


def test_multinomial_errors():
    cases = [(torch.ones(3), 4, False), (torch.ones(3), 0, False), (torch.ones(3, dtype=torch.int64), 1, False),
             (torch.ones(2, 2, 3), 1, False), (torch.tensor([1.0, -1.0]), 1, False),
             (torch.tensor([1.0, -1.0]), 3, True), (torch.tensor([0.0, 0.0]), 1, False),
             (torch.tensor([1.0, float("inf")]), 3, True)]
    for p, n, r in cases:
        same_error(lambda: torch.multinomial(p, n, r), lambda: torch.multinomial(p.to(DEV), n, r))


# ---- dropout ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_native_dropout_and_backward(dtype):
    x = (torch.arange(N, dtype=torch.float64) % 7 + 1).to(dtype).to(DEV).requires_grad_()
    y, mask = torch.native_dropout(x, 0.25, True)
    assert mask.dtype == torch.bool and y.dtype == dtype
    m = mask.cpu()
    assert abs(m.double().mean().item() - 0.75) < 0.01
    want = torch.where(m, x.detach().cpu().double() / 0.75, 0.0)
    tol = 1e-6 if dtype in (torch.float32, torch.float64) else 1e-2
    assert torch.allclose(host(y), want, rtol=tol)
    (g,) = torch.autograd.grad(y, x, torch.full_like(y, 3.0))
    assert torch.allclose(host(g), torch.where(m, 4.0, 0.0).double(), rtol=tol)
    ye, me = torch.native_dropout(x, 0.25, False)
    assert torch.equal(ye.cpu(), x.detach().cpu()) and me.cpu().all()


def test_functional_dropout_and_errors():
    x = torch.ones(1000, 100, device=DEV)
    y = F.dropout(x, 0.5, training=True)
    h = y.cpu()
    assert set(h.unique().tolist()) <= {0.0, 2.0} and abs((h == 0).double().mean().item() - 0.5) < 0.02
    assert torch.equal(torch.native_dropout(x, 1.0, True)[0].cpu(), torch.zeros(1000, 100))
    same_error(lambda: torch.native_dropout(torch.ones(4), 1.5, True),
               lambda: torch.native_dropout(torch.ones(4, device=DEV), 1.5, True))
    same_error(lambda: torch.native_dropout(torch.ones(4, dtype=torch.int64), 0.5, True),
               lambda: torch.native_dropout(torch.ones(4, dtype=torch.int64, device=DEV), 0.5, True))
    g = torch.ops.aten.native_dropout_backward(torch.full((1,), 3.0, device=DEV),
                                               torch.tensor([True, False, True], device=DEV), 2.0)
    assert g.cpu().tolist() == [6.0, 0.0, 6.0]
