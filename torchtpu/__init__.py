"""torchtpu: a native PyTorch device "tpu" backed by the C runtime libtpurt.

`import torchtpu` (or plain `import torch`, through the torch.backends entry point)
makes "tpu" a PyTorch device. Environment variables: torchtpu/_env.py."""
from __future__ import annotations

import importlib.util


def _autoload() -> None:
    """Entry point for `import torch` autoload (torch.backends group). Defined before
    `import torch` because that import runs the entry point while this package is still
    initializing (e.g. under `python -m torchtpu.validate`)."""


import os  # noqa: E402

import torch  # noqa: E402

# A process that torchrun started among LOCAL_WORLD_SIZE on this host sees that many
# host-driver devices, so CUDA code's torch.cuda.set_device(local_rank) works as
# torch.tpu.set_device(local_rank) (each process's devices are its own memory), and its
# thread pool gets its share of the cores, so the processes do not oversubscribe them.
_local_world = os.environ.get("LOCAL_WORLD_SIZE", "")
if _local_world.isdigit() and int(_local_world) > 0:
    if not (os.environ.get("TORCHTPU_NUM_DEVICES") or os.environ.get("TPU_VISIBLE_DEVICES")):
        os.environ["TORCHTPU_NUM_DEVICES"] = _local_world
    if not os.environ.get("TORCHTPU_NUM_THREADS"):
        os.environ["TORCHTPU_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(_local_world)))

# The runtime calls its OpenBLAS single-threaded (its pool splits large products), but
# OpenBLAS starts its thread servers when the library loads, unless this variable says one
# thread, and they spin for a while after starting: measured, the GEMMs of the first 0.3 s
# after import ran at half speed. So the variable is set while _C (and with it OpenBLAS)
# loads, and restored after, leaving other BLAS libraries as the user configured them.
_openblas_threads = os.environ.get("OPENBLAS_NUM_THREADS")
os.environ["OPENBLAS_NUM_THREADS"] = "1"
try:
    from . import _C  # noqa: E402  (loads libtpurt and registers kernels)
finally:
    if _openblas_threads is None:
        del os.environ["OPENBLAS_NUM_THREADS"]
    else:
        os.environ["OPENBLAS_NUM_THREADS"] = _openblas_threads
from . import device as _device_module  # noqa: E402

from . import modes  # noqa: E402
from .modes import (  # noqa: E402
    eager_mode, explain, flush, get_eager_mode, set_debug_options, set_eager_mode, trace)

__all__ = ["fallback_report", "set_fallback", "get_fallback", "native_ops", "set_eager_mode",
           "eager_mode", "get_eager_mode", "set_debug_options", "trace", "explain", "flush"]


def _register() -> None:
    if getattr(torch, "tpu", None) is _device_module:
        return
    if importlib.util.find_spec("torch_tpu") is not None:
        raise RuntimeError(
            "torchtpu: Google's torch_tpu package is installed in this environment; both "
            "claim the PrivateUse1 device 'tpu'. Uninstall one of them.")
    torch.utils.rename_privateuse1_backend("tpu")
    torch._register_device_module("tpu", _device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    torch.set_autocast_dtype("tpu", torch.bfloat16)


_register()
modes._init_from_env()
from . import compile as _compile  # noqa: E402
_compile.install()
if torch.distributed.is_available():
    from . import distributed as _distributed  # noqa: E402
    _distributed.register()


def fallback_report() -> dict[str, int]:
    """Ops that ran through the CPU fallback in this process, with call counts."""
    return dict(_C._fallback_counts())


def reset_fallback_report() -> None:
    _C._reset_fallback_counts()


def set_fallback(mode: str) -> None:
    """'warn' (default), 'allow', or 'error' (ops without a native kernel raise)."""
    _C._set_fallback(mode)


def get_fallback() -> str:
    return _C._get_fallback()


def native_ops() -> list[str]:
    """ATen ops (and torchvision's, named "torchvision::nms") with a native libtpurt kernel."""
    return list(_C._native_ops())
