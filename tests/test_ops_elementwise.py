"""Elementwise ops on tpu against PyTorch CPU: every dtype, functional / in-place / out=,
broadcasting, non-contiguous inputs, backward, and the exception type of errors.

Each check runs the same call on CPU tensors and on tpu copies. When CPU raises, tpu must
raise the same exception class; otherwise results must match within the shared tolerance
table, and none of this family's ops may have gone through the CPU fallback."""
import math

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from tolerances import tol

A = torch.ops.aten
DEV = "tpu"
ALL_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64,
              torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool]
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _native_names():
    return {n.split(".")[0] for n in torchtpu.native_ops()}


def make(shape, dtype, lo=-3.0, hi=3.0, seed=0, nonzero=False):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        t = torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo
        if nonzero:
            t = torch.where(t.abs() < 0.1, torch.full_like(t, 0.5), t)
        return t.to(dtype)
    ilo = 0 if dtype == torch.uint8 else int(math.floor(lo))
    t = torch.randint(ilo, max(int(math.ceil(hi)), ilo + 1) + 1, shape, generator=g)
    if nonzero:
        t = torch.where(t == 0, torch.ones_like(t), t)
    return t.to(dtype)


def to_dev(x):
    return x.to(DEV) if isinstance(x, torch.Tensor) else x


def compare(actual, expected):
    if isinstance(expected, (tuple, list)):
        for a, e in zip(actual, expected):
            compare(a, e)
        return
    assert actual.device.type == DEV
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape
    kw = tol(expected.dtype)
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **kw)


def check(fn, *args, **kwargs):
    """Runs fn on CPU and tpu; same exception class or matching results."""
    try:
        expected = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  the class is what we compare
        with pytest.raises(type(e)):
            fn(*[to_dev(a) for a in args], **{k: to_dev(v) for k, v in kwargs.items()})
            torch.tpu.synchronize()
        return None
    torchtpu.reset_fallback_report()
    actual = fn(*[to_dev(a) for a in args], **{k: to_dev(v) for k, v in kwargs.items()})
    compare(actual, expected)
    assert_native()
    return expected


def check_forms(name, fn, inplace, x, *rest, **kw):
    """Functional, in-place (on a copy) and out= forms of one op."""
    expected = check(fn, x, *rest, **kw)
    if inplace is not None:
        check(lambda a, *r, **k: inplace(a.clone(), *r, **k), x, *rest, **kw)
    if expected is not None:
        out_c = torch.empty(0, dtype=expected.dtype)
        try:
            fn(x, *rest, **kw, out=out_c)
        except TypeError:  # the Python binding has no out= (relu, isnan, ...)
            return
        out_t = torch.empty(0, dtype=expected.dtype, device=DEV)
        torchtpu.reset_fallback_report()
        r = fn(to_dev(x), *[to_dev(a) for a in rest], **kw, out=out_t)
        assert r is out_t
        compare(out_t, out_c)
        assert_native()


def assert_native():
    """Fails if an op of this family (by base name) went through the CPU fallback since
    the last reset. Error paths are exempt: an op the C builder rejects with
    NotImplementedError is handed to the fallback on purpose, which raises like CPU."""
    torch.tpu.synchronize()
    ours = _native_names()
    bad = {k: v for k, v in torchtpu.fallback_report().items()
           if k.replace("aten::", "").split(".")[0] in ours}
    assert not bad, f"native elementwise ops went through the CPU fallback: {bad}"


@pytest.fixture
def own_ops_native():
    torchtpu.reset_fallback_report()
    yield


# ---- unary ----------------------------------------------------------------------------

DOMAINS = {"pos": (0.1, 3.0), "unit": (-0.9, 0.9), "ge1": (1.05, 4.0), "gtm1": (-0.9, 3.0),
           "prob": (0.05, 0.95), "tan": (-1.2, 1.2), "any": (-3.0, 3.0)}

