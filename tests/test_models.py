"""The three example models train 20 steps on tpu with losses matching the CPU run.

Tolerance: each tpu step's loss within 2e-3 relative of CPU's (f32). Kernels differ from
CPU's in summation order, and 20 optimizer steps amplify those ulps; a real bug (a wrong
gradient, a wrong kernel) moves losses by far more within the first steps."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import train_cnn  # noqa: E402
import train_gpt  # noqa: E402
import train_mlp  # noqa: E402

LOSS_RTOL = 2e-3


def _compare(mod, foreach, **kw):
    cpu = mod.run(torch.device("cpu"), steps=20, foreach=foreach, **kw)
    tpu = mod.run(torch.device("tpu"), steps=20, foreach=foreach, **kw)
    torch.testing.assert_close(torch.tensor(tpu), torch.tensor(cpu), rtol=LOSS_RTOL, atol=1e-4)
    assert tpu[-1] < tpu[0], "the model did not learn"


@pytest.mark.parametrize("foreach", [True, False])
def test_mlp_sgd(foreach, no_fallback):
    _compare(train_mlp, foreach)


@pytest.mark.parametrize("foreach", [True, False])
def test_cnn_adamw(foreach, no_fallback):
    _compare(train_cnn, foreach)


@pytest.mark.parametrize("foreach", [True, False])
def test_gpt_adamw(foreach, no_fallback):
    _compare(train_gpt, foreach)


def test_autocast_bf16(no_fallback):
    torch.manual_seed(0)
    m = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    ref = m(x)
    mt = m.to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = mt(x.to("tpu"))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float().cpu(), ref, atol=5e-2, rtol=5e-2)
    with torch.autocast("tpu"):
        assert torch.get_autocast_dtype("tpu") == torch.bfloat16


def test_memory_back_to_baseline_after_1000_steps(no_fallback):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32, device="tpu")
    y = torch.randn(16, 1, device="tpu")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        step()
    torch.tpu.synchronize()
    baseline = torch.tpu.memory_allocated()
    for _ in range(1000):
        loss = step()
    del loss
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == baseline
