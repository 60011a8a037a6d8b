"""The validator's judgment of one model (torchtpu/_validate/runner.py), on small
hand-made models: the tpu runs start from the model as built, and the float64 re-check
of a mismatch accepts integer outputs that equal the CPU's, and takes the CPU's float32
error at every core where one thread's does not clear the mismatch; the tie-order re-check
accepts outputs that match the CPU's with topk/sort ties in index order."""
import copy

import torch
from torch import nn

from torchtpu._validate import models as M
from torchtpu._validate import runner as R


class CachesInAPlainAttribute(nn.Module):
    """Like Mimi's codebooks: the first forward caches a tensor derived from a buffer in
    a plain attribute, which Module.to() does not move."""

    def __init__(self):
        super().__init__()
        self.table = nn.Buffer(torch.arange(12.0).reshape(3, 4))
        self._cache = None

    def forward(self, x):
        if self._cache is None:
            self._cache = self.table * 2
        return x @ self._cache


def test_tpu_runs_start_from_the_model_as_built(monkeypatch):
    built = M.Built(CachesInAPlainAttribute(), [("x", (torch.randn(2, 3),), {})])
    monkeypatch.setattr(M, "build", lambda model_id, variant=0: built)
    monkeypatch.setattr(M, "variants", lambda model_id: 1)
    res = R.run_model("tv/cache/test", modes=("strict", "defer_and_fuse"))
    assert res["status"] == "pass", res["modes"]
    assert built.model._cache is not None  # the CPU reference did fill its own cache


class Labelled(nn.Module):
    def forward(self, x):
        return {"y": x * 3.0, "labels": (x > 0).long()}


def _recheck(labels_equal):
    model, x = Labelled(), torch.randn(64, generator=torch.Generator().manual_seed(0))
    cand = ("x", (x,), {})
    expected = model(x)
    ref64 = x.double() * 3.0
    # a tpu result as far from float64 as the CPU's float32, on the other side
    y = (2 * ref64 - expected["y"].double()).float()
    labels = expected["labels"].clone()
    if not labels_equal:
        labels[0] = 1 - labels[0]
    result = {"modes": {"strict": {"status": "fail", "cause": "mismatch", "detail": "y: ...",
                                   "_tpu_out": {"y": y, "labels": labels}}}}
    R._recheck_in_float64(model, cand, expected, result)
    return result["modes"]["strict"]


def test_float64_recheck_accepts_equal_integer_outputs():
    m = _recheck(labels_equal=True)
    assert m["status"] == "pass" and "ill-conditioned" in m["note"], m


def test_float64_recheck_refuses_different_integer_outputs():
    m = _recheck(labels_equal=False)
    assert m["status"] == "fail" and m["cause"] == "mismatch", m


class Thresholded(nn.Module):
    """Keeps the elements whose triple exceeds 0.3: 0.1 * 3 rounds to exactly 0.3 in float32
    (dropped) and to just above it in float64 (kept), so float32 cannot settle the size."""
    def forward(self, x):
        return {"kept": x[x * 3.0 > 0.3], "y": x * 2.0}


def _recheck_sized(kept_size, x=None):
    model = Thresholded()
    x = torch.tensor([0.1] * 4 + [0.5] * 4) if x is None else x
    cand = ("x", (x,), {})
    expected = model(x)
    result = {"modes": {"strict": {"status": "fail", "cause": "mismatch", "detail": "kept: ...",
                                   "_tpu_out": {"kept": torch.full((kept_size,), 0.5), "y": expected["y"]}}}}
    R._recheck_in_float64(model, cand, expected, result)
    return result["modes"]["strict"]


def test_float64_recheck_accepts_a_size_float32_cannot_settle():
    assert Thresholded()(torch.tensor([0.1] * 4 + [0.5] * 4))["kept"].numel() == 4  # float64 keeps 8
    m = _recheck_sized(6)
    assert m["status"] == "pass" and "ill-conditioned sizes" in m["note"] and "float64 [8]" in m["note"], m


def test_float64_recheck_refuses_a_size_farther_from_float64_than_cpus():
    m = _recheck_sized(3)
    assert m["status"] == "fail" and m["cause"] == "mismatch", m