UNARY = [  # name, domain, has in-place
    ("abs", "any", True), ("sqrt", "pos", True), ("rsqrt", "pos", True), ("log", "pos", True),
    ("log1p", "gtm1", True), ("log2", "pos", True), ("log10", "pos", True), ("exp2", "any", True),
    ("expm1", "any", True), ("exp", "any", True), ("sin", "any", True), ("cos", "any", True),
    ("tan", "tan", True), ("tanh", "any", True), ("sigmoid", "any", True), ("relu", "any", True),
    ("erf", "any", True), ("erfinv", "unit", True), ("reciprocal", "pos", True),
    ("floor", "any", True), ("ceil", "any", True), ("round", "any", True), ("trunc", "any", True),
    ("sign", "any", True), ("sgn", "any", True), ("frac", "any", True), ("asin", "unit", True),
    ("acos", "unit", True), ("atan", "any", True), ("sinh", "any", True), ("cosh", "any", True),
    ("asinh", "any", True), ("acosh", "ge1", True), ("atanh", "unit", True),
    ("logical_not", "any", True), ("bitwise_not", "any", True), ("neg", "any", True),
    ("isnan", "any", False), ("isinf", "any", False), ("isposinf", "any", False),
    ("isneginf", "any", False), ("signbit", "any", False), ("nan_to_num", "any", True),
    ("erfc", "any", True), ("lgamma", "any", True), ("sinc", "any", True), ("deg2rad", "any", True),
    ("rad2deg", "any", True),
]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name,domain,has_inplace", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, domain, has_inplace, dtype, own_ops_native):
    lo, hi = DOMAINS[domain]
    x = make((4, 5), dtype, lo, hi)
    fn = getattr(torch, name)
    inplace = (lambda a: getattr(a, name + "_")()) if has_inplace else None
    check_forms(name, fn, inplace, x)
    # non-contiguous input
    check(fn, make((5, 4), dtype, lo, hi, seed=1).t())


def test_unary_special_values(own_ops_native):
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1.5, -2.5, 0.5])
    for name in ["abs", "sign", "sgn", "floor", "ceil", "round", "trunc", "frac", "relu", "isnan",
                 "isinf", "isposinf", "isneginf", "signbit", "nan_to_num", "sigmoid", "tanh",
                 "exp", "erf", "logical_not"]:
        check(getattr(torch, name), x)
    check(lambda t: torch.nan_to_num(t, nan=1.0, posinf=2.0, neginf=-3.0), x)
    check(lambda t: torch.signbit(torch.relu(t)), x)  # relu(-0.) is -0. on CPU
    for dt in [torch.float16, torch.bfloat16]:
        check(torch.nan_to_num, x.to(dt))
    check(lambda t: torch.round(t, decimals=2), torch.tensor([1.2345, -1.2355, 0.125, 12.5]))
    check(lambda t: torch.round(t, decimals=-1), torch.tensor([14.0, -15.0, 25.0, 125.0]))
    check(lambda t: torch.round(t, decimals=1), torch.tensor([1, 2]))  # NotImplementedError


ACTIVATIONS = [
    ("gelu", lambda t: F.gelu(t), lambda t: A.gelu_(t)),
    ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"), lambda t: A.gelu_(t, approximate="tanh")),
    ("silu", F.silu, lambda t: F.silu(t, inplace=True)),
    ("hardtanh", lambda t: F.hardtanh(t, -0.5, 1.5), lambda t: F.hardtanh_(t, -0.5, 1.5)),
    ("leaky_relu", lambda t: F.leaky_relu(t, 0.2), lambda t: F.leaky_relu_(t, 0.2)),
    ("elu", lambda t: F.elu(t, 1.5), lambda t: F.elu_(t, 1.5)),
    ("selu", F.selu, None),
    ("softplus", lambda t: F.softplus(t, 2.0, 3.0), None),
    ("hardsigmoid", F.hardsigmoid, lambda t: F.hardsigmoid(t, inplace=True)),
    ("hardswish", F.hardswish, lambda t: F.hardswish(t, inplace=True)),
    ("mish", F.mish, lambda t: F.mish(t, inplace=True)),
    ("logit", lambda t: torch.logit(t), lambda t: torch.logit_(t)),
    ("logit_eps", lambda t: torch.logit(t, eps=0.2), lambda t: torch.logit_(t, eps=0.2)),
    ("threshold", lambda t: F.threshold(t, 0.5, -1.0), lambda t: F.threshold_(t, 0.5, -1.0)),
    ("relu6", F.relu6, None),
    ("hardshrink", lambda t: F.hardshrink(t, 0.7), None),
    ("softshrink", lambda t: F.softshrink(t, 0.7), None),
    ("logsigmoid", F.logsigmoid, None),
    ("log_sigmoid_forward", A.log_sigmoid_forward, None),
]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name,fn,inplace", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation(name, fn, inplace, dtype, own_ops_native):
    lo, hi = DOMAINS["prob"] if name.startswith("logit") else (-4.0, 4.0)
    x = make((3, 7), dtype, lo, hi)
    check(fn, x)
    if inplace is not None:
        check(lambda t: inplace(t.clone()), x)
    check(fn, make((7, 3), dtype, lo, hi, seed=2).t())


