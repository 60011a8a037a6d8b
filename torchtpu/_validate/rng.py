"""Recording and replaying the random draws a model's forward makes (VITS's noise, ViLT's
patch sampling, Informer's sampled keys), so that such a model's tpu run can be compared
with its CPU reference.

The CPU reference runs under `Recorder`: each call of a random function (torch.randn,
torch.rand_like, torch.multinomial, Tensor.normal_, ... see RANDOM) runs as usual and its
result is kept (a CPU copy). The tpu run then runs under `Replayer`: the i-th random call
does not draw; it returns the CPU run's i-th tensor, moved to the device and dtype the call
asked for (an in-place draw copies it into its tensor). The name of each call must match
the record, so a run that takes another path fails instead of using the wrong numbers.
What is validated for these models is everything the forward computes from its random
numbers, not the device's random number generator (tests/test_ops_random.py covers that).

The functions are intercepted at the Python level (a TorchFunctionMode), so random draws
made inside C++ kernels or inside another torch function are not seen; `replays_exactly`
checks on CPU that replaying the record under another seed reproduces the reference
bit for bit, and a model for which it does not stays excluded."""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_T = torch.Tensor
RANDOM = {
    torch.randn: "randn", torch.rand: "rand", torch.randint: "randint", torch.randperm: "randperm",
    torch.randn_like: "randn_like", torch.rand_like: "rand_like", torch.randint_like: "randint_like",
    torch.normal: "normal", torch.bernoulli: "bernoulli", torch.multinomial: "multinomial",
    torch.poisson: "poisson",
    _T.normal_: "normal_", _T.uniform_: "uniform_", _T.bernoulli_: "bernoulli_", _T.bernoulli: "bernoulli",
    _T.exponential_: "exponential_", _T.random_: "random_", _T.geometric_: "geometric_",
    _T.log_normal_: "log_normal_", _T.cauchy_: "cauchy_", _T.multinomial: "multinomial",
}


def _first_tensor(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


class Recorder(TorchFunctionMode):
    """Runs random calls as usual and keeps (name, CPU copy of the result) of each."""

    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = RANDOM.get(func)
        if name is not None and isinstance(out, torch.Tensor):
            self.log.append((name, out.detach().to("cpu", copy=True)))
        return out


class ReplayMismatch(RuntimeError):
    pass


class Replayer(TorchFunctionMode):
    """Answers the i-th random call with the i-th recorded tensor (see the module doc)."""

    def __init__(self, log):
        super().__init__()
        self.log = list(log)
        self.i = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = RANDOM.get(func)
        if name is None:
            return func(*args, **kwargs)
        if self.i >= len(self.log) or self.log[self.i][0] != name:
            want = self.log[self.i][0] if self.i < len(self.log) else "no more random calls"
            raise ReplayMismatch(f"random call {self.i} is {name}; the CPU reference made {want}")
        rec = self.log[self.i][1]
        self.i += 1
        if name.endswith("_"):  # in place: the recorded values into the tensor drawn on
            t = args[0]
            if tuple(t.shape) != tuple(rec.shape):
                raise ReplayMismatch(f"random call {self.i - 1} ({name}) on shape {list(t.shape)}; "
                                     f"the CPU reference drew {list(rec.shape)}")
            with torch.no_grad():
                t.copy_(rec)
            return t
        like = _first_tensor(args, kwargs)
        device = kwargs.get("device") or (like.device if like is not None else rec.device)
        dtype = kwargs.get("dtype")
        if dtype is None and like is not None and rec.is_floating_point() and like.is_floating_point():
            dtype = like.dtype  # a draw "like" a float64 tensor in the float64 re-check
        out = rec.to(device=device, dtype=dtype or rec.dtype, copy=True)
        if kwargs.get("out") is not None:
            kwargs["out"].copy_(out)
            return kwargs["out"]
        if kwargs.get("requires_grad"):
            out.requires_grad_(True)
        return out

    def finished(self):
        return self.i == len(self.log)


def record(fn):
    """(fn(), log of its random calls)."""
    with Recorder() as r:
        out = fn()
    return out, r.log


def replay(fn, log):
    """fn() with its random calls answered from log; raises ReplayMismatch when fn makes
    fewer or other random calls than were recorded."""
    with Replayer(log) as r:
        out = fn()
    if not r.finished():
        raise ReplayMismatch(f"{r.i} random calls made, the CPU reference made {len(r.log)}")
    return out