def test_float64_recheck_refuses_a_size_float32_settles():
    m = _recheck_sized(6, x=torch.tensor([0.2] * 4 + [0.05] * 4))  # CPU and float64 both keep 4
    assert m["status"] == "fail" and m["cause"] == "mismatch", m


class Tripled(nn.Module):
    def forward(self, x):
        return x * 3.0


def _recheck_threads(monkeypatch, cpu_err_at_every_core):
    """The tpu output is 10x the one-thread CPU forward's error from float64; the CPU's
    forward at every core (stubbed) is `cpu_err_at_every_core` times it."""
    model, x = Tripled(), 1000 * torch.randn(64, generator=torch.Generator().manual_seed(0))
    cand = ("x", (x,), {})
    expected = model(x)
    ref64 = x.double() * 3.0
    e1 = float((expected.double() - ref64).abs().max())
    assert e1 > 0
    runs = []
    monkeypatch.setattr(R, "_cpu_forward", lambda m, c, rng_log=None, threads=None:
                        runs.append(threads) or (ref64 + cpu_err_at_every_core * e1).float())
    monkeypatch.setattr(R.os, "cpu_count", lambda: torch.get_num_threads() + 1)
    result = {"modes": {"strict": {"status": "fail", "cause": "mismatch", "detail": "out: ...",
                                   "_tpu_out": {"out": (ref64 + 10 * e1).float()}}}}
    R._recheck_in_float64(model, cand, expected, result)
    assert runs == [torch.get_num_threads() + 1]
    return result["modes"]["strict"]


def test_float64_recheck_takes_the_cpu_error_at_every_core(monkeypatch):
    m = _recheck_threads(monkeypatch, 8)
    assert m["status"] == "pass" and "ill-conditioned" in m["note"], m


def test_float64_recheck_refuses_when_no_cpu_run_is_as_far(monkeypatch):
    m = _recheck_threads(monkeypatch, 2)
    assert m["status"] == "fail" and m["cause"] == "mismatch", m


class TiedRouter(nn.Module):
    """A zero-initialized router: every expert scores the same, so which two topk picks
    is the order of ties, which PyTorch leaves unspecified."""

    def __init__(self, use_topk=True):
        super().__init__()
        self.use_topk = use_topk

    def forward(self, x):
        scores = torch.zeros(x.shape[0], 8)
        if not self.use_topk:
            return x * 2.0
        idx = scores.topk(2, dim=-1).indices
        return x * (idx.sum(-1, keepdim=True) + 1).float()


def _recheck_ties(tpu_picks, use_topk=True):
    model, x = TiedRouter(use_topk), torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    out = x * float(sum(tpu_picks) + 1)
    result = {"modes": {"strict": {"status": "fail", "cause": "mismatch", "detail": "out: ...",
                                   "_tpu_out": {"out": out}}}}
    R._recheck_tie_order(model, ("x", (x,), {}), result)
    return result["modes"]["strict"]


def test_tie_order_recheck_accepts_topk_ties_taken_in_index_order():
    m = _recheck_ties((0, 1))
    assert m["status"] == "pass" and m["note"].startswith("ties:"), m


def test_tie_order_recheck_refuses_other_picks():
    m = _recheck_ties((6, 7))
    assert m["status"] == "fail" and m["cause"] == "mismatch", m


def test_tie_order_recheck_needs_a_topk_or_sort_call():
    m = _recheck_ties((0.5,), use_topk=False)  # x * 1.5 vs the model's x * 2: not about ties
    assert m["status"] == "fail" and m["cause"] == "mismatch", m
    m = _recheck_ties((0.5, 0.5), use_topk=False)  # equal to the model's output, but no tie decided it
    assert m["status"] == "fail" and m["cause"] == "mismatch", m