ACT_GRAD = ["gelu", "gelu_tanh", "silu", "hardtanh", "leaky_relu", "elu", "softplus",
            "hardsigmoid", "hardswish", "mish", "logit", "logit_eps", "threshold", "hardshrink",
            "softshrink", "logsigmoid"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ACT_GRAD + ["sigmoid", "tanh", "relu", "sqrt", "log", "sin",
                                             "erfinv", "atan", "abs", "expm1", "reciprocal"])
def test_unary_backward(name, dtype, own_ops_native):
    fns = {a[0]: a[1] for a in ACTIVATIONS}
    fn = fns.get(name) or getattr(torch, name)
    lo, hi = {"logit": (0.05, 0.95), "logit_eps": (0.05, 0.95), "sqrt": (0.2, 3), "log": (0.2, 3),
              "reciprocal": (0.2, 3), "erfinv": (-0.8, 0.8)}.get(name, (-4.0, 4.0))
    x = make((6, 5), dtype, lo, hi, seed=3)
    g = make((6, 5), dtype, -1, 1, seed=4)

    def grad(xx, gg):
        xx = xx.clone().requires_grad_(True)
        (r,) = torch.autograd.grad(fn(xx), xx, gg)
        return r

    check(grad, x, g)


# ---- binary -------------------------------------------------------------------------------

def _div_floor(a, b, **kw):
    return torch.div(a, b, rounding_mode="floor", **kw)


def _div_trunc(a, b, **kw):
    return torch.div(a, b, rounding_mode="trunc", **kw)


BINARY = [  # name, fn, in-place method or None, divisor must be nonzero for ints
    ("add", lambda a, b, **k: torch.add(a, b, alpha=2, **k), "add_", False),
    ("sub", lambda a, b, **k: torch.sub(a, b, **k), "sub_", False),
    ("mul", torch.mul, "mul_", False),
    ("div", torch.div, "div_", False),
    ("div_floor", _div_floor, None, True),
    ("div_trunc", _div_trunc, None, True),
    ("pow", torch.pow, "pow_", False),
    ("maximum", torch.maximum, None, False),
    ("minimum", torch.minimum, None, False),
    ("fmax", torch.fmax, None, False),
    ("fmin", torch.fmin, None, False),
    ("atan2", torch.atan2, "atan2_", False),
    ("remainder", torch.remainder, "remainder_", True),
    ("fmod", torch.fmod, "fmod_", True),
    ("floor_divide", torch.floor_divide, "floor_divide_", True),
    ("bitwise_and", torch.bitwise_and, "bitwise_and_", False),
    ("bitwise_or", torch.bitwise_or, "bitwise_or_", False),
    ("bitwise_xor", torch.bitwise_xor, "bitwise_xor_", False),
    ("logical_and", torch.logical_and, "logical_and_", False),
    ("logical_or", torch.logical_or, "logical_or_", False),
    ("logical_xor", torch.logical_xor, "logical_xor_", False),
    ("hypot", torch.hypot, "hypot_", False),
    ("copysign", torch.copysign, "copysign_", False),
    ("xlogy", torch.xlogy, "xlogy_", False),
    ("eq", torch.eq, "eq_", False), ("lt", torch.lt, "lt_", False), ("ge", torch.ge, "ge_", False),
    ("logaddexp", torch.logaddexp, None, False), ("logaddexp2", torch.logaddexp2, None, False),
    ("heaviside", torch.heaviside, "heaviside_", False),
    ("bitwise_left_shift", torch.bitwise_left_shift, "bitwise_left_shift_", False),
    ("bitwise_right_shift", torch.bitwise_right_shift, "bitwise_right_shift_", False),
]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name,fn,inplace,nonzero", BINARY, ids=[b[0] for b in BINARY])
def test_binary(name, fn, inplace, nonzero, dtype, own_ops_native):
    lo, hi = (0.0, 3.0) if name == "pow" and not dtype.is_floating_point else (-3.0, 3.0)
    if name == "pow" and dtype.is_floating_point:
        lo = 0.1
    a = make((3, 4), dtype, lo, hi, seed=5)
    b = make((3, 4), dtype, lo, hi, seed=6, nonzero=nonzero)
    ip = (lambda x, y: getattr(x, inplace)(y)) if inplace else None
    check_forms(name, fn, ip, a, b)
    # broadcasting [3,1] x [4] and non-contiguous operands
    check(fn, make((3, 1), dtype, lo, hi, seed=7), make((4,), dtype, lo, hi, seed=8, nonzero=nonzero))
    check(fn, make((4, 3), dtype, lo, hi, seed=9).t(),
          make((4, 3), dtype, lo, hi, seed=10, nonzero=nonzero).t())
    # a Python number on the right (int and float), and a 0-dim CPU tensor
    other = 2
    check(fn, a, other)
    check(fn, a, 1.5)
    check(fn, a, torch.tensor(2, dtype=dtype) if dtype != torch.bool else torch.tensor(True))


