// The thin C++ adapter between PyTorch's dispatcher and libtpurt. Everything that
// decides semantics lives in the C runtime; this layer translates types and turns
// tpu_status_t into the exception PyTorch users expect (in exactly one place: raise()).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>

extern "C" {
#include "tpurt/runtime.h"
}

namespace torchtpu {

// Converts a failed status into the matching c10 exception and frees it.
[[noreturn]] void raise(tpu_status_t st);
inline void check(tpu_status_t st) {
  if (st) raise(st);
}

// The storage handle behind a tpu tensor (its DataPtr's context).
inline tpu_storage_t* storage_of(const at::Tensor& t) {
  return static_cast<tpu_storage_t*>(t.storage().data_ptr().get_context());
}
tpu_view_t view_of(const at::Tensor& t);

c10::DeviceAllocator* device_allocator();
at::Allocator* pinned_allocator();
bool is_pinned(const void* p);

c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex d);

const at::Generator& default_generator(c10::DeviceIndex d);
at::Generator new_generator(c10::DeviceIndex d);
// Draws the 64-bit seed a random op consumes from gen (or the device's default).
int64_t draw_seed(const std::optional<at::Generator>& gen, c10::DeviceIndex d);

// Storage resize used by resize_, set_ and FSDP's storage.resize_().
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);

// "file.py:42 in fn" of the innermost Python frame outside torch and torchtpu, or "" when
// the calling thread runs no Python (e.g. the autograd engine's device thread).
// Takes the GIL; used only where the cost is acceptable (debug mode, graph cuts).
std::string python_call_site();
// PyTorch CPU intra-op threads beside the host driver (device.cpp).
int cpu_threads_beside_runtime();
// After an op's submission: names the Python line of graph cuts that the op's submission
// made by heuristic (loop detection, size limit), which libtpurt cannot know. On the
// autograd engine's thread that is the line that started the backward pass, which
// torchtpu.modes records with set_backward_site.
void name_heuristic_cuts();
void set_backward_site(const std::string& site);
// Sets libtpurt's call site while alive (cleared on exit, also by an exception), if
// `active`. CutSite: for a host read, which cuts a graph in defer_and_fuse. OpSite: for
// every op in debug mode.
struct ScopedSite {
  explicit ScopedSite(bool active);
  ~ScopedSite();
  ScopedSite(const ScopedSite&) = delete;
  ScopedSite& operator=(const ScopedSite&) = delete;
  const bool active;
};
struct CutSite : ScopedSite {
  CutSite() : ScopedSite(tpu_get_eager_mode() == TPU_EAGER_DEFER) {}
};
struct OpSite : ScopedSite {
  OpSite() : ScopedSite(tpu_get_eager_mode() == TPU_EAGER_DEBUG) {}
};

// The counted, refusable CPU fallback (ops.cpp).
void cpu_fallback_boxed(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack);
// The same for a call libtpurt declined (UNIMPLEMENTED): `why` (its message, naming the
// op and e.g. the dtype) is part of the error when the fallback is disabled.
void cpu_fallback_with_reason(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack,
                              const std::string& why);
// Sparse tensors (sparse.cpp): whether a call has one among its arguments, and the CPU
// fallback's runner for such calls (members to the host, the op at its sparse CPU
// kernel, results and written arguments back).
bool has_sparse_arg(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);
void sparse_cpu_fallback(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack);
std::vector<std::pair<std::string, int64_t>> fallback_counts();
void set_fallback_mode(const std::string& mode);  // "allow" | "warn" | "error"
std::string fallback_mode();
void reset_fallback_counts();
std::vector<std::string> native_op_names();
std::vector<std::string> skipped_op_names();

}  // namespace torchtpu
