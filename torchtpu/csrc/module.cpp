// Python bindings of torchtpu._C: device queries, memory statistics, generators and the
// fallback report. Thin wrappers over libtpurt and the adapter.
#include <torch/csrc/Generator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/extension.h>

#include "adapter.h"

namespace py = pybind11;
using namespace torchtpu;

static py::dict memory_stats(int d) {
  tpu_memory_stats_t s{};
  check(tpu_memory_stats(d, &s));
  py::dict r;
  r["allocated_bytes"] = s.allocated;
  r["peak_allocated_bytes"] = s.peak_allocated;
  r["reserved_bytes"] = s.reserved;
  r["peak_reserved_bytes"] = s.peak_reserved;
  r["alloc_count"] = s.alloc_count;
  r["free_count"] = s.free_count;
  r["num_ooms"] = s.oom_count;
  r["capacity_bytes"] = s.capacity;
  return r;
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchtpu native extension (libtpurt + PyTorch adapter)";
  m.def("_device_count", [] { return tpu_device_count(); });
  m.def("_driver_name", [] { return std::string(tpu_driver_name()); });
  m.def("_device_name", [](int d) { return std::string(tpu_device_name(d)); });
  m.def("_device_props", [](int d) {
    tpu_device_props_t p{};
    check(tpu_device_props(d, &p));
    return py::make_tuple(p.total_memory, p.core_count, p.major, p.minor);
  });
  m.def("_current_device", [] { return int(current_device()); });
  m.def("_set_device", [](int d) { set_current_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("_synchronize", [](int d) {
    CutSite site;
    tpu_status_t st;
    {
      py::gil_scoped_release nogil;
      st = tpu_device_synchronize(d);
    }
    check(st);
  });
  m.def("_memory_stats", &memory_stats);
  m.def("_reset_peak", [](int d) { tpu_memory_reset_peak(d); });
  m.def("_set_capacity", [](int d, uint64_t bytes) { check(tpu_memory_set_capacity(d, bytes)); });
  m.def("_empty_cache", [] { device_allocator()->emptyCache(); });
  m.def("_default_generator", [](int d) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(d))));
  });
  m.def("_fallback_counts", [] { return fallback_counts(); });
  m.def("_reset_fallback_counts", &reset_fallback_counts);
  m.def("_set_fallback", &set_fallback_mode);
  m.def("_get_fallback", &fallback_mode);
  m.def("_native_ops", &native_op_names);
  m.def("_skipped_ops", &skipped_op_names);
  m.def("_set_eager_mode", [](int mode) { check(tpu_set_eager_mode(static_cast<tpu_eager_mode_t>(mode))); });
  m.def("_get_eager_mode", [] { return int(tpu_get_eager_mode()); });
  m.def("_set_nan_check", [](int p) { tpu_set_nan_check(p); });
  m.def("_flush", [](int d, const std::string& reason) {
    CutSite site;
    check(tpu_flush(d, reason.c_str()));
  });
  m.def("_explain", [] {
    py::list out;
    tpu_cut_record_t r;
    for (int i = 0; tpu_explain_get(i, &r); ++i) {
      py::dict d;
      d["reason"] = r.reason; d["site"] = r.site; d["last_op"] = r.last_op; d["device"] = r.device; d["ops"] = r.nodes;
      d["kernels"] = r.kernels; d["fused_groups"] = r.fused_groups; d["fused_ops"] = r.fused_nodes;
      d["fused_reductions"] = r.fused_reductions; d["donated"] = r.donated;
      d["internal_values"] = r.internal_values; d["cache_hit"] = r.cache_hit;
      d["key"] = r.key; d["plan_us"] = r.plan_us; d["run_us"] = r.run_us;
      out.append(d);
    }
    return out;
  });
  m.def("_explain_clear", [] { tpu_explain_clear(); });
  m.def("_call_site", [] { return python_call_site(); });
  m.def("_cpu_threads_beside_runtime", [] { return cpu_threads_beside_runtime(); });
  // torch.Event.elapsed_time takes only an exact torch.Event; torch.tpu.Event subclasses
  // it (so torch.Stream.wait_event takes it) and times through the event ids, with the
  // guard's own elapsedTime.
  m.def("_event_elapsed_ms", [](uintptr_t a, uintptr_t b) {
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
        ->elapsedTime(reinterpret_cast<void*>(a), reinterpret_cast<void*>(b), 0);
  });
  m.def("_set_backward_site", [](const std::string& s) { set_backward_site(s); });
  m.def("_plan_cache_stats", [] {
    uint64_t plans, hits;
    tpu_plan_cache_stats(&plans, &hits);
    return py::make_tuple(plans, hits);
  });
  m.def("_trace", [] {
    py::list out;
    tpu_trace_record_t r;
    for (int i = 0; tpu_trace_get(i, &r); ++i) {
      py::dict d;
      d["op"] = r.op; d["shapes"] = r.shapes; d["site"] = r.site; d["us"] = r.us;
      d["path"] = r.fallback ? "fallback" : "native";
      d["fusable"] = r.fusable;
      out.append(d);
    }
    return out;
  });
  m.def("_trace_clear", [] { tpu_trace_clear(); });
  m.def("_set_call_site", [](const std::string& s) { tpu_set_call_site(s.empty() ? nullptr : s.c_str()); });
}
