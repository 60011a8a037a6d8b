"""Eager execution modes: defer_and_fuse (default), strict, debug. See docs/modes.md.

    torchtpu.set_eager_mode("strict")                  # switch for the process
    with torchtpu.set_eager_mode("debug"):             # ... or for a block
        model(x)
    torchtpu.get_eager_mode()                          # "defer_and_fuse"
"""
from __future__ import annotations

import atexit
import os
import warnings

from . import _C

MODES = ("strict", "debug", "defer_and_fuse")
_NAN_POLICIES = {"off": 0, "warn": 1, "raise": 2}


class set_eager_mode:
    """Switches the eager mode now; used as a context manager it restores the previous
    mode on exit. Switching flushes pending deferred work first."""

    def __init__(self, mode: str):
        if mode not in MODES:
            raise ValueError(f"eager mode must be one of {MODES}, got {mode!r}")
        self.previous = get_eager_mode()
        _C._set_eager_mode(MODES.index(mode))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _C._set_eager_mode(MODES.index(self.previous))
        return False


eager_mode = set_eager_mode


def get_eager_mode() -> str:
    return MODES[_C._get_eager_mode()]


_nan_policy = "raise"


class set_debug_options:
    """Debug mode's NaN/Inf check per floating output: 'raise' (default), 'warn', 'off'.
    Applies now; as a context manager it restores the previous setting on exit."""

    def __init__(self, nan: str = "raise"):
        global _nan_policy
        if nan not in _NAN_POLICIES:
            raise ValueError(f"nan must be one of {tuple(_NAN_POLICIES)}, got {nan!r}")
        self.previous = _nan_policy
        _C._set_nan_check(_NAN_POLICIES[nan])
        _nan_policy = nan

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        set_debug_options(self.previous)
        return False


def trace(clear: bool = False) -> list[dict]:
    """Debug mode's per-op trace: op, shapes/dtypes, Python call site, microseconds, path
    ('native' or 'fallback'), and whether defer_and_fuse could fuse the op ('fusable')."""
    out = _C._trace()
    if clear:
        _C._trace_clear()
    return out


class Explanation(list):
    """The cuts of defer_and_fuse since the last clear; prints as a table."""

    def __init__(self, cuts, plans, hits):
        super().__init__(cuts)
        self.plans_built, self.plan_cache_hits = plans, hits

    def __str__(self):
        lines = [f"{len(self)} graph cuts; plans built {self.plans_built}, plan cache hits "
                 f"{self.plan_cache_hits}",
                 f"{'#':>4} {'ops':>5} {'kernels':>7} {'fused':>11} {'internal':>8} {'donated':>7} {'cache':>5} "
                 f"{'plan us':>8} {'run us':>9}  reason @ site"]
        for i, c in enumerate(self):
            fused = f"{c['fused_ops']}/{c['fused_groups']}g" + (f"+{c['fused_reductions']}r" if c["fused_reductions"] else "")
            lines.append(f"{i:>4} {c['ops']:>5} {c['kernels']:>7} {fused:>11} {c['internal_values']:>8} {c['donated']:>7} "
                         f"{'hit' if c['cache_hit'] else 'miss':>5} {c['plan_us']:>8.1f} {c['run_us']:>9.1f}  "
                         f"{c['reason']}" + (f" after {c['last_op']}" if c['last_op'] else "") +
                         f" @ {c['site'] or '?'}")
        return "\n".join(lines)


def explain(clear: bool = False) -> Explanation:
    """Every defer_and_fuse cut: why (reason, the graph's last op, and the Python line that
    caused it; for a heuristic cut on the autograd engine's thread, the line that started
    the backward pass), graph size, fused groups (and how many end in a row reduction),
    values kept out of memory, outputs written into a dead input's buffer, plan cache hit
    or miss, and time spent planning vs running (run time and donations are filled in once
    the graph has run)."""
    plans, hits = _C._plan_cache_stats()
    out = Explanation(_C._explain(), plans, hits)
    if clear:
        _C._explain_clear()
    return out


def flush(device: int | None = None, reason: str = "torchtpu.flush()") -> None:
    """Cuts the pending deferred graph now (a no-op in strict and debug modes)."""
    from . import device as _dev
    _C._flush(_dev._index(device), reason)


_backward_ran = False


def _let_autograd_threads_finish() -> None:
    """At exit, give the autograd engine's device threads a moment to drop their last
    graph task. Each backward stashes a Python object (a contextvars copy) in the task's
    thread-local state; a device thread that releases it after interpreter finalization
    has begun cannot take the GIL, is unwound by Python, and the unwinding through
    PyTorch's noexcept destructor aborts the process ("terminate called without an
    active exception"). Sleeping here releases the GIL while the interpreter still works."""
    if _backward_ran:
        import time
        time.sleep(0.05)


atexit.register(_let_autograd_threads_finish)


def _cut_after_backward() -> None:
    """Makes the end of every backward pass a defer_and_fuse cut point: the backward graph
    is queued (and runs) while Python goes on to trace the optimizer step."""
    import torch

    def cut(fn):
        def wrapper(*args, **kwargs):
            global _backward_ran
            defer = get_eager_mode() == "defer_and_fuse"
            if defer:  # explain() names this line for cuts made on the autograd engine's thread
                _C._set_backward_site(_C._call_site())
            out = fn(*args, **kwargs)
            _backward_ran = True
            if defer:
                for d in range(_C._device_count()):
                    _C._flush(d, "end of backward")
            return out
        wrapper.__wrapped__ = fn
        wrapper.__doc__, wrapper.__name__, wrapper.__qualname__ = fn.__doc__, fn.__name__, fn.__qualname__
        return wrapper

    if not hasattr(torch.autograd.backward, "__wrapped__"):
        torch.autograd.backward = cut(torch.autograd.backward)
        torch.autograd.grad = cut(torch.autograd.grad)


def _init_from_env() -> None:
    _cut_after_backward()
    mode = os.environ.get("TORCHTPU_EAGER_MODE")
    if os.environ.get("TPU_LAUNCH_BLOCKING", "0") not in ("", "0"):
        mode = mode or "debug"
    # defer_and_fuse is the default since it passes the validation suite as strict does
    # (docs/validation.md); the C library's own default stays strict.
    set_eager_mode(mode or "defer_and_fuse")
    nan = os.environ.get("TORCHTPU_DEBUG_NAN")
    if nan:
        set_debug_options(nan=nan)


def _report_fallbacks_at_exit() -> None:
    if get_eager_mode() != "debug":
        return
    report = dict(_C._fallback_counts())
    if report:
        warnings.warn("torchtpu debug mode: ops that ran through the CPU fallback: "
                      + ", ".join(f"{k} x{v}" for k, v in sorted(report.items(), key=lambda kv: -kv[1])))


atexit.register(_report_fallbacks_at_exit)
