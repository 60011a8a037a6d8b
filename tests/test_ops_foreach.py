"""torch._foreach_* ops (the optimizers' and clip_grad_norm_'s multi-tensor ops): native on
tpu as one adapter call that applies the element op at every list position (libtpurt's
tpu_foreach_prepare), compared with PyTorch's CPU results."""
import warnings

import pytest
import torch

import torchtpu
from op_helpers import close, native, no_cpu_fallback, tpu

SHAPES = [(3, 4), (5,), (2, 3, 2), ()]


def _lists(n_lists, dtype=torch.float32, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_lists):
        ts = [torch.randn(s, generator=g).to(dtype) for s in SHAPES]
        if positive:
            ts = [t.abs() + 0.5 for t in ts]
        out.append(ts)
    return out


def _to_tpu(x):
    if isinstance(x, list):
        return [_to_tpu(t) for t in x]
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def _run(fn, args, inplace):
    """fn on CPU and on tpu; returns (cpu result list, tpu result list)."""
    cpu_args = [[t.clone() for t in a] if isinstance(a, list) and a and isinstance(a[0], torch.Tensor) else a
                for a in args]
    tpu_args = [_to_tpu(a) for a in args]
    rc = fn(*cpu_args)
    rt = fn(*tpu_args)
    if inplace:
        return cpu_args[0], tpu_args[0]
    return rc, rt


N = len(SHAPES)
CASES = [
    # (name, fn, number of tensor lists, extra args, positive inputs)
    ("_foreach_mul_.Scalar", lambda a: torch._foreach_mul_(a, 0.9), 1, True),
    ("_foreach_mul.ScalarList", lambda a: torch._foreach_mul(a, [0.5, 2.0, -1.0, 3.0]), 1, False),
    ("_foreach_mul_.List", lambda a, b: torch._foreach_mul_(a, b), 2, True),
    ("_foreach_mul_.Tensor", lambda a: torch._foreach_mul_(a, torch.tensor(0.25, device=a[0].device)), 1, True),
    ("_foreach_add.List", lambda a, b: torch._foreach_add(a, b, alpha=-0.5), 2, False),
    ("_foreach_add_.Scalar", lambda a: torch._foreach_add_(a, 1e-3), 1, True),
    ("_foreach_sub_.ScalarList", lambda a: torch._foreach_sub_(a, [1, 2, 3, 4]), 1, True),
    ("_foreach_div_.ScalarList", lambda a: torch._foreach_div_(a, [0.5, 0.25, 2.0, 4.0]), 1, True),
    ("_foreach_div.List", lambda a, b: torch._foreach_div(a, b), 2, False),
    ("_foreach_lerp_.Scalar", lambda a, b: torch._foreach_lerp_(a, b, 0.1), 2, True),
    ("_foreach_lerp.List", lambda a, b, w: torch._foreach_lerp(a, b, w), 3, False),
    ("_foreach_lerp_.ScalarList", lambda a, b: torch._foreach_lerp_(a, b, [0.1, 0.2, 0.3, 0.4]), 2, True),
    ("_foreach_addcmul_.Scalar", lambda a, b, c: torch._foreach_addcmul_(a, b, c, value=0.5), 3, True),
    ("_foreach_addcdiv.ScalarList",
     lambda a, b, c: torch._foreach_addcdiv(a, b, c, [0.1, -0.2, 0.3, 1.0]), 3, False),
    ("_foreach_addcdiv_.ScalarList",
     lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [0.1, -0.2, 0.3, 1.0]), 3, True),
    ("_foreach_sqrt", lambda a: torch._foreach_sqrt(a), 1, False),
    ("_foreach_sqrt_", lambda a: torch._foreach_sqrt_(a), 1, True),
    ("_foreach_neg", lambda a: torch._foreach_neg(a), 1, False),
    ("_foreach_exp_", lambda a: torch._foreach_exp_(a), 1, True),
    ("_foreach_reciprocal", lambda a: torch._foreach_reciprocal(a), 1, False),
    ("_foreach_zero_", lambda a: torch._foreach_zero_(a), 1, True),
    ("_foreach_clamp_min_.Scalar", lambda a: torch._foreach_clamp_min_(a, 0.0), 1, True),
    ("_foreach_clamp_max.List", lambda a, b: torch._foreach_clamp_max(a, b), 2, False),
    ("_foreach_maximum.ScalarList", lambda a: torch._foreach_maximum(a, [0.0, 0.5, -0.5, 1.0]), 1, False),
    ("_foreach_minimum.List", lambda a, b: torch._foreach_minimum(a, b), 2, False),
    ("_foreach_pow.Scalar", lambda a: torch._foreach_pow(a, 2.0), 1, False),
    ("_foreach_pow.ScalarAndTensor", lambda a: torch._foreach_pow(2.0, a), 1, False),
    ("_foreach_pow_.List", lambda a, b: torch._foreach_pow_(a, b), 2, True),
    ("_foreach_norm.Scalar", lambda a: torch._foreach_norm(a, 2), 1, False),
    ("_foreach_norm.Scalar", lambda a: torch._foreach_norm(a, float("inf")), 1, False),
    ("_foreach_max", lambda a: torch._foreach_max(a), 1, False),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_foreach_matches_cpu(case):
    name, fn, n_lists, inplace = CASES[case]
    positive = "pow" in name or "div" in name or "sqrt" in name or "reciprocal" in name
    lists = _lists(n_lists, positive=positive)
    with no_cpu_fallback():
        rc, rt = _run(fn, lists, inplace)
    assert len(rc) == len(rt) == N
    for c, t in zip(rc, rt):
        close(t, c)
    assert name in torchtpu.native_ops()


