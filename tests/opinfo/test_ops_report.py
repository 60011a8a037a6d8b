"""The sweep command itself: a worker that aborts mid-op is recorded as a crash and the
sweep resumes after it; a rerun resumes instead of redoing samples; rendering works."""
import json
import os
import subprocess
import sys

import pytest
import torch

from torchtpu import _opinfo as oi

pytestmark = pytest.mark.timeout(300)


def _run(tmp_path, *extra, env=None):
    cmd = [sys.executable, "-m", "torchtpu.ops_report", "--ops", "add", "--dtypes",
           "float32", "--jobs", "1", "--results", str(tmp_path / "r.jsonl"), *extra]
    e = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", **(env or {}))
    p = subprocess.run(cmd, cwd=oi.ROOT, env=e, capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout + p.stderr
    return [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]


def test_crash_is_recorded_and_sweep_resumes(tmp_path):
    recs = _run(tmp_path, "--fresh", "--no-render",
                env={"_TORCHTPU_OPS_REPORT_ABORT_AT": "add:float32:op:3"})
    ops = {r["i"]: r for r in recs if r["variant"] == "op"}
    assert ops[3]["status"] == "fail" and ops[3]["kind"] == "crash"
    n = len(ops)
    assert n > 4 and all(ops[i]["status"] in oi.PASS for i in ops if i != 3)
    assert {r["variant"] for r in recs} >= {"op", "inplace", "out", "grad"}
    # A rerun finds every sample recorded and appends nothing; rendering reads the file.
    again = _run(tmp_path, "--doc", str(tmp_path / "ops.md"), "--no-models")
    assert len(again) == len(recs)
    doc = (tmp_path / "ops.md").read_text()
    assert "## Totals" in doc and "`add`" in doc


def test_ties_accept_another_correct_answer_only():
    """sort/argsort/topk indices differ from CPU's only among equal elements: accepted when
    they are a correct answer, rejected when they pick an element twice or a wrong one."""
    from torch.testing._internal.opinfo.core import SampleInput
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    s = SampleInput(x, args=(2,))  # topk(x, 2)
    e = torch.topk(x, 2)
    ok = lambda a: oi._valid_up_to_ties("topk", s, "op", a, e, torch.float32)  # noqa: E731
    assert e.indices.tolist() != [[1, 4]] and ok((e.values, torch.tensor([[1, 4]])))
    assert not ok((e.values, torch.tensor([[2, 2]])))  # an element twice
    assert not ok((e.values, torch.tensor([[2, 3]])))  # x[3] = 2 is not a top value
    assert not ok((torch.tensor([[3.0, 2.0]]), torch.tensor([[1, 3]])))  # values not CPU's
    sort = SampleInput(x, kwargs=dict(dim=1, stable=True))
    e = torch.sort(x, dim=1, stable=True)
    assert not oi._valid_up_to_ties("sort", sort, "op", (e.values, torch.tensor([[0, 3, 4, 2, 1]])), e,
                                    torch.float32)  # stable=True fixes the order
    sort = SampleInput(x, kwargs=dict(dim=1))
    assert oi._valid_up_to_ties("sort", sort, "op", (e.values, torch.tensor([[0, 3, 4, 2, 1]])), e,
                                torch.float32)
    # gradients: the same values, permuted among equal input elements only
    g = torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.25]])
    assert oi._valid_up_to_ties("topk", s, "grad", [torch.tensor([[0.0, 0.25, 0.5, 0.0, 0.0]])], [g], torch.float32)
    assert not oi._valid_up_to_ties("topk", s, "grad", [torch.tensor([[0.25, 0.5, 0.0, 0.0, 0.0]])], [g],
                                    torch.float32)


def test_cpu_error_recheck_accepts_only_results_as_close_as_cpus():
    """A float result that differs from CPU's passes the re-check only when it is no further
    from the wider (float64) result than twice CPU's own result is, plus atol."""
    wide = torch.linspace(-1, 1, 64, dtype=torch.float64)
    cpu = (wide + 1e-4).float()  # CPU's own float32 result: 1e-4 off
    near = (wide - 1.5e-4).float()  # 1.5e-4 off: within 2 x 1e-4 + atol (1e-5)
    far = (wide + 5e-4).float()  # 5e-4 off
    ok, errs = oi._within_cpu_error([near], [cpu], [wide], "x", torch.float32)
    assert ok and errs[0] == pytest.approx(1.5e-4, rel=0.05) and errs[1] == pytest.approx(1e-4, rel=0.05)
    assert not oi._within_cpu_error([far], [cpu], [wide], "x", torch.float32)[0]
    nan_wide = wide.clone()
    nan_wide[3] = float("nan")
    assert not oi._within_cpu_error([near], [cpu], [nan_wide], "x", torch.float32)[0]  # NaN must agree
    assert not oi._within_cpu_error([near, near], [cpu], [wide], "x", torch.float32)[0]  # structure
    idx = torch.arange(4)  # non-float results (indices) must equal CPU's exactly
    assert oi._within_cpu_error([near, idx], [cpu, idx], [wide, idx], "x", torch.float32)[0]
    assert not oi._within_cpu_error([near, idx.flip(0)], [cpu, idx], [wide, idx], "x", torch.float32)[0]


def test_out_tensors_start_equal_on_both_devices():
    """An op that leaves out= unwritten everywhere (ATen's 1-D fft.ihfftn) compares equal;
    one whose tpu kernel skipped the write would not (NaN against a value)."""
    a, b = oi._empty_like_out(torch.zeros(3), "cpu"), oi._empty_like_out(torch.zeros(3), "tpu")
    assert torch.equal(a.isnan(), torch.ones(3, dtype=torch.bool)) and b.cpu().isnan().all()
    assert oi._empty_like_out(torch.zeros(2, dtype=torch.long), "cpu").tolist() == [7, 7]
