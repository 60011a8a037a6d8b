"""The validator's judgment of one model (torchtpu/_validate/runner.py), on small
hand-made models: the tpu runs start from the model as built, and the float64 re-check
of a mismatch accepts integer outputs that equal the CPU's."""
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
