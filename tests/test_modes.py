"""The three eager modes: API, equal results, defer_and_fuse's cuts/fusion/plan cache and
memory, debug's checks and trace, strict's asynchronous errors."""
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from tolerances import assert_close

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import train_cnn  # noqa: E402
import train_gpt  # noqa: E402
import train_mlp  # noqa: E402

MODES = ["strict", "debug", "defer_and_fuse"]


def test_mode_api():
    start = torchtpu.get_eager_mode()
    with torchtpu.set_eager_mode("defer_and_fuse"):
        assert torchtpu.get_eager_mode() == "defer_and_fuse"
        with torchtpu.eager_mode("debug"):
            assert torchtpu.get_eager_mode() == "debug"
        assert torchtpu.get_eager_mode() == "defer_and_fuse"
    assert torchtpu.get_eager_mode() == start
    with pytest.raises(ValueError, match="eager mode"):
        torchtpu.set_eager_mode("fast")


@pytest.mark.parametrize("env,expect", [({"TORCHTPU_EAGER_MODE": "defer_and_fuse"}, "defer_and_fuse"),
                                        ({"TPU_LAUNCH_BLOCKING": "1"}, "debug")])
def test_mode_from_environment(env, expect):
    e = {k: v for k, v in os.environ.items() if k not in ("TORCHTPU_EAGER_MODE", "TPU_LAUNCH_BLOCKING")}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", "import torch, torchtpu; print(torchtpu.get_eager_mode())"],
                         capture_output=True, text=True, env=e, timeout=120)
    assert out.stdout.strip() == expect, out.stderr


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("mod", [train_mlp, train_cnn, train_gpt], ids=["mlp", "cnn", "gpt"])
def test_training_matches_strict(mode, mod):
    with torchtpu.set_eager_mode("strict"):
        ref = mod.run(torch.device("tpu"), steps=8)
    with torchtpu.set_eager_mode(mode):
        got = mod.run(torch.device("tpu"), steps=8)
    # Fusion keeps every op's rounding (intermediates round through their dtype), so the
    # modes agree to float32 reassociation at most.
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-5, atol=1e-6)


