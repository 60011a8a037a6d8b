"""`torch.tpu`: the device module, shaped like `torch.cuda` where an equivalent exists."""
from __future__ import annotations

import contextlib
from typing import Any, Optional, Union

import torch

from . import _C

_initialized = True


def is_available() -> bool:
    return _C._device_count() > 0


def is_initialized() -> bool:
    return _initialized


def _lazy_init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _C._device_count()


def _index(device: Optional[Union[int, str, torch.device]]) -> int:
    if device is None:
        return _C._current_device()
    if isinstance(device, int):
        idx = device
    else:
        device = torch.device(device)
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, got {device}")
        idx = device.index if device.index is not None else _C._current_device()
    if not 0 <= idx < device_count():
        raise RuntimeError(f"Invalid device index tpu:{idx} (device count {device_count()})")
    return idx


def current_device() -> int:
    return _C._current_device()


def set_device(device: Union[int, str, torch.device]) -> None:
    _C._set_device(_index(device))


class device:
    """Context manager that changes the current tpu device (like torch.cuda.device)."""

    def __init__(self, device: Any):
        self.idx = _index(device) if device is not None and device != -1 else -1
        self.prev = -1

    def __enter__(self):
        self.prev = current_device()
        if self.idx >= 0:
            set_device(self.idx)

    def __exit__(self, *exc):
        if self.idx >= 0:
            set_device(self.prev)
        return False


def synchronize(device: Optional[Union[int, str, torch.device]] = None) -> None:
    """Waits for all ops queued on the device; raises the first asynchronous error."""
    _C._synchronize(_index(device))


def get_device_name(device: Optional[Union[int, str, torch.device]] = None) -> str:
    return _C._device_name(_index(device))


class _DeviceProperties:
    def __init__(self, idx: int):
        total, cores, major, minor = _C._device_props(idx)
        self.name = _C._device_name(idx)
        self.total_memory = total
        self.multi_processor_count = cores
        self.major, self.minor = major, minor
        self.driver = _C._driver_name()

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', driver='{self.driver}', "
                f"total_memory={self.total_memory // (1 << 20)}MB, "
                f"multi_processor_count={self.multi_processor_count})")


def get_device_properties(device: Optional[Union[int, str, torch.device]] = None) -> _DeviceProperties:
    return _DeviceProperties(_index(device))


def get_device_capability(device=None) -> tuple[int, int]:
    p = get_device_properties(device)
    return p.major, p.minor


# ---- memory -------------------------------------------------------------------------
def memory_stats(device=None) -> dict[str, int]:
    s = _C._memory_stats(_index(device))
    return {
        "allocated_bytes.all.current": s["allocated_bytes"],
        "allocated_bytes.all.peak": s["peak_allocated_bytes"],
        "reserved_bytes.all.current": s["reserved_bytes"],
        "reserved_bytes.all.peak": s["peak_reserved_bytes"],
        "allocation.all.allocated": s["alloc_count"],
        "allocation.all.freed": s["free_count"],
        "num_ooms": s["num_ooms"],
        "capacity_bytes": s["capacity_bytes"],
    }


def memory_allocated(device=None) -> int:
    return _C._memory_stats(_index(device))["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    return _C._memory_stats(_index(device))["peak_allocated_bytes"]


def memory_reserved(device=None) -> int:
    return _C._memory_stats(_index(device))["reserved_bytes"]


def max_memory_reserved(device=None) -> int:
    return _C._memory_stats(_index(device))["peak_reserved_bytes"]


def reset_peak_memory_stats(device=None) -> None:
    _C._reset_peak(_index(device))


def empty_cache() -> None:
    _C._empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    s = _C._memory_stats(_index(device))
    return s["capacity_bytes"] - s["reserved_bytes"], s["capacity_bytes"]


# ---- random -------------------------------------------------------------------------
def _generator(device=None) -> torch.Generator:
    return _C._default_generator(_index(device))


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _C._default_generator(i).manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    for i in range(device_count()):
        _C._default_generator(i).seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device="tpu") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [_C._default_generator(i).get_state() for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, s in enumerate(states):
        _C._default_generator(i).set_state(s)


# ---- autocast ------------------------------------------------------------------------
def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# ---- streams (one in-order queue per device) --------------------------------------------
def current_stream(device=None) -> torch.Stream:
    return torch.Stream(device=torch.device("tpu", _index(device)))


def default_stream(device=None) -> torch.Stream:
    return current_stream(device)


@contextlib.contextmanager
def stream(s):
    yield s