def test_foreach_runs_as_one_call_named_after_the_foreach_op():
    """The trace names each position's node after the op the user called (the composite
    slow path would show the element op, called once per position through the dispatcher)."""
    a, b = _to_tpu(_lists(2))
    with torchtpu.set_eager_mode("debug"):
        torchtpu.trace(clear=True)
        torch._foreach_addcmul_(a, b, b, value=0.1)
        tr = torchtpu.trace(clear=True)
    assert [e["op"] for e in tr] == ["_foreach_addcmul_.Scalar"] * N
    assert all(e["path"] == "native" for e in tr)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int64])
def test_foreach_dtypes_and_promotion(dtype):
    (a,) = _lists(1, dtype=dtype)
    with no_cpu_fallback():
        for fn in (lambda x: torch._foreach_mul(x, [2.5, 1.5, 0.5, 3.0]),  # int lists promote to float
                   lambda x: torch._foreach_add(x, 2),
                   lambda x: torch._foreach_abs(x)):
            for c, t in zip(fn(a), fn(_to_tpu(a))):
                close(t, c)


def test_foreach_int_scalar_list_inplace():
    (a,) = _lists(1, dtype=torch.int64)
    at = _to_tpu(a)
    torch._foreach_mul_(at, [2, 3, 4, 5])
    ref = [t.clone() for t in a]
    torch._foreach_mul_(ref, [2, 3, 4, 5])
    for x, c in zip(at, ref):
        close(x, c)
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        torch._foreach_mul_(at, [0.5, 1.0, 1.0, 1.0])


def test_foreach_errors_name_the_problem_and_change_nothing():
    a, b = _to_tpu(_lists(2))
    before = [t.cpu() for t in a]
    with pytest.raises(RuntimeError, match="Tensor list must have at least one tensor"):
        torch._foreach_mul_([], 2.0)
    with pytest.raises(RuntimeError, match="Tensor lists must have the same number of tensors, got 4 and 3"):
        torch._foreach_add_(a, b[:3])
    with pytest.raises(RuntimeError, match="same number of elements as scalar list"):
        torch._foreach_mul_(a, [1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"found at least two devices, tpu:0 and cpu.*list position 1"):
        torch._foreach_mul_([a[0], torch.ones(3)], 2.0)
    # a bad position fails the whole call before any position runs
    bad = list(b)
    bad[2] = torch.randn(7, device="tpu")
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):
        torch._foreach_add_(a, bad)
    # an in-place cast error at the last position (CPU's slow kernel would have updated
    # the positions before it)
    mixed = [t.clone() for t in a[:3]] + [torch.ones(2, dtype=torch.int64, device="tpu")]
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        torch._foreach_mul_(mixed, 0.5)
    for t, c in zip(a + mixed[:3], before + before[:3]):
        torch.testing.assert_close(t.cpu(), c, rtol=0, atol=0)


def test_foreach_autograd():
    lists = _lists(2)
    xc, yc = ([t.clone().requires_grad_() for t in ts] for ts in lists)
    xt, yt = ([tpu(t).requires_grad_() for t in ts] for ts in lists)
    for x, y in ((xc, yc), (xt, yt)):
        outs = torch._foreach_mul(torch._foreach_sqrt(torch._foreach_abs(x)), y)
        sum(o.sum() for o in outs).backward()
    for c, t in zip(xc + yc, xt + yt):
        close(t.grad, c.grad)