@pytest.mark.parametrize("pair", [(torch.int32, torch.float16), (torch.uint8, torch.int8),
                                  (torch.bfloat16, torch.float16), (torch.bool, torch.int64),
                                  (torch.float32, torch.float64)], ids=str)
def test_binary_promotion(pair, own_ops_native):
    a = make((2, 3), pair[0], seed=11)
    b = make((2, 3), pair[1], seed=12, nonzero=True)
    for fn in [torch.add, torch.mul, torch.div, torch.maximum, torch.atan2, torch.eq, torch.where]:
        if fn is torch.where:
            check(lambda x, y: torch.where(x > 0, x, y), a, b)
        else:
            check(fn, a, b)
    check(lambda x, y: torch.pow(x.abs() if x.dtype != torch.bool else x, y), a, b)
    out = torch.empty(2, 3, dtype=torch.float64)
    check(lambda x, y, **k: torch.add(x, y, out=torch.empty(2, 3, dtype=torch.float64, device=x.device)), a, b)
    del out


def test_scalar_first_overloads(own_ops_native):
    t = make((5,), torch.int64, 1, 4, seed=13)
    f = make((5,), torch.float32, 0.5, 2, seed=14)
    check(lambda x: torch.pow(2, x), t)
    check(lambda x: torch.pow(2.5, x), f)
    check(lambda x: torch.remainder(7, x), t)
    check(lambda x: torch.bitwise_and(6, x), t)
    check(lambda x: torch.xlogy(2.0, x), f)
    check(lambda x: torch.rsub(x, 3, alpha=2), t)
    check(lambda x, y: torch.rsub(x, y, alpha=2), f, f.flip(0))
    check(lambda x: 1 - x, f)
    check(lambda x: torch.pow(x, -1), f)


def test_integer_edge_cases(own_ops_native):
    a = torch.tensor([-7, 7, -7, 7, -9, 5])  # (INT64_MIN // -1 crashes PyTorch CPU itself)
    b = torch.tensor([2, 2, -2, -2, -1, 3])
    for fn in [_div_floor, _div_trunc, torch.remainder, torch.fmod, torch.floor_divide]:
        check(fn, a, b)
    check(torch.pow, torch.tensor([2, -1, 3, 1, 0]), torch.tensor([10, -3, -1, -5, 0]))
    i8 = torch.tensor([100, -100, 127], dtype=torch.int8)
    check(torch.add, i8, i8)  # wraps
    check(torch.mul, i8, i8)
    fa = torch.tensor([-7.5, 7.5, -7.5, 7.5, 0.0, -0.0, 1.0])
    fb = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0])
    for fn in [_div_floor, _div_trunc, torch.remainder, torch.fmod, torch.floor_divide]:
        check(fn, fa, fb)


SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 2.5, -3.5, 1e-30]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_binary_special_values(dtype, own_ops_native):
    v = torch.tensor(SPECIAL, dtype=dtype)
    a, b = torch.meshgrid(v, v, indexing="ij")
    for fn in [torch.maximum, torch.minimum, torch.fmax, torch.fmin, torch.remainder, torch.fmod,
               _div_floor, _div_trunc, torch.floor_divide, torch.copysign, torch.atan2, torch.hypot,
               torch.xlogy, torch.pow, torch.div, torch.mul, torch.eq, torch.lt, torch.logical_xor]:
        check(fn, a.contiguous(), b.contiguous())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_scalars(dtype, own_ops_native):
    """CPU casts number operands to the f16/bf16 result dtype before computing (mul and
    div excepted: they read a second-operand number in float; see test_bitwise_as_cpu)."""
    x = torch.tensor([0.1, 3.0, 1000.0, 2049.0, -0.3], dtype=dtype)
    for s in [0.1, 3.0001, 0.1001, 2049, -0.3]:
        for fn in [torch.eq, torch.lt, torch.add, torch.mul, torch.sub, torch.div, torch.maximum
                   if False else torch.remainder, torch.pow, torch.clamp_min, torch.fmod]:
            check(fn, x.abs() if fn is torch.pow else x, s)
        check(lambda t: torch.where(t > 0, t, s), x)
        check(lambda t: torch.lerp(t, t * 2, s), x)
        check(lambda t: torch.clamp(t, s, s + 1), x)
        check(lambda t: torch.add(t, t, alpha=s), x)


def _inplace(foreach_op, t, *args):
    out = [t.clone()]
    foreach_op(out, *args)
    return out[0]