def _chain(x):
    return (F.gelu(x * 2.0 + 1.0) - x).exp().mul(0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_defer_fuses_elementwise_chain_exactly(dtype):
    x = torch.randn(300, 129).to(dtype)
    with torchtpu.set_eager_mode("strict"):
        ref = _chain(x.to("tpu")).cpu()
    torchtpu.explain(clear=True)
    with torchtpu.set_eager_mode("defer_and_fuse"):
        got = _chain(x.to("tpu")).cpu()
    assert torch.equal(got, ref)  # same ops, same roundings: bit-identical
    cuts = torchtpu.explain()
    assert len(cuts) == 1
    c = cuts[0]
    assert c["fused_groups"] == 1 and c["fused_ops"] >= 6 and c["internal_values"] >= 5
    assert "host read" in c["reason"] and "test_modes.py" in c["site"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_defer_fuses_large_groups_exactly(dtype):
    """Groups over more than 65,536 elements run in L2-sized tiles (several per row where
    the dims merge into one long row), one chain per group:
    results stay bit-identical to strict with a broadcast operand, a transposed (strided)
    input, a mixed-dtype operand and in-place updates, and two unrelated chains of one
    large shape get a group each."""
    torch.manual_seed(0)
    p, m = torch.randn(300, 301).to(dtype), torch.randn(300, 301).to(dtype)
    g, row = torch.randn(301, 300).to(dtype).t(), torch.rand(301)
    half, other = torch.randn(300, 301).to(torch.float16), torch.randn(300, 301).to(dtype)

    def f(p, m, g, row, half, other):
        p.mul_(0.99)
        m.lerp_(g, 0.1)
        p.addcdiv_(m, (m * m + row).sqrt().add_(1e-3), value=-0.01)
        q = (half * 2 + other).exp().mul(0.5)  # touches no value of the first: a group of its own
        return p, m, q

    with torchtpu.set_eager_mode("strict"):
        ref = [t.cpu() for t in f(*(t.to("tpu") for t in (p, m, g, row, half, other)))]
    torchtpu.explain(clear=True)
    with torchtpu.set_eager_mode("defer_and_fuse"):
        got = [t.cpu() for t in f(*(t.to("tpu") for t in (p, m, g, row, half, other)))]
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    assert sum(c["fused_groups"] for c in torchtpu.explain()) >= 2
    cpu = f(*(t.clone() for t in (p, m, g, row, half, other)))  # the scalars' values too
    for a, b in zip(got, cpu):
        assert_close(a, b)  # the project table: bf16 ops round differently on CPU


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_defer_large_group_reads_an_input_many_times(dtype):
    """AdamW's chain in narrow dtypes: the gradient is read by three members (one
    conversion per tile, shared), a float64 member reads it too (its own conversion), and
    bf16 members that are stored are rounded and stored in one pass; bit-identical to
    strict."""
    torch.manual_seed(1)
    p, g, m, v = (torch.randn(300, 301).to(dtype) for _ in range(4))
    v, q = v.abs(), torch.randn(300, 301, dtype=torch.float64)

    def f(p, g, m, v, q):
        p.mul_(0.99)
        m.lerp_(g, 0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.addcdiv_(m, (v.sqrt() / 0.5).add_(1e-3), value=-0.01)
        w = (g * q).exp()  # computes in float64
        return p, m, v, w

    with torchtpu.set_eager_mode("strict"):
        ref = [t.cpu() for t in f(*(t.to("tpu") for t in (p, g, m, v, q)))]
    torchtpu.explain(clear=True)
    with torchtpu.set_eager_mode("defer_and_fuse"):
        got = [t.cpu() for t in f(*(t.to("tpu") for t in (p, g, m, v, q)))]
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    assert sum(c["fused_groups"] for c in torchtpu.explain()) >= 1


def test_defer_respects_aliasing_and_inplace():
    x = torch.randn(64, 64)
    def f(t):
        y = t * 2
        t.add_(1)             # in place on an input read earlier in the chain
        z = y + t
        v = t.t()             # a different view of a value written in the group
        w = v * 3             # must not be fused against t's in-place write
        t.mul_(w.t())
        return z, t
    with torchtpu.set_eager_mode("strict"):
        a = [r.cpu() for r in f(x.to("tpu"))]
    with torchtpu.set_eager_mode("defer_and_fuse"):
        b = [r.cpu() for r in f(x.to("tpu"))]
    for p, q in zip(a, b):
        assert torch.equal(p, q)
    assert torch.equal(a[0], x * 2 + (x + 1))


@pytest.mark.parametrize("shape", [(64, 96), (3, 5, 1100), (2, 7)])
def test_defer_fuses_row_reductions_into_groups(shape):
    """An elementwise chain ending in softmax / log_softmax / layer norm over the last dim
    runs as one fused group (the reduction consumes each row while it is in cache), with
    results bit-identical to strict; the chain's output never reaches memory."""
    torch.manual_seed(0)
    x, y = torch.randn(shape), torch.randn(shape)
    w, b = torch.randn(shape[-1]), torch.randn(shape[-1])

    def f(x, y, w, b):
        h = F.gelu(x) * torch.sigmoid(y) + 0.5 * x
        ln = F.layer_norm(h, shape[-1:], w, b)
        sm = torch.softmax(ln * 2 - y, -1)
        lsm = torch.log_softmax(sm + x, -1)
        return ln, sm, lsm

    def run(mode):
        with torchtpu.set_eager_mode(mode):
            args = [t.to("tpu") for t in (x, y, w, b)]
            torch.tpu.synchronize()
            torchtpu.explain(clear=True)
            return [r.cpu() for r in f(*args)]
    ref = run("strict")
    got = run("defer_and_fuse")
    for a, g in zip(ref, got):
        assert torch.equal(a, g)
    cpu = f(x, y, w, b)
    for a, c in zip(got, cpu):
        assert_close(a, c)
    c = torchtpu.explain()[0]
    assert c["fused_reductions"] == 3, str(torchtpu.explain())
    assert c["kernels"] == 3 and c["internal_values"] >= 5


def test_defer_row_reduction_with_dead_output():
    """A group-ending reduction whose result nobody keeps (a discarded softmax, a layer
    norm read only for its statistics) still writes its outputs (it crashed when they were
    taken for group-internal values)."""
    x = torch.randn(32, 40)

    def f(t):
        torch.softmax(t * 2.0, -1)  # result discarded
        _, mu, rs = torch.native_layer_norm(t + 1.0, (40,), None, None, 1e-5)
        return mu, rs

    with torchtpu.set_eager_mode("strict"):
        ref = [r.cpu() for r in f(x.to("tpu"))]
    with torchtpu.set_eager_mode("defer_and_fuse"):
        xd = x.to("tpu")
        torch.tpu.synchronize()
        torchtpu.explain(clear=True)
        got = [r.cpu() for r in f(xd)]
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    assert torchtpu.explain()[-1]["fused_reductions"] == 2, str(torchtpu.explain())


def test_defer_donates_dead_inputs_outside_groups():
    """An elementwise op that cannot join a group (its neighbours are not elementwise)
    writes into the buffer of an input that dies with it: no new memory, same result."""
    x = torch.randn(256, 300)

    def g(t):
        for _ in range(4):
            t = torch.cumsum(t, 1).sin()  # cumsum is not fusable: each sin stands alone
        return t

    with torchtpu.set_eager_mode("strict"):
        ref = g(x.to("tpu")).cpu()
    with torchtpu.set_eager_mode("defer_and_fuse"):
        xd = x.to("tpu")
        torch.tpu.synchronize()
        torchtpu.explain(clear=True)
        got = g(xd).cpu()
    assert torch.equal(ref, got)
    cut = torchtpu.explain()[-1]
    assert cut["kernels"] == 8 and cut["donated"] == 4, str(torchtpu.explain())


def test_defer_groups_whole_chains_issued_op_major():
    """A foreach optimizer issues each op over all parameters before the next op: the
    groups must hold whole per-parameter chains (temporaries internal), not one op over
    many parameters, and compute exactly what strict computes."""
    torch.manual_seed(0)
    ps = [torch.randn(32, 48) for _ in range(12)]
    gs = [torch.randn(32, 48) for _ in range(12)]

    def step(ps, gs):
        torch._foreach_mul_(ps, 0.99)
        t = torch._foreach_sqrt(torch._foreach_abs(gs))
        torch._foreach_add_(t, 1e-3)
        torch._foreach_addcdiv_(ps, gs, t, value=-0.1)

    def run(mode):
        with torchtpu.set_eager_mode(mode):
            p = [x.to("tpu") for x in ps]
            g = [x.to("tpu") for x in gs]
            torch.tpu.synchronize()
            torchtpu.explain(clear=True)
            step(p, g)
            return [x.cpu() for x in p]
    ref = run("strict")
    got = run("defer_and_fuse")
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    c = torchtpu.explain()[0]
    assert c["ops"] == 5 * 12 and c["kernels"] <= 2, str(torchtpu.explain())
    assert c["internal_values"] == 3 * 12  # abs, sqrt, add_ results never reach memory


def test_defer_runs_linked_chains_in_program_order():
    """A merged group runs its components one after another (chain-major): chains that
    one op links (here chain i reads chain n-1-i's tensor), or that share one storage,
    are one component and keep program order, so the result is exactly strict's."""
    torch.manual_seed(0)
    n = 10
    ps = [torch.randn(16, 16) for _ in range(n)]
    qs = [torch.randn(16, 16) for _ in range(n)]
    flat = torch.randn(n * 64)

    def step(ps, qs, flat):
        torch._foreach_mul_(ps, 0.5)
        torch._foreach_add_(qs, ps)
        torch._foreach_mul_(ps, qs[::-1])  # links chain i with chain n-1-i
        torch._foreach_addcmul_(qs, ps, ps, value=0.25)
        views = list(flat.split(64))      # chains over one storage
        torch._foreach_mul_(views, 1.5)
        torch._foreach_add_(views, views[::-1])

    def run(mode):
        with torchtpu.set_eager_mode(mode):
            p, q = [x.to("tpu") for x in ps], [x.to("tpu") for x in qs]
            f = flat.to("tpu")
            step(p, q, f)
            return [x.cpu() for x in p + q + [f]]
    for a, b in zip(run("strict"), run("defer_and_fuse")):
        assert torch.equal(a, b)


def test_defer_loop_detection_and_plan_cache():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16, device="tpu"), torch.randn(8, 1, device="tpu")
    with torchtpu.set_eager_mode("defer_and_fuse"):
        torchtpu.explain(clear=True)
        for _ in range(8):  # no host reads: cuts come from loop detection and backward
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x), y).backward()
            opt.step()
        torch.tpu.synchronize()
        cuts = torchtpu.explain()
    assert any("loop detected" in c["reason"] for c in cuts)
    # the first steps differ (optimizer state is created, liveness settles); then every
    # step's graph is a cache hit
    assert cuts.plan_cache_hits >= 3 and not any(c["cache_hit"] is False for c in list(cuts)[4:-1]), str(cuts)
    assert cuts.plans_built <= 5, str(cuts)
    assert sum(c["fused_groups"] for c in cuts) > 0


