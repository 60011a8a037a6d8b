"""The sweep command itself: a worker that aborts mid-op is recorded as a crash and the
sweep resumes after it; a rerun resumes instead of redoing samples; rendering works."""
import json
import os
import subprocess
import sys

import pytest

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
