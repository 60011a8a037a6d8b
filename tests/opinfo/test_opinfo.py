"""OpInfo conformance: PyTorch's own OpInfo samples on tpu vs CPU.

One test per (op, dtype, variant) runs the op's samples through torchtpu/_opinfo.py:
variants `op`, `inplace`, `out`, `grad` (backward via torch.autograd.grad vs CPU), and
`error` (OpInfo's error_inputs raise the same exception type as on CPU). A sample passes
natively or through the CPU fallback alike here; docs/ops.md tells them apart.

TORCHTPU_OPINFO_SAMPLE=ci (default): every op, tables.CI_DTYPES, the first
tables.CI_SAMPLES samples of each variant. TORCHTPU_OPINFO_SAMPLE=full: every supported
dtype and every sample (slow; `python -m torchtpu.ops_report` is the faster way to sweep).

Every skip and expected failure is in tests/opinfo/tables.py with its reason. Expected
failures are strict per sample: a failing sample that is not listed fails the test, and
so does a listed sample that now passes (remove it from the table, or regenerate with
`python -m torchtpu.ops_report --write-xfails`) on the machine class the table was swept
on (tables.EXPECTED_FAILURES_MACHINE; elsewhere CPU's own low-precision conv and matmul
results differ, and samples listed there may pass here)."""
import os

import pytest
import torch  # noqa: F401

from torchtpu import _opinfo as oi

MODE = os.environ.get("TORCHTPU_OPINFO_SAMPLE", "ci")
if MODE not in ("ci", "full"):
    raise ValueError(f"TORCHTPU_OPINFO_SAMPLE must be 'ci' or 'full', got {MODE!r}")
TAB = oi.tables()
LIMIT = TAB.CI_SAMPLES if MODE == "ci" else None
SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64",
         "int64": "i64", "int32": "i32", "bool": "bool"}

pytestmark = pytest.mark.timeout(TAB.TEST_TIMEOUT_S)


def _cases():
    out = []
    for key, op in sorted(oi.load_ops().items()):
        dts = oi.op_dtypes(op)
        if MODE == "ci":
            dts = [d for d in dts if d in TAB.CI_DTYPES]
        for d in dts:
            vs = oi.variants_for(op, oi.DTYPES[d]) + oi.extra_variants(op, d)
            for v in vs:
                marks = []
                reason = oi.skip_reason(key, d, v)
                if reason is not None:
                    marks.append(pytest.mark.skip(reason=reason))
                out.append(pytest.param(key, d, v, id=f"{key}-{SHORT[d]}-{v}", marks=marks))
    return out


@pytest.mark.parametrize("op_key,dtype,variant", _cases())
def test_opinfo(op_key, dtype, variant):
    recs = list(oi.run_unit(op_key, dtype, [variant], limit=LIMIT))
    ran = [r for r in recs if r["i"] >= 0 and r["status"] != "skip"]
    if not ran:
        reasons = sorted({f"{r['kind']}: {r['reason']}" for r in recs}) or ["no samples"]
        pytest.skip("; ".join(reasons)[:300])
    fails = {r["i"]: r for r in ran if r["status"] == "fail"}
    listed = oi.expected_failure(op_key, dtype, variant)
    listed_idx = set(listed[1]) if listed else set()
    new = [fails[i] for i in sorted(fails) if i not in listed_idx]
    fixed = sorted(i for i in listed_idx if i in {r["i"] for r in ran} and i not in fails) \
        if oi.strict_passes() else []
    msgs = []
    if new:
        msgs.append(f"{len(new)} failing sample(s) not in tests/opinfo/tables.py:")
        msgs += [f"  sample {r['i']}: {r['kind']}: {r['reason']}" for r in new[:10]]
    if fixed:
        msgs.append(f"sample(s) {fixed} listed in EXPECTED_FAILURES now pass: remove them "
                    f"from tests/opinfo/tables.py (or `python -m torchtpu.ops_report "
                    f"--write-xfails` after a sweep)")
    if msgs:
        pytest.fail("\n".join(msgs))
    if fails:
        pytest.xfail(listed[0])