@pytest.mark.parametrize("opt", ["adam", "adamw_amsgrad", "sgd_momentum", "clip_grad_norm"])
def test_foreach_optimizer_steps_match_cpu(opt):
    """The optimizers' foreach paths (the default on tpu, as on cuda) against CPU's."""
    torch.manual_seed(0)
    params = [torch.randn(s) for s in [(8, 4), (4,), (3, 3, 2)]]
    grads = [torch.randn_like(p) for p in params]

    def run(device):
        ps = [p.clone().to(device).requires_grad_() for p in params]
        for p, g in zip(ps, grads):
            p.grad = g.to(device)
        if opt == "clip_grad_norm":
            n = torch.nn.utils.clip_grad_norm_(ps, 0.5, foreach=True)
            return [p.grad for p in ps] + [n]
        o = {"adam": lambda: torch.optim.Adam(ps, lr=0.1, weight_decay=0.01, foreach=True),
             "adamw_amsgrad": lambda: torch.optim.AdamW(ps, lr=0.1, amsgrad=True, foreach=True),
             "sgd_momentum": lambda: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, foreach=True)}[opt]()
        for _ in range(3):
            o.step()
        return ps

    with native("_foreach_norm", "_foreach_mul_", "_foreach_lerp_", "_foreach_addcdiv_", "_foreach_add_"):
        got = run("tpu")
    for t, c in zip(got, run("cpu")):
        close(t.detach(), c.detach())


@pytest.mark.parametrize("opt", ["sgd_momentum", "adamw", "adamw_fused", "rmsprop", "nadam", "adadelta"])
def test_bf16_optimizer_steps_equal_cpu_bit_for_bit(opt):
    """In bf16 every step's rounding is CPU's: the fused multiply-adds of add/lerp/addcmul,
    float numbers in mul/div, and the in-place _foreach_mul_ that rounds its number to
    bf16 (SGD's momentum 0.9). (float32 steps that take a sqrt differ in the last place:
    CPU's sqrt is not correctly rounded, tpu's is.)"""
    make = {"sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
            "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
            "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
            "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-2, foreach=True),
            "nadam": lambda ps: torch.optim.NAdam(ps, lr=1e-2, foreach=True),
            "adadelta": lambda ps: torch.optim.Adadelta(ps, foreach=True)}[opt]

    def run(device):
        g = torch.Generator().manual_seed(1)
        ps = [torch.randn(64, 33, generator=g).to(torch.bfloat16).to(device).requires_grad_() for _ in range(3)]
        o = make(ps)
        for step in range(5):
            gs = torch.Generator().manual_seed(10 + step)
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gs).to(torch.bfloat16).to(device)
            o.step()
        return [p.detach().cpu() for p in ps]

    for t, c in zip(run("tpu"), run("cpu")):
        assert torch.equal(t, c), f"{opt}: {int((t != c).sum())} of {t.numel()} elements differ"


FUSED = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.1, fused=True),
    "adam_wd_amsgrad": lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.1, amsgrad=True, fused=True),
    "adam_maximize": lambda ps: torch.optim.Adam(ps, lr=0.1, maximize=True, fused=True),
    "adamw_tensor_lr": lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(0.01), weight_decay=0.1, fused=True),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, fused=True),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                                               fused=True),
    "sgd_dampening": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.5, fused=True),
}


