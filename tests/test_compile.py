"""torch.compile on tpu: the "tpu" Dynamo backend, and plain torch.compile (Inductor's
default) routed to it for regions with tpu inputs. Results are compared with eager
execution of the same model on tpu (the f32 row of the tolerance table), and training
losses with CPU eager as tests/test_models.py does."""
import copy
import os
import sys

import pytest
import torch

import torchtpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import train_gpt  # noqa: E402
from op_helpers import close  # noqa: E402
from tolerances import assert_close  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _gpt_and_batch():
    model = train_gpt.make_model(d=32, heads=2, layers=2, ctx=16).to("tpu")
    x, y = train_gpt.make_batches(4, 16)(0)
    return model, x.to("tpu"), y.to("tpu")


@pytest.mark.parametrize("backend", ["tpu", None])  # None: torch.compile's default, Inductor
def test_compiled_forward_and_backward_match_eager(backend, no_fallback):
    model, x, y = _gpt_and_batch()
    loss = train_gpt.loss_fn(model(x), y)
    loss.backward()
    ref_loss, ref_grads = loss.detach().cpu(), [p.grad.cpu() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model) if backend is None else torch.compile(model, backend=backend)
    for _ in range(2):  # the second call runs the cached compiled graphs
        model.zero_grad(set_to_none=True)
        loss = train_gpt.loss_fn(compiled(x), y)
        loss.backward()
    assert_close(loss.detach().cpu(), ref_loss)
    for p, g in zip(model.parameters(), ref_grads):
        assert_close(p.grad.cpu(), g)