def test_defer_loop_detection_op_major_optimizer():
    """A foreach optimizer issues each op for every parameter in a row, so an op's previous
    occurrence is one parameter back, not one step: loop detection must still find the
    step (and not leave every cut to the size limit, whose phase drifts, so no plan hits)."""
    torch.manual_seed(0)
    params = [torch.randn(8, 8, device="tpu", requires_grad=True) for _ in range(40)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    with torchtpu.set_eager_mode("defer_and_fuse"):
        opt.step()
        torch.tpu.synchronize()
        torchtpu.explain(clear=True)
        for _ in range(6):  # no host reads
            opt.step()
        torch.tpu.synchronize()
        cuts = torchtpu.explain()
    reasons = [c["reason"] for c in cuts]
    assert any("loop detected" in r for r in reasons), str(cuts)
    assert not any("size limit" in r for r in reasons), str(cuts)
    assert cuts.plan_cache_hits >= 3, str(cuts)


def test_explain_names_line_and_op_of_heuristic_cuts():
    """Loop-detection cuts happen inside an op's submission; explain() still names the
    graph's last op and the Python line: the op's own line on the Python thread, and the
    line that called backward() for cuts on the autograd engine's thread."""
    torch.manual_seed(0)
    model = train_gpt.make_model(d=32, heads=2, layers=4, ctx=16).to("tpu")
    x = torch.randn(4, 16, device="tpu")
    with torchtpu.set_eager_mode("defer_and_fuse"):
        torchtpu.explain(clear=True)
        for _ in range(6):  # a body of 18 different ops (loop detection needs >= 16)
            x = (x * 0.5 + 0.25).tanh().sigmoid().exp().neg().abs().sqrt().add(1).mul(2).sub(1).relu().square().log1p().cos().sin().reciprocal().atan().softmax(-1)  # LOOP LINE
        torch.tpu.synchronize()
        fwd_cuts = [c for c in torchtpu.explain() if "loop detected" in c["reason"]]
        torchtpu.explain(clear=True)
        model(torch.randint(0, 128, (2, 16), device="tpu")).sum().backward()  # BACKWARD LINE
        torch.tpu.synchronize()
        bwd_cuts = [c for c in torchtpu.explain() if "loop detected" in c["reason"]]
    src = open(__file__).read().splitlines()
    loop_line = next(i + 1 for i, t in enumerate(src) if t.rstrip().endswith("# LOOP LINE"))
    bwd_line = next(i + 1 for i, t in enumerate(src) if t.rstrip().endswith("# BACKWARD LINE"))
    assert fwd_cuts and bwd_cuts, (fwd_cuts, bwd_cuts)
    for c in fwd_cuts:
        assert c["site"].startswith(f"{__file__}:{loop_line} in "), c
        assert c["last_op"], c
    for c in bwd_cuts:  # the engine's thread runs no Python: the backward() call is named
        assert c["site"].startswith(f"backward of {__file__}:{bwd_line} in "), c
        assert c["last_op"], c


def test_defer_lower_peak_memory():
    x = torch.randn(1 << 18)
    def run(mode):
        with torchtpu.set_eager_mode(mode):
            t = x.to("tpu")
            torch.tpu.synchronize()
            torch.tpu.reset_peak_memory_stats()
            base = torch.tpu.memory_allocated()
            r = _chain(_chain(t)).sum().item()
            return r, torch.tpu.max_memory_allocated() - base
    (rs, ps), (rd, pd) = run("strict"), run("defer_and_fuse")
    assert rs == rd
    assert pd < ps / 2, (ps, pd)


_PRODUCTS = ("import torch, torchtpu\ntorch.manual_seed(0)\n"
             "x = torch.randn(128, 256)\nws = [torch.randn(256, 256) / 16 for _ in range(3)]\n"
             "def run(dev):\n    h = x.to(dev)\n"
             "    for w in ws:\n        h = (h @ w.to(dev)).relu() * 0.5 + 0.1\n    return h.cpu()\n"
             "torchtpu.set_eager_mode('defer_and_fuse')\ntorchtpu.explain(clear=True)\nout = run('tpu')\n"
             "cuts = torchtpu.explain()\n"
             "print([c['reason'].split(':')[0] for c in cuts], [c['fused_ops'] for c in cuts])\n"
             "torchtpu.set_eager_mode('strict')\nprint(torch.equal(out, run('tpu')))\n")


@pytest.mark.parametrize("macs", [None, "0"])
def test_defer_cuts_before_a_product_once_work_is_recorded(macs):
    """Three 128x256x256 products (8.4M multiply-adds each) with an elementwise tail: each
    product after the first starts a new graph (TORCHTPU_GRAPH_CUT_MACS, default 8e6), so
    the queue thread can run the first while the rest is recorded; each tail still fuses
    within its graph, and the result equals strict's. 0 turns the cut off. (A fresh process:
    its first graph is planned before any kernel ran, and fuses all the same.)"""
    env = dict(os.environ)
    env.pop("TORCHTPU_GRAPH_CUT_MACS", None)
    if macs is not None:
        env["TORCHTPU_GRAPH_CUT_MACS"] = macs
    out = subprocess.run([sys.executable, "-c", _PRODUCTS], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    reasons, fused = out.stdout.splitlines()[0].split("] [")
    if macs is None:
        assert reasons == "['work to start on', 'work to start on', 'host read (.item(), .cpu(), print, ...)'", out.stdout
        assert fused == "3, 3, 3]", out.stdout  # relu, mul, add of each product
    else:
        assert reasons == "['host read (.item(), .cpu(), print, ...)'", out.stdout
        assert fused == "9]", out.stdout
    assert out.stdout.splitlines()[1] == "True"


def test_defer_out_of_memory_surfaces_at_read():
    code = ("import torch, torchtpu\ntorchtpu.set_eager_mode('defer_and_fuse')\n"
            "x = torch.empty(1 << 22, device='tpu').fill_(1.0)\n"
            "try:\n    x.sum().item()\nexcept torch.OutOfMemoryError as e:\n    print('OOM', 'fill_' in str(e))\n"
            "print(torch.ones(4, device='tpu').sum().item())\n")
    env = dict(os.environ, TORCHTPU_HBM_BYTES=str(1 << 20))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "OOM True" in out.stdout and "4.0" in out.stdout


def test_debug_nan_check_names_op_and_line():
    with torchtpu.set_eager_mode("debug"):
        z = torch.zeros(3, device="tpu")
        with torchtpu.set_debug_options(nan="raise"):
            with pytest.raises(RuntimeError, match=r"div.*test_modes.py:\d+.*NaN"):
                z / z
        with torchtpu.set_debug_options(nan="warn"):
            with pytest.warns(UserWarning, match=r"log.*0 NaN and 3 Inf"):
                torch.log(z)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.complex64, torch.complex128])