class MakesItsOwnFloat32(nn.Module):
    """Like DAB-DETR's sine position table: float32 asked for by name inside forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        pos = torch.arange(4, dtype=torch.float32) / 4 + torch.zeros(4).float()
        return x + self.lin(pos.to(torch.float32))


def test_float64_references_take_the_models_own_float32_as_float64():
    model, x = MakesItsOwnFloat32(), torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    try:
        copy.deepcopy(model).double()(x.double())
        raise AssertionError("expected the plain float64 copy to fail on mixed dtypes")
    except RuntimeError:
        pass
    step, _ = R._step64(model, ("x", (x,), {}))
    assert step and all(v.dtype == torch.float64 for v in step.values()), step
    expected = model(x)
    y64 = x.double() + model.lin.double()(torch.arange(4, dtype=torch.float64) / 4)
    model.lin.float()
    result = {"modes": {"strict": {"status": "fail", "cause": "mismatch", "detail": "out: ...",
                                   "_tpu_out": {"out": (2 * y64 - expected.double()).float()}}}}
    R._recheck_in_float64(model, ("x", (x,), {}), expected, result)
    assert result["modes"]["strict"]["status"] == "pass", result
    assert torch.get_default_dtype() == torch.float32


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _train_recheck(wrong):
    """A training-step mismatch re-judged in float64: the tpu gradients are as far from
    the float64 step as the CPU's float32 ones (on the other side), or one is wrong."""
    model = TwoLayer()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    cand = ("x", (x,), {})
    ref = R._cpu_step(model, cand)
    m64 = copy.deepcopy(model).double()
    loss64 = R._loss_of(m64(x.double()))
    loss64.backward()
    tpu = {}
    for path, c in R.flatten(ref):
        r = loss64.detach() if path == "loss" else dict(m64.named_parameters())[path[5:]].grad
        tpu[path] = (2 * r - c.double()).float()
    if wrong:
        tpu["grad.a.bias"] = tpu["grad.a.bias"].clone()
        tpu["grad.a.bias"][3] *= 1.05   # a 5% error in one element
    res = {"modes": {"strict": {"status": "fail", "cause": "mismatch", "detail": "grad.a.bias: ...",
                                "_tpu_out": tpu}}}
    R._recheck_train_in_float64(model, cand, ref, res)
    return res["modes"]["strict"]


def test_train_float64_recheck_accepts_cpu_sized_errors():
    m = _train_recheck(wrong=False)
    assert m["status"] == "pass" and "float64 re-check" in m["note"], m


def test_train_float64_recheck_refuses_a_wrong_gradient():
    m = _train_recheck(wrong=True)
    assert m["status"] == "fail" and m["cause"] == "mismatch", m


def test_train_float64_recheck_takes_the_cpu_error_at_every_core(monkeypatch):
    """The CPU's own float32 error is also taken at PyTorch's default thread count (all
    cores), where long sums split differently: a tpu error 3x the one-thread CPU's passes
    when the all-core CPU step is 2x as far from float64 (bound 2 x 2), not when it is as
    far as the one-thread step."""
    model = TwoLayer()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    cand = ("x", (x,), {})
    step64 = dict(R.flatten(R._cpu_step(copy.deepcopy(model).double(), ("x", (x.double(),), {}))))

    def cpu_at(far):  # a CPU float32 step `far` times 1e-3 (relative) from the float64 one
        out = {path: (r + far * 1e-3 * (1 + r.abs())).float() for path, r in step64.items()}
        return {"loss": out["loss"], "grad": {p[5:]: t for p, t in out.items() if p != "loss"}}

    def recheck(far_all_cores):
        asked = []

        def cpu_step(model, cand, rng_log=None, threads=None):
            asked.append(threads)
            return cpu_at(far_all_cores)
        monkeypatch.setattr(R, "_cpu_step", cpu_step)
        tpu = {path: (r - 3e-3 * (1 + r.abs())).float() for path, r in step64.items()}
        res = {"modes": {"strict": {"status": "fail", "cause": "mismatch", "detail": "grad.a.bias: ...",
                                    "_tpu_out": tpu}}}
        R._recheck_train_in_float64(model, cand, cpu_at(1.0), res)
        return res["modes"]["strict"], asked

    monkeypatch.setattr(R.os, "cpu_count", lambda: 4)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as validation workers run
    try:
        m, asked = recheck(far_all_cores=2.0)
        assert m["status"] == "pass" and asked == [4], (m, asked)
        m, asked = recheck(far_all_cores=1.0)
        assert m["status"] == "fail" and "the CPU float32's" in m["recheck"] and asked == [4], (m, asked)
    finally:
        torch.set_num_threads(before)


class ReluNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.relu, self.b = nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(self.relu(self.a(x)))


def _near_zero_relu():
    """ReluNet, its input, and the ReLU decisions with one flipped: unit 3 of row 0, whose
    float64 input is moved to within float32 rounding of zero (1e-7 of the largest)."""
    model = ReluNet()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pre = x.double() @ model.a.weight.double().t() + model.a.bias.double()
        model.a.bias[3] -= float(pre[0, 3])
        pre = x.double() @ model.a.weight.double().t() + model.a.bias.double()
    assert 0 < abs(float(pre[0, 3])) < 1e-7 * float(pre.abs().max())
    own = pre > 0
    flipped = own.clone()
    flipped[0, 3] = ~flipped[0, 3]
    return model, ("x", (x,), {}), own, flipped


def test_step64_takes_the_tpus_relu_decision_only_near_zero():
    model, cand, own, flipped = _near_zero_relu()
    plain, n0 = R._step64(model, cand)
    same, n1 = R._step64(model, cand, decisions=[own])
    sub, n2 = R._step64(model, cand, decisions=[flipped])
    far = own.clone()
    far[1, 0] = ~far[1, 0]  # an input far from zero keeps float64's decision
    kept, n3 = R._step64(model, cand, decisions=[far])
    assert (n0, n1, n2, n3) == (0, 0, 1, 0)
    assert torch.equal(same["grad.a.bias"], plain["grad.a.bias"])
    assert torch.equal(kept["grad.a.bias"], plain["grad.a.bias"])
    assert not torch.equal(sub["grad.a.bias"], plain["grad.a.bias"])
    assert torch.equal(sub["grad.b.bias"], plain["grad.b.bias"])


def test_relu_decisions_are_the_tpus_relu_inputs_signs():
    model = ReluNet()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    want = (model.a(x) > 0)
    for mode in R.MODES:
        got = R._relu_decisions(model, ("x", (x,), {}), mode)
        assert len(got) == 1 and torch.equal(got[0], want), mode