def test_compiled_training_matches_cpu_eager(no_fallback):
    """20 AdamW steps of the GPT example with the model compiled, against CPU eager."""
    def run(device, compile_):
        model = train_gpt.make_model(d=32, heads=2, layers=2, ctx=16).to(device)
        step_model = torch.compile(model, backend="tpu") if compile_ else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        batches, losses = train_gpt.make_batches(4, 16), []
        for s in range(20):
            x, y = (t.to(device) for t in batches(s))
            opt.zero_grad(set_to_none=True)
            loss = train_gpt.loss_fn(step_model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses
    cpu, tpu = run("cpu", False), run("tpu", True)
    torch.testing.assert_close(torch.tensor(tpu), torch.tensor(cpu), rtol=2e-3, atol=1e-4)
    assert tpu[-1] < tpu[0]


def test_compiled_region_replays_cached_plans():
    """In defer_and_fuse, a compiled region's graph is planned once: later calls hit the
    plan cache and build no plan."""
    model, x, _ = _gpt_and_batch()
    compiled = torch.compile(model, backend="tpu")
    with torch.no_grad(), torchtpu.set_eager_mode("defer_and_fuse"):
        for _ in range(3):
            compiled(x).sum().item()
        torchtpu.explain(clear=True)
        for _ in range(3):
            compiled(x).sum().item()
        cuts = torchtpu.explain()
    assert cuts.plans_built == 0 and cuts.plan_cache_hits >= 3, str(cuts)


def test_compile_errors_name_the_problem():
    """A region whose op fails on tpu raises a Python error naming it; nothing aborts."""
    def f(a, b):
        return a @ b

    g = torch.compile(f, backend="tpu")
    with pytest.raises(Exception, match=r"(?i)shape|size|mat"):
        g(torch.randn(2, 3, device="tpu"), torch.randn(4, 5, device="tpu"))
    assert g(torch.ones(2, 3, device="tpu"), torch.ones(3, 1, device="tpu")).sum().item() == 6.0


def test_compiled_in_every_eager_mode(no_fallback):
    model, x, _ = _gpt_and_batch()
    with torch.no_grad():
        ref = model(x).cpu()
        for mode in torchtpu.modes.MODES:
            with torchtpu.set_eager_mode(mode):
                torch._dynamo.reset()
                assert_close(torch.compile(model, backend="tpu")(x).cpu(), ref)


@pytest.mark.parametrize("train", [False, True])
def test_compiled_batch_norm_runs_natively(train, no_fallback):
    """AOTAutograd's graphs call _native_batch_norm_legit (eval and training, with the
    running statistics updated), which runs on tpu's batch norm node."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).train(train)
    x = torch.randn(4, 3, 10, 10)
    dev_model = copy.deepcopy(model).to("tpu")
    ref = model(x)
    out = torch.compile(dev_model, backend="tpu")(x.to("tpu"))
    assert_close(out.detach().cpu(), ref.detach())
    if train:
        ref.sum().backward()
        out.sum().backward()
        close(dev_model[0].weight.grad, model[0].weight.grad, scale=4)
    assert_close(dev_model[1].running_mean.cpu(), model[1].running_mean)
    assert_close(dev_model[1].running_var.cpu(), model[1].running_var)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_grouped_mm_in_any_float_dtype(dtype, no_fallback):
    """torch._grouped_mm (transformers' MoE experts call it on tpu in any dtype): PyTorch's
    meta function allows only CUDA's bfloat16/float16, so tracing float32 failed; torchtpu's
    FakeTensor rule for tpu tensors (torchtpu/compile.py) lets it through. Forward and
    backward vs CPU eager."""
    torch.manual_seed(0)
    x, w = torch.randn(10, 16).to(dtype).requires_grad_(), torch.randn(3, 16, 8).to(dtype).requires_grad_()
    offs = torch.tensor([3, 7, 10], dtype=torch.int32)

    def f(x, w, offs):
        return torch._grouped_mm(x, w, offs=offs).relu()
    ref = f(x, w, offs)
    ref.sum().backward()
    xt, wt = x.detach().to("tpu").requires_grad_(), w.detach().to("tpu").requires_grad_()
    out = torch.compile(f, backend="tpu")(xt, wt, offs.to("tpu"))
    out.sum().backward()
    assert_close(out.detach().cpu(), ref.detach())
    close(xt.grad, x.grad, scale=4)
    close(wt.grad, w.grad, scale=4)


def test_compiled_attention_with_dynamic_shapes(no_fallback):
    """With symbolic sizes (dynamic=True, or Dynamo's automatic dynamic shapes after a
    size change, as LightGlue's varying keypoint counts trigger), the attention backend
    choice cannot dry-run the fused kernel: it takes the math composition, which serves
    every size; results match eager for each sequence length."""
    def f(q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    g = torch.compile(f, backend="tpu", dynamic=True)
    for n in (7, 12):
        torch.manual_seed(n)
        q, k, v = (torch.randn(2, 4, n, 16) for _ in range(3))
        mask = torch.rand(2, 1, 1, n) > 0.3
        assert_close(g(*(t.to("tpu") for t in (q, k, v, mask))).cpu(), f(q, k, v, mask))


def test_compiled_output_made_by_reshaping_a_matmul_can_be_written_in_place(no_fallback):
    """A region's output that _unsafe_view made from a matmul's result is not a view for
    autograd, so code after a graph break may write it in place and backpropagate
    (Chameleon masks image tokens in its logits so). The attention over transposed inputs,
    whose result is transposed back and viewed, is the case the view -> reshape rewrite is
    for (PyTorch's meta function gives its output the query's dim order, the tpu kernel a
    contiguous one)."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lm = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50, bias=False)

        def forward(self, ids):
            h = self.emb(ids)
            q = h.view(2, 8, 2, 8).transpose(1, 2)  # [batch, heads, seq, dim], seq-major in memory
            a = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            h = h + a.transpose(1, 2).contiguous().view(2, 8, 16)
            logits = self.lm(h)
            torch._dynamo.graph_break()
            logits[:, :, [3, 4, 5]] = torch.finfo(logits.dtype).min
            return logits

    torch.manual_seed(0)
    model, ids = M(), torch.randint(0, 50, (2, 8))
    ref = model(ids)
    ref.mean().backward()
    dev = copy.deepcopy(model).to("tpu")
    dev.zero_grad()
    out = torch.compile(dev, backend="tpu")(ids.to("tpu"))
    out.mean().backward()
    assert_close(out.detach().cpu(), ref.detach())
    for (name, p), (_, q) in zip(model.named_parameters(), dev.named_parameters()):
        assert_close(q.grad.cpu(), p.grad, msg=name)


def test_fake_tensors_reaching_kernels_raise_not_crash():
    """FakeTensor tracing runs scaled_dot_product_attention's backend choice on tpu with
    storage-less tensors (it answers from the layout: the fused kernel here), and a
    FakeTensor that bypasses the fake mode into a tpu kernel raises a Python error instead
    of crashing the process."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    x = torch.randn(2, 2, 8, 4, device="tpu")
    gm = make_fx(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q),
                 tracing_mode="fake")(x)
    assert any("fused_attention_overrideable" in str(n.target) for n in gm.graph.nodes), gm.code
    with FakeTensorMode() as mode:
        f = mode.from_tensor(x)
    with torch._C._DisableTorchDispatch(), pytest.raises(RuntimeError, match="without tpu storage"):
        torch.ops.aten.add.Tensor(f, f)