def test_debug_nan_check_finds_one_bad_element(dtype):
    # One -Inf among many finite values (the largest finite ones included), in a dense
    # output and in an in-place op's strided output; exact counts name what was found.
    # (Complex log runs on the CPU fallback: the check then names the copy back.)
    op = "" if dtype.is_complex else "log"
    big = torch.finfo(dtype).max if dtype.is_floating_point else torch.finfo(torch.float32).max
    t = torch.ones(37, 53, dtype=dtype)
    t[0, 0] = big
    t[36, 51] = 0
    with torchtpu.set_eager_mode("debug"), torchtpu.set_debug_options(nan="raise"):
        d = t.to("tpu")
        torch.abs(d)  # finite, largest value included: no error
        with pytest.raises(RuntimeError, match=op + r".*0 NaN and 1 Inf"):
            torch.log(d)
        col = d[:, 51]
        with pytest.raises(RuntimeError, match=op + r".*0 NaN and 1 Inf"):
            col.log_()


def test_debug_trace_and_fallback_path():
    with torchtpu.set_eager_mode("debug"):
        torchtpu.trace(clear=True)
        a = torch.ones(2, 3, device="tpu")
        (a + 1).sum()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.special.bessel_j0(a)
        tr = torchtpu.trace()
    ops = [r["op"] for r in tr]
    assert "add.Tensor" in ops and "sum" in ops
    add = tr[ops.index("add.Tensor")]
    assert add["shapes"].startswith("float32[2, 3]") and "test_modes.py" in add["site"] and add["us"] >= 0
    assert any(r["path"] == "fallback" and "bessel_j0" in r["op"] for r in tr)