def _fused_run(device, make, dtype, steps=3):
    torch.manual_seed(0)
    params = [torch.randn(s, dtype=torch.float64) for s in [(8, 4), (4,), (3, 3, 2)]]
    grads = [torch.randn_like(p) for p in params]
    ps = [p.to(dtype).to(device).requires_grad_() for p in params]
    for p, g in zip(ps, grads):
        p.grad = g.to(dtype).to(device)
    opt = make(ps)
    for _ in range(steps):
        opt.step()
    states = [t for p in ps for k, t in sorted(opt.state[p].items()) if k != "step" and t is not None]
    return ps, states


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", list(FUSED))
def test_fused_optimizers_match_cpu(name, dtype):
    """fused=True (the default of Hugging Face's Trainer): _fused_adam_/_fused_adamw_/_fused_sgd_
    run natively, one node per parameter, and match CPU's fused kernels."""
    with native("_fused_adam_", "_fused_adamw_", "_fused_sgd_"):
        got_p, got_s = _fused_run("tpu", FUSED[name], dtype)
    want_p, want_s = _fused_run("cpu", FUSED[name], dtype)
    assert len(got_s) == len(want_s)
    for t, c in zip(got_p + got_s, want_p + want_s):
        close(t.detach(), c.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("kind,kwargs", [
    ("adamw", dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)),
    ("adamw", dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)),
    ("adam", dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)),
    ("sgd", dict(weight_decay=0.1, momentum=0.9, lr=0.1, dampening=0.2, nesterov=False, maximize=False,
                 is_first_step=False)),
    ("sgd", dict(weight_decay=0.1, momentum=0.9, lr=0.1, dampening=0.0, nesterov=True, maximize=False,
                 is_first_step=False)),
    ("sgd", dict(weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0, nesterov=False, maximize=False,
                 is_first_step=False)),
])
def test_fused_optimizer_step_paths_agree_exactly(kind, kwargs, dtype):
    """The host kernels run the common step (no grad_scale, maximize or amsgrad) as one loop
    over all operands and the others as a pass per operand; grad_scale=1 takes the second
    path with the same arithmetic, so both must give bit-identical parameters and states
    (sizes past one 512-element block and a ragged tail)."""
    fn = {"adamw": torch._fused_adamw_, "adam": torch._fused_adam_, "sgd": torch._fused_sgd_}[kind]
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(n, generator=g, dtype=torch.float64).to(dtype) for n in (1500, 7, 40000)]
    grads = [torch.randn(t.shape, generator=g, dtype=torch.float64).to(dtype) for t in base]
    n_states = 1 if kind == "sgd" else 2

    def run(scale):
        ps = [t.clone().to("tpu") for t in base]
        states = [[(torch.rand(t.shape, generator=g, dtype=torch.float64) if s else
                    torch.randn(t.shape, generator=g, dtype=torch.float64)).to(dtype).to("tpu")
                   for t in base] for s in range(n_states)]
        gs = [t.to("tpu") for t in grads]
        extra = {} if scale is None else {"grad_scale": torch.tensor(scale, device="tpu")}
        for step in range(2):
            if kind == "sgd":
                fn(ps, gs, states[0], **kwargs, **extra)
            else:
                steps = [torch.tensor(float(step + 1), device="tpu") for _ in ps]
                fn(ps, gs, states[0], states[1], [], steps, **kwargs, **extra)
        return [t.cpu() for t in ps + [x for st in states for x in st]]

    g.manual_seed(1)
    one_loop = run(None)
    g.manual_seed(1)
    passes = run(1.0)
    for a, b in zip(one_loop, passes):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["adam_wd_amsgrad", "sgd_nesterov"])
def test_fused_optimizer_many_parameters_match_cpu(name):
    """151 parameter steps, ten of them on views of one storage and one parameter listed
    twice: defer_and_fuse runs the small per-parameter steps of a graph up to 64 at a time
    over the pool (run_independent: here runs of 32, 64 and 46, then the views one at a
    time), and steps whose values meet only one after another (the duplicate sees the
    first update, as in CPU's loop). Every mode must match CPU. (Whether two steps would
    race is timing: this checks the results of the batched path, not the race.)"""
    def run(device):
        torch.manual_seed(0)
        params = [torch.randn(3 + i % 5, 4, dtype=torch.float64) for i in range(140)]
        params.append(torch.randn(40, 8, dtype=torch.float64))
        leaves = [p.to(device).requires_grad_() for p in params]
        for p in leaves:
            p.grad = torch.randn(p.shape, dtype=p.dtype).to(device)
        # ten more parameters that are views of the last one's storage
        views = [leaves[-1].detach()[i * 4:(i + 1) * 4] for i in range(10)]
        for v, g in zip(views, leaves[-1].grad.split(4)):
            v.grad = g
        with warnings.catch_warnings():  # a parameter listed twice: PyTorch warns, then
            warnings.simplefilter("ignore")  # updates it twice, one step after the other
            # (at position 32, where a run of 64 steps is split between two threads)
            opt = FUSED[name](leaves[:32] + [leaves[0]] + leaves[32:-1] + views)
        for _ in range(3):
            opt.step()
        return leaves
    with native("_fused_adam_", "_fused_adamw_", "_fused_sgd_"):
        got = run("tpu")
        torch.tpu.synchronize()
    for t, c in zip(got, run("cpu")):
        close(t.detach(), c.detach())