# Ops whose CPU kernels fix the rounding (one fma, a float scalar, a rounded square), so
# tpu can and does give the same bits; tolerances would hide a formula that differs in the
# last place for a fifth of the elements (a + alpha * b rounded twice, lerp's weight form).
BITWISE = [
    ("add_alpha", lambda a, b, c: torch.add(a, b, alpha=0.37)),
    ("sub_alpha", lambda a, b, c: torch.sub(a, b, alpha=0.37)),
    ("rsub_alpha", lambda a, b, c: torch.rsub(a, b, alpha=0.37)),
    ("add_inplace", lambda a, b, c: a.clone().add_(b, alpha=-0.01)),
    ("mul_scalar", lambda a, b, c: a * 0.3),
    ("mul_cpu_scalar_tensor", lambda a, b, c: torch.mul(a, torch.tensor(3.14))),
    ("div_scalar", lambda a, b, c: a / 0.3),
    ("div_trunc_scalar", lambda a, b, c: torch.div(a, 0.3, rounding_mode="trunc")),
    ("div_floor_scalar", lambda a, b, c: torch.div(a, 0.3, rounding_mode="floor")),
    ("floor_divide_scalar", lambda a, b, c: a // 0.3),
    ("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.37)),
    ("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c, value=0.37)),
    ("lerp_scalar", lambda a, b, c: torch.lerp(a, b, 0.37)),
    ("lerp_scalar_large", lambda a, b, c: torch.lerp(a, b, 0.8)),
    ("lerp_tensor", lambda a, b, c: torch.lerp(a, b, c.abs() / (1 + c.abs()))),
    ("pow_2", lambda a, b, c: a ** 2),
    ("pow_3", lambda a, b, c: a ** 3),
    ("pow_m2", lambda a, b, c: c ** -2),
    ("foreach_mul", lambda a, b, c: torch._foreach_mul([a], 0.9)[0]),
    ("foreach_mul_inplace", lambda a, b, c: _inplace(torch._foreach_mul_, a, 0.9)),
    ("foreach_mul_inplace_list", lambda a, b, c: _inplace(torch._foreach_mul_, a, [0.9])),
    ("deg2rad", lambda a, b, c: torch.deg2rad(a)),
    ("rad2deg", lambda a, b, c: torch.rad2deg(a)),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name,fn", BITWISE, ids=[b[0] for b in BITWISE])
def test_bitwise_as_cpu(name, fn, dtype, own_ops_native):
    """Same bits as CPU: CPU's add and lerp fuse a multiply-add (vec::fmadd), addcmul is
    compiled with contraction, addcdiv divides last, mul/div keep a number in float for
    f16/bf16 where add rounds alpha to the dtype, and bf16 x**3 rounds x*x first."""
    g = torch.Generator().manual_seed(7)
    # A multiple of CPU's vector width: its scalar tail loop (the last n % 32 f16/bf16
    # elements) computes add's alpha * b in Half arithmetic, rounding the product first.
    a, b, c = (torch.randn(4096, generator=g).to(dtype) for _ in range(3))
    c = c.abs() + 0.5  # divisor of addcdiv
    want = fn(a, b, c)
    got = fn(*(t.to(DEV) for t in (a, b, c))).cpu()
    diff = (want != got) & ~(want.isnan() & got.isnan())
    assert not diff.any(), f"{name} {dtype}: {int(diff.sum())} of {want.numel()} elements differ"


@pytest.mark.parametrize("fn", [_div_floor, _div_trunc, torch.remainder, torch.fmod,
                                torch.floor_divide], ids=lambda f: getattr(f, "__name__", "op"))
def test_integer_division_by_zero(fn):
    a = torch.tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, torch.tensor([1, 0, 1]))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a.to(DEV), torch.tensor([1, 0, 1], device=DEV))
        torch.tpu.synchronize()
    # the device keeps working afterwards
    compare(fn(a.to(DEV), torch.tensor([1, 2, 1], device=DEV)), fn(a, torch.tensor([1, 2, 1])))


# ---- ternary and masked -----------------------------------------------------------------

BINARY_GRAD = {
    "pow": lambda a, b: torch.pow(a.abs() + 0.5, b),
    "atan2": torch.atan2, "maximum": torch.maximum, "minimum": torch.minimum,
    "div": torch.div, "mul": torch.mul, "sub": lambda a, b: torch.sub(a, b, alpha=3),
    "xlogy": lambda a, b: torch.xlogy(a, b.abs() + 0.5), "hypot": torch.hypot,
    "fmod": lambda a, b: torch.fmod(a, b.abs() + 0.5), "remainder": lambda a, b: torch.remainder(a, b.abs() + 0.5),
    "copysign": torch.copysign, "where": lambda a, b: torch.where(a > b, a, b),
    "lerp": lambda a, b: torch.lerp(a, b, torch.sigmoid(a)), "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5),
    "addcdiv": lambda a, b: torch.addcdiv(a, a, b.abs() + 0.5, value=2),
    "clamp_t": lambda a, b: torch.clamp(a, b - 1, b + 1), "masked_fill": lambda a, b: a.masked_fill(b > 0, 1.0),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(BINARY_GRAD))
def test_binary_backward(name, dtype, own_ops_native):
    fn = BINARY_GRAD[name]
    a = make((4, 5), dtype, seed=31)
    b = make((4, 5), dtype, seed=32, nonzero=True)
    g = make((4, 5), dtype, seed=33)

    def grads(x, y, gg):
        x = x.clone().requires_grad_(True)
        y = y.clone().requires_grad_(True)
        return torch.autograd.grad(fn(x, y), (x, y), gg, allow_unused=True, materialize_grads=True)

    check(grads, a, b, g)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_where_masked_fill(dtype, own_ops_native):
    c = make((3, 4), torch.bool, seed=15)
    x = make((3, 4), dtype, seed=16)
    y = make((4,), dtype, seed=17)
    check(torch.where, c, x, y)
    check(lambda cc, a, b: torch.where(cc, a, b, out=torch.empty(0, dtype=a.dtype, device=a.device)), c, x, y)
    check(torch.where, c.t(), x.t(), y[:3, None])
    check(lambda a, m: a.masked_fill(m, 2), x, c)
    check(lambda a, m: a.masked_fill(m, 1.5), x, c)
    check(lambda a, m: a.clone().masked_fill_(m, True), x, c)
    check(lambda a, m, v: a.masked_fill(m, v), x, c, torch.tensor(3, dtype=dtype))
    check(lambda a, m: a.masked_fill(m[0], -1), x, c)        # mask broadcasts
    check(lambda a, m: a.t().clone().masked_fill_(m.t(), 0), x, c)
    check(lambda a, m: a.masked_fill(m.to(torch.uint8), 1), x, c)  # RuntimeError
    check(lambda a, m: a.masked_fill(m, torch.ones(2)), x, c)        # RuntimeError


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_clamp(dtype, own_ops_native):
    x = make((4, 5), dtype, -5, 5, seed=18)
    lo = make((5,), dtype, -3, 0, seed=19)
    hi = make((4, 1), dtype, 0, 3, seed=20)
    check_forms("clamp", torch.clamp, lambda a, *r: a.clamp_(*r), x, -2, 3)
    check(torch.clamp, x, None, 2)
    check(torch.clamp, x, min=1.5)
    check(torch.clamp, x, lo, hi)
    check(torch.clamp, x, None, hi)
    check(lambda a, l: a.clone().clamp_(min=l), x, lo)
    check(lambda a, l: torch.clamp(a, l, out=torch.empty(0, dtype=a.dtype, device=a.device)), x, lo)
    check(torch.clamp_min, x, 1)
    check(torch.clamp_max, x, 1)
    check(torch.clamp_min, x, lo)
    check(torch.clamp_max, x.t(), hi.t())
    check(lambda a: a.clone().clamp_max_(1), x)
    check(torch.clamp, x)  # RuntimeError: neither bound


def test_clamp_nan():
    x = torch.tensor([float("nan"), 1.0, -1.0, 5.0])
    check(torch.clamp, x, 0.0, 2.0)
    check(torch.clamp, x, float("nan"))
    check(torch.clamp, x, torch.tensor([0.0, float("nan"), 0.0, 0.0]), None)
    check(torch.clamp, x, 3.0, 1.0)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_addc_lerp(dtype, own_ops_native):
    s = make((3, 4), dtype, seed=21)
    t1 = make((3, 1), dtype, seed=22)
    t2 = make((4,), dtype, seed=23, nonzero=True)
    check_forms("addcmul", torch.addcmul, lambda a, *r, **k: a.addcmul_(*r, **k), s, t1, t2, value=2)
    check_forms("addcdiv", torch.addcdiv, lambda a, *r, **k: a.addcdiv_(*r, **k), s, t1, t2, value=0.5)
    e = make((3, 4), dtype, seed=24)
    check_forms("lerp", torch.lerp, lambda a, *r: a.lerp_(*r), s, e, 0.3)
    check(torch.lerp, s, e, 0.8)
    w = make((4,), dtype, 0, 1, seed=25)
    check(torch.lerp, s, e, w)
    check(torch.lerp, s.t(), e.t(), 0.3)


def test_lerp_dtype_mismatch():
    check(torch.lerp, torch.ones(3), torch.ones(3, dtype=torch.float64), 0.5)


def test_zero_and_fill(own_ops_native):
    for dt in ALL_DTYPES:
        x = make((3, 4), dt, seed=26)
        check(lambda a: a.clone().zero_(), x)
        check(lambda a: a.t().clone().zero_(), x)
        check(lambda a: a.clone().fill_(1), x)


# ---- activation backward ops called directly ----------------------------------------------

BACKWARD = [
    ("threshold_backward", lambda g, x: A.threshold_backward(g, x, 0.5)),
    ("gelu_backward", lambda g, x: A.gelu_backward(g, x)),
    ("gelu_backward_tanh", lambda g, x: A.gelu_backward(g, x, approximate="tanh")),
    ("sigmoid_backward", lambda g, x: A.sigmoid_backward(g, x)),
    ("tanh_backward", lambda g, x: A.tanh_backward(g, x)),
    ("hardtanh_backward", lambda g, x: A.hardtanh_backward(g, x, -1.0, 1.0)),
    ("leaky_relu_backward", lambda g, x: A.leaky_relu_backward(g, x, 0.1, False)),
    ("elu_backward", lambda g, x: A.elu_backward(g, 1.5, 1.0, 1.0, False, x)),
    ("elu_backward_result", lambda g, x: A.elu_backward(g, 1.5, 1.0, 1.0, True, x)),
    ("softplus_backward", lambda g, x: A.softplus_backward(g, x, 1.0, 20.0)),
    ("hardsigmoid_backward", lambda g, x: A.hardsigmoid_backward(g, x)),
    ("hardswish_backward", lambda g, x: A.hardswish_backward(g, x)),
    ("logit_backward", lambda g, x: A.logit_backward(g, x)),
    ("logit_backward_eps", lambda g, x: A.logit_backward(g, x, 0.1)),
    ("hardshrink_backward", lambda g, x: A.hardshrink_backward(g, x, 0.5)),
    ("softshrink_backward", lambda g, x: A.softshrink_backward(g, x, 1.0)),
    ("log_sigmoid_backward", lambda g, x: A.log_sigmoid_backward(g, x, (x * 0.3).abs())),
]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name,fn", BACKWARD, ids=[b[0] for b in BACKWARD])
def test_backward_ops(name, fn, dtype, own_ops_native):
    g = make((3, 5), dtype, -2, 2, seed=27)
    x = make((3, 5), dtype, -4, 4, seed=28) if "logit" not in name else make((3, 5), dtype, -0.2, 1.2, seed=28)
    check(fn, g, x)
    check(fn, g[:, :1], x.t().contiguous().t())


# ---- errors -----------------------------------------------------------------------------

ERRORS = [
    lambda: torch.bitwise_and(torch.ones(2), torch.ones(2)),
    lambda: torch.ones(2, dtype=torch.bool) - torch.ones(2, dtype=torch.bool),
    lambda: -torch.ones(2, dtype=torch.bool),
    lambda: torch.sqrt_(torch.ones(2, dtype=torch.int64)),
    lambda: torch.div(torch.ones(2), torch.ones(2), rounding_mode="x"),
    lambda: F.gelu(torch.ones(2), approximate="x"),
    lambda: torch.where(torch.ones(2), torch.ones(2), torch.ones(2)),
    lambda: torch.pow(torch.ones(2, dtype=torch.int64), -2),
    lambda: torch.add(torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), alpha=0.5),
    lambda: F.hardtanh(torch.ones(2, dtype=torch.uint8)),
    lambda: torch.addcdiv(torch.ones(2), torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64)),
    lambda: torch.ones(2).mul_(torch.ones(3, 2)),
    lambda: torch.ones(3) + torch.ones(4),
    lambda: A.leaky_relu_backward(torch.ones(2), torch.ones(2), -0.1, True),
    lambda: torch.hypot(torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64)),
    lambda: torch.abs(torch.ones(2, dtype=torch.bool)),
    lambda: torch.heaviside(torch.ones(2), torch.ones(2, dtype=torch.float64)),
    lambda: F.softshrink(torch.ones(2), -1.0),
    lambda: torch.bitwise_left_shift(torch.ones(2), 1),
    lambda: F.threshold(torch.ones(2, dtype=torch.uint8), 0.5, -1.0),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors_match_cpu(i):
    make_call = ERRORS[i]
    with pytest.raises(Exception) as cpu_exc:
        make_call()
    with torch.device(DEV), pytest.raises(cpu_exc.type):
        make_call()
        torch.tpu.synchronize()


