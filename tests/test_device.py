"""The tpu device as a PyTorch user sees it: registration, device module, copies,
serialization, generators, memory statistics and errors."""
import copy
import io
import os
import subprocess
import sys

import pytest
import torch

import torchtpu
from tolerances import assert_close


def test_accelerator_is_tpu():
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.is_available()
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    assert "TPU" in torch.tpu.get_device_name()
    props = torch.tpu.get_device_properties(0)
    assert props.total_memory > 0
    torch.accelerator.synchronize()
    torch.tpu.synchronize()


def test_autoload_through_plain_import_torch():
    code = "import torch; x = torch.ones(2, device='tpu'); print(x.device, torch.tpu.device_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "tpu:0" in out.stdout


def test_several_host_devices():
    code = ("import torch, torchtpu; assert torch.tpu.device_count() == 3;"
            "x = torch.arange(4.).to('tpu:2'); y = x.to('tpu:1') * 2; print(y.device, y.cpu().tolist())")
    env = dict(os.environ, TORCHTPU_NUM_DEVICES="3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "tpu:1 [0.0, 2.0, 4.0, 6.0]" in out.stdout
    env = dict(os.environ, TPU_VISIBLE_DEVICES="0,1")
    env.pop("TORCHTPU_NUM_DEVICES", None)
    out = subprocess.run([sys.executable, "-c", "import torch, torchtpu; print(torch.tpu.device_count())"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "2", out.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                   torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool])
def test_roundtrip_dtypes(dtype):
    x = (torch.randn(5, 7) * 10).to(dtype)
    t = x.to("tpu")
    assert t.device.type == "tpu" and t.dtype == dtype and t.is_tpu
    assert torch.equal(t.cpu(), x)
    # non-contiguous source and destination
    assert torch.equal(x.t().to("tpu").cpu(), x.t())
    assert torch.equal(t.t().cpu(), x.t())
    assert torch.equal(t[1:4, ::2].cpu(), x[1:4, ::2])


def test_tensor_methods_and_printing():
    x = torch.tensor([[1.5, -2.0], [3.0, 4.25]])
    t = x.tpu()
    assert t.item() if t.numel() == 1 else True
    assert t[1, 1].item() == 4.25
    assert t.tolist() == x.tolist()
    s = str(t)
    assert "device='tpu:0'" in s and "4.2500" in s
    m = torch.nn.Linear(2, 3).to("tpu")
    assert all(p.device.type == "tpu" for p in m.parameters())
    m2 = torch.nn.Linear(2, 3).tpu()
    assert next(m2.parameters()).is_tpu


def test_save_load_map_location(tmp_path):
    x = torch.randn(3, 4)
    t = x.to("tpu")
    buf = io.BytesIO()
    torch.save({"t": t, "c": x}, buf)
    buf.seek(0)
    d = torch.load(buf)
    assert d["t"].device.type == "tpu" and torch.equal(d["t"].cpu(), x)
    buf.seek(0)
    d = torch.load(buf, map_location="cpu")
    assert d["t"].device.type == "cpu" and torch.equal(d["t"], x)
    buf2 = io.BytesIO()
    torch.save(x, buf2)
    buf2.seek(0)
    y = torch.load(buf2, map_location="tpu")
    assert y.device.type == "tpu" and torch.equal(y.cpu(), x)


def test_pin_memory():
    x = torch.randn(16)
    p = x.pin_memory()
    assert p.is_pinned()
    assert torch.equal(p.to("tpu", non_blocking=True).cpu(), x)


def test_generator_reproducible():
    g = torch.Generator(device="tpu")
    assert g.device.type == "tpu"
    g.manual_seed(3)
    s = g.get_state()
    g.manual_seed(4)
    g.set_state(s)
    torch.manual_seed(0)
    st = torch.tpu.get_rng_state()
    torch.tpu.set_rng_state(st)
    torch.tpu.manual_seed_all(1)


@pytest.fixture
def strict_mode():
    """Allocation-time semantics: defer_and_fuse takes memory only when a value is written."""
    with torchtpu.set_eager_mode("strict"):
        yield


def test_memory_stats_and_empty_cache(strict_mode):
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    t = torch.empty(1 << 20, device="tpu")
    assert torch.tpu.memory_allocated() >= base + (4 << 20)
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated()
    assert torch.accelerator.max_memory_allocated() >= torch.tpu.memory_allocated()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    del t
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == base
    torch.accelerator.empty_cache()
    torch.tpu.empty_cache()
    assert torch.tpu.memory_reserved() <= torch.tpu.max_memory_reserved()


_LARGE_BLOCKS = ("import torch, torchtpu\ntorchtpu.set_eager_mode('strict')\n"
                 "for rounds in range(2):\n"
                 "    ts = [torch.arange(n, dtype=torch.float32, device='tpu') for n in (1 << 18, 1 << 20, 2359297)]\n"
                 "    assert [t[-1].item() for t in ts] == [t.numel() - 1 for t in ts]\n"
                 "    assert all(torch.equal(t.cpu(), torch.arange(t.numel(), dtype=torch.float32)) for t in ts)\n"
                 "    del ts\n"
                 "    torch.tpu.synchronize(); torch.tpu.empty_cache()\n"
                 "    assert torch.tpu.memory_reserved() == 0\n")


@pytest.mark.parametrize("huge", ["1", "0"])
def test_large_blocks_round_trip(huge):
    # With TORCHTPU_HUGE_PAGES=1, blocks of 4 MiB and more (pool classes 4 MiB and 10 MiB
    # here; a 1 MiB one comes from malloc) are their own mappings advised for huge pages
    # (runtime_test.c checks their alignment), unmapped by empty_cache and mapped again;
    # by default (0) every block is on malloc. Either way the data round-trips (asserted
    # in the child).
    env = dict(os.environ, TORCHTPU_HUGE_PAGES=huge)
    out = subprocess.run([sys.executable, "-c", _LARGE_BLOCKS], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr


def test_out_of_memory_raises_and_recovers():
    code = ("import torch, torchtpu\ntorchtpu.set_eager_mode('strict')\n"
            "try:\n    torch.empty(1 << 22, device='tpu')\nexcept torch.OutOfMemoryError as e:\n"
            "    print('OOM', 'capacity' in str(e))\n"
            "x = torch.ones(1000, device='tpu'); print(x.sum().item() if hasattr(x, 'sum') else 0)\n")
    env = dict(os.environ, TORCHTPU_HBM_BYTES=str(1 << 20))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "OOM True" in out.stdout


def test_set_per_process_memory_fraction(strict_mode):
    torch.tpu.synchronize()
    torch.tpu.empty_cache()
    total = torch.tpu.get_device_properties().total_memory
    try:
        torch.tpu.set_per_process_memory_fraction(0.001)
        assert torch.tpu.memory_stats()["capacity_bytes"] == int(0.001 * total)
        with pytest.raises(torch.OutOfMemoryError, match="capacity"):
            torch.empty(int(0.002 * total) // 4 + 1, device="tpu")
        assert torch.tpu.get_device_properties().total_memory == total  # a limit, not the device
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
    assert torch.tpu.memory_stats()["capacity_bytes"] == total
    assert torch.ones(1000, device="tpu").sum().item() == 1000.0
    with pytest.raises(ValueError, match="fraction"):
        torch.tpu.set_per_process_memory_fraction(1.5)
    assert "allocated" in torch.tpu.memory_summary() and "capacity" in torch.tpu.memory_summary()


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
def test_events_time_the_device_work_between_them(mode):
    """torch.tpu.Event as torch.cuda.Event: record() places a marker after the work queued
    so far; elapsed_time() is the device time between two markers. A deferred graph is cut
    at record, so the work runs and is inside the interval."""
    import time
    x = torch.randn(384, 384, device="tpu")
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    assert end.query()  # never recorded: nothing to wait for
    with torchtpu.set_eager_mode(mode):
        torch.tpu.synchronize()
        t0 = time.perf_counter()
        start.record()
        y = x
        for _ in range(10):
            y = y @ x / 384
        end.record()
        end.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
        ms = start.elapsed_time(end)
        assert end.query()
    assert 0 < ms <= wall_ms + 1e-3  # the markers ran inside this interval, after the work
    assert torch.isfinite(y).all().item()
    # the generic torch.Event / torch.Stream APIs reach the same implementation
    s = torch.tpu.Stream()
    assert isinstance(s, torch.Stream) and s.device.type == "tpu"
    e = torch.Event(device="tpu", enable_timing=True)
    e.record(s)
    s.wait_event(e)
    s.synchronize()
    assert e.query() and s.query()
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        torch.tpu.Event(enable_timing=True).elapsed_time(end)


def test_bad_device_index():
    with pytest.raises(RuntimeError, match="device"):
        torch.ones(2, device="tpu:7")
    with pytest.raises(RuntimeError):
        torch.tpu.set_device(9)


def test_mixed_device_error_names_op():
    a = torch.ones(3, device="tpu")
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.ones(3)


def test_shape_mismatch_error_names_op():
    with pytest.raises(RuntimeError, match=r"add.*must match the size"):
        torch.ones(3, device="tpu") + torch.ones(4, device="tpu")


@pytest.mark.parametrize("call", [
    lambda a: a[:1].expand(4).add_(1),  # an in-place write into an expanded tensor
    lambda a: torch.add(a[:4], 1, out=a[2:]),  # out= partly over an input
    lambda a: a[1:].add_(a[:-1]),  # in place, partly over another input
    lambda a: torch.index_select(a, 0, torch.tensor([0, 1], device=a.device), out=a[:2]),
    lambda a: torch.gather(a, 0, torch.tensor([0, 2], device=a.device), out=a),  # out= is the input
    lambda a: torch.take(a, torch.tensor([0, 1], device=a.device), out=a[:1].expand(2)),  # (CPU fallback)
    lambda a: a.view(2, 1, 3).ldexp_(torch.ones(2, 2, 3, device=a.device)),  # ldexp.out(self, out=self)
    lambda a: a[1:].copy_(a[:-1]),
    lambda a: a[:1].expand(4).copy_(torch.ones(4)),
    lambda a: a.index_add_(0, torch.arange(6, device=a.device), a),  # source is self
    # CPU fallback ops whose CPU kernels refuse an out= equal to an input
    lambda a: torch.take(a[:3], torch.tensor([2, 1, 0], device=a.device), out=a[:3]),
    lambda a: torch.kthvalue(a[:1].reshape(()), 1, out=(a[:1].reshape(()), torch.empty((), dtype=torch.long,
                                                                                        device=a.device))),
], ids=["inplace-expanded", "out-partial", "inplace-partial", "index_select", "gather-out-is-input",
        "fallback-take", "out-is-input-no-resize", "copy-partial", "copy-into-expanded", "index_add-self",
        "fallback-take-out-is-input", "fallback-kthvalue-out-is-input"])
def test_overlapping_writes_raise_as_on_cpu(call):
    """ATen's memory-overlap rules: a written tensor whose elements share memory, or that
    partly overlaps an input, is refused (kernels would read what they already wrote);
    an out= that is exactly an input only for elementwise ops; an out= that is also an input
    is not resized. The same call raises on CPU."""
    with pytest.raises(RuntimeError):
        call(torch.arange(6.0))
    with pytest.raises(RuntimeError):
        call(torch.arange(6.0, device="tpu"))


def test_fills_may_write_expanded_tensors():
    """ATen lets fill_ (and, deprecated, masked_fill_) write an expanded tensor."""
    for dev in ("cpu", "tpu"):
        x = torch.zeros(1, device=dev).expand(3)
        x.fill_(2.0)
        x.masked_fill_(torch.tensor([True, False, True], device=dev), 5.0)
        x.zero_()
        assert x.cpu().tolist() == [0.0, 0.0, 0.0]


def test_writes_over_their_own_input_where_aten_allows():
    a = torch.arange(6.0, device="tpu")
    torch.add(a, 1, out=a)
    a.mul_(a)
    assert a.cpu().tolist() == [1.0, 4.0, 9.0, 16.0, 25.0, 36.0]
    torch.sort(a, descending=True, out=(a, torch.empty(6, dtype=torch.long, device="tpu")))  # values = self
    a.masked_scatter_(a > 10, a)
    assert a.cpu().tolist() == [36.0, 25.0, 16.0, 9.0, 4.0, 1.0]


STORAGE_ONLY = [torch.uint16, torch.uint32, torch.uint64, torch.complex32, torch.float8_e5m2,
                torch.float8_e4m3fn, torch.float8_e5m2fnuz, torch.float8_e4m3fnuz]


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", STORAGE_ONLY, ids=str)
def test_storage_only_dtypes_copy_and_fall_back(dtype):
    """Dtypes without tpu kernels still live on the device: copies in and out, strided
    copies on the device, conversions (through the host) and ops (on the CPU fallback)."""
    x = (torch.randn(5, 7) * 10 if dtype.is_floating_point or dtype.is_complex
         else torch.randint(0, 1000, (5, 7))).to(dtype)

    def same(a, b):  # bit for bit
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return a.dtype == b.dtype and torch.equal(a.flatten().view(bits), b.flatten().view(bits))
    t = x.to("tpu")
    assert t.dtype == dtype and same(t.cpu(), x)
    assert same(t.t().contiguous().cpu(), x.t().contiguous())  # a strided copy on the device
    assert same(t[1:4, ::2].clone().cpu(), x[1:4, ::2].clone())
    assert same(x.t().to("tpu").cpu(), x.t())
    assert same(t.float().cpu(), x.float()) and same(t.float().to(dtype).cpu(), x)  # via the host
    if dtype == torch.complex32:
        assert same(t.conj().resolve_conj().cpu(), x.conj().resolve_conj())
        assert same(t.conj().cpu().resolve_conj(), x.conj().resolve_conj())
    # ops: the CPU fallback runs them (an op with a tpu kernel refuses the dtype first), so
    # the outcome is CPU's, its own errors included (CPU has no add for uint64 either)
    for op in (torch.hash_tensor, lambda v: v + v, lambda v: v.sum()):
        try:
            want = op(x)
        except Exception as e:  # noqa: BLE001
            with pytest.raises(type(e)):
                op(t)
        else:
            assert same(op(t).cpu(), want)


def test_mode_out():
    x = torch.tensor([[1.0, 2.0, 2.0, 3.0], [5.0, 5.0, 1.0, 1.0]])
    values, indices = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.long, device="tpu")
    r = torch.mode(x.to("tpu"), 1, out=(values, indices))
    ev, ei = torch.mode(x, 1)
    assert r[0] is values and torch.equal(values.cpu(), ev) and torch.equal(indices.cpu(), ei)
    with pytest.raises(RuntimeError, match="values of dtype Float"):
        torch.mode(x.to("tpu"), 1, out=(values.long(), indices))


def test_fallback_counted_and_refusable():
    torchtpu.reset_fallback_report()
    x = torch.tensor([4.0, 9.0], device="tpu")
    # An op libtpurt does not implement natively runs on CPU, counted and warned once.
    op = torch.special.bessel_j0
    with pytest.warns(UserWarning, match="not implemented natively"):
        y = op(x)
    assert_close(y, op(x.cpu()))
    assert any("bessel_j0" in k for k in torchtpu.fallback_report())
    torchtpu.set_fallback("error")
    try:
        with pytest.raises(NotImplementedError, match="fallback is disabled"):
            op(x)
    finally:
        torchtpu.set_fallback("warn")
    with pytest.raises(ValueError):
        torchtpu.set_fallback("sometimes")


def test_module_to_keeps_tied_parameters_tied():
    """Module.to("tpu") moves a Parameter in place (same object), so weights tied on the
    CPU stay tied and their gradient is the sum over both uses, as on CPU."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    ref[1].weight = ref[0].weight
    m = copy.deepcopy(ref)
    shared = m[0].weight
    m.to("tpu")
    assert m[0].weight is shared and m[1].weight is shared
    assert shared.device.type == "tpu" and len(list(m.parameters())) == 1
    idx = torch.tensor([1, 2, 3])
    ref(idx).square().sum().backward()
    m(idx.to("tpu")).square().sum().backward()
    torch.testing.assert_close(shared.grad.cpu(), ref[0].weight.grad)
    m.cpu()
    assert m[0].weight is shared and shared.device.type == "cpu"


def test_param_data_assignment_across_devices():
    w = torch.nn.Parameter(torch.zeros(3))
    w.data = torch.ones(3, device="tpu")
    assert w.device.type == "tpu" and w.requires_grad and w.sum().item() == 3
    w.data = torch.zeros(2)
    assert w.device.type == "cpu" and w.shape == (2,)


def test_exit_right_after_backward_does_not_abort():
    """A script that ends right after backward() must exit cleanly: the autograd device
    thread's release of the graph task used to race interpreter finalization and abort
    the process (rc 134, "terminate called without an active exception") in ~1 of 3 runs."""
    code = ("import torch, torchtpu\n"
            "x = torch.ones(3, device='tpu', requires_grad=True)\n"
            "(x * 2).sum().backward()\n")
    for _ in range(5):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "terminate" not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("env, want", [({}, "1"), ({"TORCHTPU_CPU_THREADS": "2"}, "2"),
                                       ({"OMP_NUM_THREADS": "2"}, "2")])
def test_cpu_ops_threads_beside_host_driver(env, want):
    # import alone keeps PyTorch's thread count; the first tpu allocation sets the one
    # the host driver shares its cores with (idle OpenMP threads spin on them)
    code = ("import os, torch, torchtpu\n"
            "before = torch.get_num_threads()\n"
            "torch.ones(2, device='tpu')\n"
            "print(before, torch.get_num_threads())\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("TORCHTPU_CPU_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(clean, **env), timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.split()
    assert after == want
    plain = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, timeout=120,
                           env=dict(clean, TORCH_DEVICE_BACKEND_AUTOLOAD="0", **env))
    assert before == plain.stdout.strip()


@pytest.mark.parametrize("user_value", [None, "2"])
def test_runtime_openblas_loads_single_threaded(user_value):
    """The runtime's OpenBLAS must start no thread servers when it loads (they spun on the
    cores for the first 0.3 s after import, halving GEMM speed there), and the user's
    OPENBLAS_NUM_THREADS, set or not, is left as it was for other libraries."""
    code = ("import ctypes, os, torchtpu\n"
            "path = next(l.split()[-1] for l in open('/proc/self/maps') if 'libscipy_openblas.so' in l)\n"
            "print(ctypes.CDLL(path).scipy_openblas_get_num_threads(), os.environ.get('OPENBLAS_NUM_THREADS'))\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if user_value is not None:
        env["OPENBLAS_NUM_THREADS"] = user_value
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", str(user_value)]


def test_every_environment_variable_is_listed():
    """torchtpu/_env.py lists every variable the runtime, the adapter and the package read."""
    import pathlib
    import re
    from torchtpu._env import ENV_VARS
    root = pathlib.Path(__file__).resolve().parent.parent
    files = [p for d in ("runtime/src", "torchtpu") for p in (root / d).rglob("*")
             if p.suffix in (".c", ".h", ".cpp", ".py") and p.name != "_env.py"]
    read = set()
    for p in files:
        read |= set(re.findall(r'"((?:TORCHTPU|TPU)_[A-Z0-9_]+)"', p.read_text(errors="replace")))
    assert read and read <= set(ENV_VARS), sorted(read - set(ENV_VARS))