class LeakyNet(nn.Module):
    """VITS's HiFi-GAN style: functional leaky_relu, in place and not, and torch.relu."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = nn.functional.leaky_relu(self.a(x), 0.1)
        return self.b(torch.relu(nn.functional.leaky_relu(h * 1.0, negative_slope=0.2, inplace=True)))


def test_relu_decisions_cover_functional_leaky_relu_and_torch_relu():
    model, x = LeakyNet(), torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    pre = model.a(x)
    got = R._relu_decisions(model, ("x", (x,), {}), "strict")
    assert len(got) == 3 and all(torch.equal(g, pre > 0) for g in got), got
    # imposed in float64: a flipped decision far from zero is ignored, so the step is the plain one
    far = [g.clone() for g in got]
    far[0][0, 0] = ~far[0][0, 0]
    plain, n0 = R._step64(model, ("x", (x,), {}))
    same, n1 = R._step64(model, ("x", (x,), {}), decisions=far)
    assert (n0, n1) == (0, 0) and all(torch.equal(plain[k], same[k]) for k in plain)


def test_imposed_leaky_relu_decision_takes_the_slope_side():
    x = torch.tensor([[1e-9, 2.0, -3.0]], dtype=torch.float64, requires_grad=True)
    with R._ReluDecisions([torch.tensor([[False, True, False]])]) as mode:
        y = nn.functional.leaky_relu(x, 0.1)
    assert mode.flips == 1 and torch.allclose(y, torch.tensor([[1e-10, 2.0, -0.3]], dtype=torch.float64))
    y.sum().backward()
    assert torch.allclose(x.grad, torch.tensor([[0.1, 1.0, 0.1]], dtype=torch.float64))


def _relu_recheck(monkeypatch, decisions, wrong=False):
    """A training-step mismatch whose tpu gradients are the float64 step with the flipped
    decision plus CPU-sized errors; the CPU float32 step (one thread and all cores) is the
    float64 step with its own decision, 1e-7 (relative) off. The re-check takes the tpu's
    ReLU decisions from _relu_decisions (here `decisions`)."""
    model, cand, own, flipped = _near_zero_relu()
    sub, _ = R._step64(model, cand, decisions=[flipped])
    plain, _ = R._step64(model, cand)
    cpu = {p: (r + 1e-7 * (1 + r.abs())).float() for p, r in plain.items()}
    ref = {"loss": cpu["loss"], "grad": {p[5:]: t for p, t in cpu.items() if p != "loss"}}
    tpu = {p: (sub[p] - 1e-7 * (1 + sub[p].abs())).float() for p in cpu}
    if wrong:
        tpu["grad.a.weight"] = tpu["grad.a.weight"].clone()
        tpu["grad.a.weight"][5, 2] *= 1.05
    monkeypatch.setattr(R, "_cpu_step", lambda *a, **k: ref)
    monkeypatch.setattr(R, "_relu_decisions", lambda *a, **k: [decisions(own, flipped)])
    res = {"modes": {"strict": {"status": "fail", "cause": "mismatch", "detail": "grad.a.bias: ...",
                                "_tpu_out": tpu}}}
    R._recheck_train_in_float64(model, cand, ref, res)
    return res["modes"]["strict"]


def test_train_float64_recheck_takes_the_tpus_relu_decisions(monkeypatch):
    m = _relu_recheck(monkeypatch, lambda own, flipped: flipped)
    assert m["status"] == "pass" and "relu/leaky_relu decisions at 1 input(s)" in m["note"], m


def test_train_float64_recheck_without_a_flip_still_fails(monkeypatch):
    m = _relu_recheck(monkeypatch, lambda own, flipped: own)
    assert m["status"] == "fail" and m["cause"] == "mismatch", m


def test_train_float64_recheck_with_relu_decisions_refuses_a_wrong_gradient(monkeypatch):
    m = _relu_recheck(monkeypatch, lambda own, flipped: flipped, wrong=True)
    assert m["status"] == "fail" and "relu/leaky_relu decisions" in m["recheck"], m


def test_cpu_step_runs_at_the_thread_count_asked():
    seen = []

    class Probe(TwoLayer):
        def forward(self, x):
            seen.append(torch.get_num_threads())
            return super().forward(x)

    before = torch.get_num_threads()
    cand = ("x", (torch.randn(2, 8),), {})
    R._cpu_step(Probe(), cand, threads=before + 1)
    R._cpu_step(Probe(), cand)
    assert seen == [before + 1, before] and torch.get_num_threads() == before


class DrawsNoise(nn.Module):
    """Like VITS or Informer: eval-mode forward draws random numbers (out of place, like a
    tensor, and in place)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        noise = torch.randn_like(x) + torch.empty(x.shape, device=x.device).normal_()
        keep = torch.multinomial(torch.ones(x.shape[-1], device=x.device), 2)
        return self.lin(x + noise)[:, keep]


class DropsOutAlways(nn.Module):
    """Draws inside a C++ kernel (dropout with training=True), which the recorder cannot see."""

    def forward(self, x):
        return torch.nn.functional.dropout(x, 0.5, training=True)


def _run_built(model, monkeypatch, train=False):
    built = M.Built(model, [("x", (torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),), {})])
    monkeypatch.setattr(M, "build", lambda model_id, variant=0: built)
    monkeypatch.setattr(M, "variants", lambda model_id: 1)
    return R.run_model("tv/random/test", modes=("strict", "defer_and_fuse"), train=train)


def test_random_draws_in_forward_are_replayed_on_tpu(monkeypatch):
    res = _run_built(DrawsNoise(), monkeypatch, train=True)
    assert res["status"] == "pass", res
    assert res["random_replayed"] == 3, res
    assert all(m["status"] == "pass" for m in res["train"]["modes"].values()), res["train"]


def test_random_draws_the_recorder_cannot_see_stay_excluded(monkeypatch):
    res = _run_built(DropsOutAlways(), monkeypatch)
    assert res["status"] == "excluded" and "cannot replay" in res["reason"], res