# ---- registration -----------------------------------------------------------------------

EXPECTED_NATIVE = """abs abs_ abs.out sqrt rsqrt log log1p log2 log10 exp2 expm1 sin cos tan tanh sigmoid
relu relu_ erf erfinv reciprocal floor ceil round round.decimals round_.decimals trunc sign sgn frac
asin acos atan sinh cosh asinh acosh atanh logical_not bitwise_not isnan isinf isposinf isneginf
signbit nan_to_num gelu gelu_ silu silu_ hardtanh hardtanh_ leaky_relu leaky_relu_ elu elu_ softplus
hardsigmoid hardswish mish logit threshold pow.Tensor_Tensor pow.Tensor_Scalar pow.Scalar pow_.Scalar
div.Tensor_mode div_.Scalar_mode maximum minimum fmax fmin atan2 remainder.Tensor remainder.Scalar
remainder.Scalar_Tensor fmod.Tensor floor_divide floor_divide.Scalar bitwise_and.Tensor
bitwise_or.Scalar bitwise_xor.Scalar_Tensor logical_and logical_or_ logical_xor hypot copysign.Tensor
copysign.Scalar xlogy.Tensor xlogy.Scalar_Self rsub.Tensor rsub.Scalar where.self addcmul addcdiv_
lerp.Scalar lerp.Tensor clamp clamp.Tensor clamp_min clamp_max.Tensor masked_fill.Scalar
masked_fill_.Tensor zero_ threshold_backward gelu_backward sigmoid_backward tanh_backward
hardtanh_backward leaky_relu_backward elu_backward softplus_backward hardsigmoid_backward
hardswish_backward logit_backward erfc lgamma sinc deg2rad rad2deg logaddexp logaddexp2 heaviside
hardshrink softshrink hardshrink_backward softshrink_backward log_sigmoid_forward log_sigmoid_backward
bitwise_left_shift.Tensor bitwise_right_shift.Tensor_Scalar silu_backward.grad_input""".split()


def test_registered_natively_and_not_composite():
    native = set(torchtpu.native_ops())
    missing = [n for n in EXPECTED_NATIVE if n not in native]
    assert not missing, missing
    ours = [n for n in native if n.split(".")[0].rstrip("_") in
            {e.split(".")[0].rstrip("_") for e in EXPECTED_NATIVE}]
    composite = [n for n in ours if torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::" + n, "CompositeImplicitAutograd")]
    assert not composite, composite
