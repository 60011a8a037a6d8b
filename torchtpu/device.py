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


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Caps this process's caching pool at fraction of the device's memory; allocations
    beyond it raise torch.OutOfMemoryError (as with CUDA)."""
    if not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    idx = _index(device)
    _C._set_capacity(idx, int(fraction * get_device_properties(idx).total_memory))


def mem_get_info(device=None) -> tuple[int, int]:
    s = _C._memory_stats(_index(device))  # free: what this process may still reserve
    return s["capacity_bytes"] - s["reserved_bytes"], get_device_properties(device).total_memory


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


# ---- streams and events (one in-order queue per device) ---------------------------------
class Stream(torch.Stream):
    """torch.cuda.Stream's counterpart. Every stream of a device is its one in-order queue,
    so work on two streams is ordered as if on one: wait_stream / wait_event always hold,
    and code written for several CUDA streams stays correct (it just does not overlap)."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, device=torch.device("tpu", _index(device)), priority=priority)


class Event(torch.Event):
    """torch.cuda.Event's counterpart: a marker in the device's queue. record() cuts a
    pending defer_and_fuse graph and queues the marker; it completes, with a timestamp,
    once everything queued before it has run, so elapsed_time() measures device time
    between two records. A torch.Event, so torch.Stream.wait_event takes it."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, device="tpu", enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        pass  # made in __new__

    def record(self, stream=None) -> None:
        super().record(stream if stream is not None else current_stream())

    def wait(self, stream=None) -> None:
        super().wait(stream if stream is not None else current_stream())

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds from this event's completion to end_event's."""
        return _C._event_elapsed_ms(self.event_id, end_event.event_id)

    def __repr__(self):
        return f"<torch.tpu.Event {super().__repr__()}>"


def current_stream(device=None) -> Stream:
    return Stream(device)


def default_stream(device=None) -> Stream:
    return Stream(device)


@contextlib.contextmanager
def stream(s):
    """Makes s current (a no-op: every stream is the device's one queue)."""
    yield s


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A printable table of memory_stats()."""
    s = memory_stats(device)
    mib = lambda b: f"{b / 2**20:,.1f} MiB"  # noqa: E731
    rows = [("allocated", mib(s["allocated_bytes.all.current"]), mib(s["allocated_bytes.all.peak"])),
            ("reserved (caching pool)", mib(s["reserved_bytes.all.current"]), mib(s["reserved_bytes.all.peak"])),
            ("allocations / frees", str(s["allocation.all.allocated"]), str(s["allocation.all.freed"])),
            ("out-of-memory errors", str(s["num_ooms"]), ""),
            ("capacity", mib(s["capacity_bytes"]), "")]
    lines = [f"tpu:{_index(device)} memory summary", f"{'':26}{'current':>16}{'peak':>16}"]
    lines += [f"{name:26}{cur:>16}{peak:>16}" for name, cur, peak in rows]
    return "\n".join(lines)