@pytest.mark.parametrize("fused", ["adamw", "sgd_nesterov"])
def test_fused_optimizer_with_grad_scaler_skips_inf_steps(fused):
    """GradScaler passes grad_scale and found_inf to fused optimizers: the step unscales
    the gradients, and a step whose gradients overflowed changes nothing."""
    def run(device):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3).to(device)
        opt = FUSED[fused](list(m.parameters()))
        scaler = torch.amp.GradScaler(device, init_scale=1024.0)
        x = torch.randn(5, 4).to(device)
        for i in range(3):
            opt.zero_grad()
            loss = m(x).pow(2).sum()
            if i == 1:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach() for p in m.parameters()], scaler.get_scale()

    # the overflow is deliberate: debug mode's NaN/Inf check would stop at it
    with native("_fused_adamw_", "_fused_sgd_"), torchtpu.set_debug_options(nan="off"):
        got, got_scale = run("tpu")
    want, want_scale = run("cpu")
    assert got_scale == want_scale == 512.0
    for t, c in zip(got, want):
        close(t, c)


def test_fused_optimizer_non_contiguous_state_falls_back_correctly():
    """A layout the fused kernel does not take (a non-contiguous parameter) runs the whole
    call through the counted CPU fallback, with the same result."""
    def run(device):
        torch.manual_seed(0)
        base = torch.randn(6, 4).to(device)
        p = base.t().detach().requires_grad_()  # non-contiguous leaf
        p.grad = torch.randn(4, 6).to(device)
        opt = torch.optim.AdamW([p], lr=0.1, fused=True)
        opt.step()
        return p.detach()

    close(run("tpu"), run("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_amp_unscale_matches_cpu(dtype):
    """GradScaler's check-and-unscale: every gradient times inv_scale, found_inf set to 1
    once any gradient held a NaN or Inf (and never cleared)."""
    for bad in (None, float("inf"), float("nan")):
        (gs,) = _lists(1, dtype=dtype)
        if bad is not None:
            gs[1].view(-1)[2] = bad
        results = []
        for device in ("cpu", "tpu"):
            # the non-finite gradient is the point here: debug mode's check would stop at it
            with native("_amp_foreach_non_finite_check_and_unscale_"), \
                    torchtpu.set_debug_options(nan="off" if bad else "raise"):
                g = [t.clone().to(device) for t in gs]
                found = torch.zeros(1, device=device)
                inv = torch.full((1,), 0.125, device=device)
                torch._amp_foreach_non_finite_check_and_unscale_(g, found, inv)
                results.append(([t.cpu() for t in g], found.cpu()))
        (gc, fc), (gt, ft) = results
        assert fc.item() == ft.item() == (0.0 if bad is None else 1.0)
        for t, c in zip(gt, gc):
            torch.testing.assert_close(t, c, equal_nan=True, rtol=0, atol=0)


def test_amp_update_scale_matches_cpu():
    """Back off after an overflow, grow after growth_interval clean steps (if finite)."""
    def run(device):
        scale = torch.full((1,), 2.0 ** 126, device=device)
        tracker = torch.zeros(1, dtype=torch.int32, device=device)
        seen = []
        for found in (0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0):
            f = torch.full((1,), found, device=device)
            with native("_amp_update_scale_"):
                torch._amp_update_scale_(scale, tracker, f, 2.0, 0.5, 2)
            seen.append((scale.cpu().clone(), tracker.cpu().clone()))
        return seen

    for (st, tt), (sc, tc) in zip(run("tpu"), run("cpu")):
        assert torch.equal(st, sc) and torch.equal(tt, tc), (st, sc, tt, tc)


def test_grad_scaler_training_runs_natively():
    """The CUDA-style AMP loop (GradScaler, growth and backoff) on tpu: no CPU fallback and
    the same parameters and scale as CPU."""
    def run(device):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler(device, init_scale=256.0, growth_interval=2)
        x = torch.randn(5, 4).to(device)
        for i in range(5):
            opt.zero_grad()
            loss = m(x).pow(2).sum() * (float("inf") if i == 2 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach() for p in m.parameters()], scaler.get_scale()

    with no_cpu_fallback(), torchtpu.set_debug_options(nan="off"):
        got, got_scale = run("tpu")
    want, want_scale = run("cpu")
    assert got_scale == want_scale
    for t, c in zip(got, want):
        close(t, c)