def test_replay_refuses_a_run_that_draws_differently():
    from torchtpu._validate import rng
    _, log = rng.record(lambda: torch.randn(3))
    try:
        rng.replay(lambda: torch.rand(3), log)
    except rng.ReplayMismatch as e:
        assert "rand" in str(e)
    else:
        raise AssertionError("a different random call was answered from the record")


@torch.library.custom_op("torchtpu_test::no_shape_rule", mutates_args=())
def _no_shape_rule(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_no_shape_rule.register_fake
def _(x):
    raise RuntimeError("this op has no shape rule")


class RefusesCompile(nn.Module):
    """Runs eagerly on every device; torch.compile cannot trace it on any (its op's
    FakeTensor rule raises)."""

    def forward(self, x):
        return _no_shape_rule(x) + 1


class GroupedExperts(nn.Module):
    """Like transformers' MoE layers: torch._grouped_mm in float32 on tpu, a matmul per
    group elsewhere (under torch.compile on CPU)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 4, 8))

    def forward(self, x):
        if x.device.type == "tpu":
            offs = torch.tensor([1, 3], dtype=torch.int32, device=x.device)
            return torch._grouped_mm(x, self.w, offs=offs)
        return torch.cat([x[:1] @ self.w[0], x[1:3] @ self.w[1]])


def _run_compiled(model, monkeypatch, train=False):
    built = M.Built(model, [("x", (torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),), {})])
    monkeypatch.setattr(M, "build", lambda model_id, variant=0: built)
    monkeypatch.setattr(M, "variants", lambda model_id: 1)
    return R.run_model("tv/compiled/test", modes=(R.COMPILED,), train=train)


def test_compiled_mode_passes_a_model_that_compiles(monkeypatch):
    res = _run_compiled(GroupedExperts(), monkeypatch, train=True)
    assert res["status"] == "pass", res
    assert res["train"] and res["train"]["modes"][R.COMPILED]["status"] == "pass", res["train"]


def test_compiled_mode_excludes_what_torch_compile_cannot_do_on_cpu_either(monkeypatch):
    res = _run_compiled(RefusesCompile(), monkeypatch)
    assert res["status"] == "excluded", res
    assert "aot_eager" in res["reason"] and "no shape rule" in res["reason"], res


def test_compiled_mode_fails_what_only_the_tpu_cannot_compile(monkeypatch):
    """Without torchtpu's FakeTensor rule for _grouped_mm, tracing fails on tpu but not on
    CPU (where PyTorch's meta function is not asked: the CPU aot_eager run traces the
    same model): a failure, not an exclusion."""
    from torch._subclasses import fake_tensor

    from torchtpu import compile as C
    monkeypatch.setattr(fake_tensor, "op_implementations_checks",
                        [(c, i) for c, i in fake_tensor.op_implementations_checks if i is not C._grouped_mm_fake])
    res = _run_compiled(GroupedExperts(), monkeypatch)
    assert res["status"] == "fail" and res["modes"][R.COMPILED]["cause"] == "exception", res


class CompilesOtherwise(nn.Module):
    """Like a transformers model with a branch on is_compiling(): torch.compile itself
    changes the result, on every device."""

    def forward(self, x):
        return x * (3.0 if torch.compiler.is_compiling() else 2.0)


def test_compiled_mode_is_judged_against_cpu_compiled_where_compile_changes_the_result(monkeypatch):
    res = _run_compiled(CompilesOtherwise(), monkeypatch, train=True)
    assert res["status"] == "pass", res
    assert res["modes"][R.COMPILED]["note"].startswith("compiled on CPU too"), res


def test_compiled_mode_fails_a_result_unlike_cpu_compiled_too(monkeypatch):
    """The tpu's compiled output is wrong (here made so): it matches neither CPU eager nor
    CPU's compiled result."""
    orig = R.call

    def wrong_on_tpu(model, cand, rng_log=None):
        out = orig(model, cand, rng_log)
        return out + 1 if isinstance(out, torch.Tensor) and out.device.type == "tpu" else out
    monkeypatch.setattr(R, "call", wrong_on_tpu)
    res = _run_compiled(CompilesOtherwise(), monkeypatch)
    assert res["status"] == "fail" and res["modes"][R.COMPILED]["cause"] == "mismatch", res