def test_strict_async_error_surfaces_at_sync_naming_op():
    with torchtpu.set_eager_mode("strict"):
        x = torch.randn(4, 3, device="tpu")
        idx = torch.tensor([[0, 7, 1]], device="tpu")
        y = torch.gather(x, 0, idx)  # queued; the bad index is found when it runs
        with pytest.raises(RuntimeError, match=r"gather.*index 7 is out of bounds"):
            y.cpu()
        assert torch.ones(2, device="tpu").sum().item() == 2.0  # the device stays usable


def test_varying_sequence_lengths_plan_count():
    """A new shape builds a new plan; a repeated one does not (reported in docs/modes.md)."""
    torch.manual_seed(0)
    model = train_gpt.make_model(ctx=64).to("tpu")
    with torchtpu.set_eager_mode("defer_and_fuse"):
        torchtpu.explain(clear=True)
        for t in [16, 24, 32, 16, 24, 32]:
            model(torch.randint(0, 128, (2, t), device="tpu")).sum().item()
        cuts = torchtpu.explain()
    assert cuts.plans_built == 3 and cuts.plan_cache_hits == 3, str(cuts)


def test_defer_cuts_at_end_of_backward():
    """The end of backward is a cut point: the backward graph is queued while Python traces
    the optimizer step, and explain() names the line that called backward()."""
    model = torch.nn.Linear(8, 4).to("tpu")
    x = torch.randn(2, 8, device="tpu")
    with torchtpu.set_eager_mode("defer_and_fuse"):
        torchtpu.explain(clear=True)
        model(x).square().sum().backward()
        cuts = torchtpu.explain()
        grad = model.weight.grad.cpu()
    assert [c["reason"] for c in cuts] == ["end of backward"], str(cuts)
    assert "test_modes.py" in cuts[0]["site"]
    model.weight.grad = None
    model(x).square().sum().backward()  # strict: no cut machinery involved
    torch.testing.assert_close(grad, model.weight.grad.cpu())
    # torch.autograd.grad cuts too
    with torchtpu.set_eager_mode("defer_and_fuse"):
        torchtpu.explain(clear=True)
        (g,) = torch.autograd.grad(model(x).sum(), model.weight)
        assert [c["reason"] for c in torchtpu.explain()] == ["end of backward"]


def test_strict_run_ahead_bounded_by_bytes():
    """strict mode's queue holds each queued op's outputs alive until it runs; past 4 MiB
    of them (TORCHTPU_QUEUE_BYTES) the host waits for the queue to drain, so a loop of
    large ops keeps at most two in flight instead of 32 (their memory, and their cache
    footprint: a 1M-element relu ran 3x slower with a deep queue)."""
    n = 1 << 20  # 4 MiB per float32 tensor
    with torchtpu.eager_mode("strict"):
        a = torch.ones(n, device="tpu")
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        base = torch.tpu.memory_allocated()
        for _ in range(40):
            c = torch.exp(torch.exp(a))  # slow enough that the host runs ahead
        torch.tpu.synchronize()
        peak = torch.tpu.max_memory_allocated() - base
        assert c.cpu()[0].item() == pytest.approx(15.154, rel=1e-4)
    # in flight: at most two nodes' outputs, plus the intermediate the next op reads
    assert peak <= 4 * n * 4, f"peak {peak / 2**20:.1f} MiB above the input"
