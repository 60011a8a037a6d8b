// ATen registration for the tpu device (PrivateUse1).
//
// One boxed kernel serves every op libtpurt implements: it turns the stack into
// tpu_arg_t (schema order), lets libtpurt validate and build the IR node, binds outputs
// (new tensors / self / the resized out= tensors) and submits. The op list itself comes
// from libtpurt's table, so adding an op touches only C. The rest of this file is the
// small set of ops every PrivateUse1 backend must provide (allocation, views, copies,
// resize, set_, item) and the counted CPU fallback.
#include <ATen/EmptyTensor.h>
#include <ATen/SDPBackend.h>
#include <ATen/autocast_mode.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_native_multi_head_attention_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_transformer_encoder_layer_fwd_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include <chrono>
#include <map>
#include <mutex>

#include "adapter.h"

namespace torchtpu {
namespace {

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

at::Tensor to_tpu(const at::Tensor& t, c10::DeviceIndex d) {
  return t.to(at::Device(kTpu, d));
}

// ---- the generic boxed kernel ------------------------------------------------------
// Backing storage of the converted arguments' lists; outlives tpu_op_prepare. An inner
// vector's data stays put when the outer one grows.
struct ArgStore {
  c10::SmallVector<at::Tensor, 2> keep;  // uploaded CPU tensors stay alive
  std::vector<std::vector<tpu_view_t>> views;
  std::vector<std::vector<int64_t>> ints;
  std::vector<std::vector<double>> dbls;
  std::vector<std::vector<tpu_arg_t>> scalars;
};

struct OpKernel final : c10::OperatorKernel {
  int index = 0;
  tpu_variant_t variant = TPU_VARIANT_FUNCTIONAL;
  bool foreach = false;               // a torch._foreach_* op (tpu_foreach_prepare)
  int n_args = 0;
  int n_out_args = 0;                 // trailing out= arguments
  bool needs_seed = false;            // append a generator seed (tpu_aten_op_needs_seed)
  bool resizes_self = false;          // in place, self takes the result's shape (addbmm_)
  std::vector<bool> is_generator;     // per argument: Generator?
  std::vector<bool> is_scalar;        // per argument: Scalar (a number of any kind)
  std::vector<bool> is_scalar_list;   // per argument: Scalar[]
  std::vector<int> written_args;      // in-place forms: the written (a!) arguments, in order
  // Per schema return: true for Tensor. Tensor returns beyond the node's outputs (e.g.
  // the unused philox/cum_seq slots of fused attention) come back as empty tensors,
  // integer returns as 0.
  std::vector<bool> ret_is_tensor;

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

 private:
  void convert(c10::ArrayRef<c10::IValue> args, c10::DeviceIndex dev, const std::string& name,
               c10::SmallVector<tpu_arg_t, 12>& targs, ArgStore& store) const;
  void run_foreach(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::ArrayRef<c10::IValue> args,
                   c10::DeviceIndex dev, const c10::SmallVector<tpu_arg_t, 12>& targs) const;
};

// Fills a kernel's per-argument facts from the op's schema.
void init_kernel(OpKernel& k, int index, const c10::FunctionSchema& schema) {
  k.index = index;
  k.needs_seed = tpu_aten_op_needs_seed(index);
  k.resizes_self = tpu_aten_op_resizes_self(index);
  k.foreach = tpu_aten_op_is_foreach(index);
  k.n_args = static_cast<int>(schema.arguments().size());
  for (const auto& arg : schema.arguments()) {
    if (arg.is_out()) k.n_out_args++;
    auto t = arg.real_type();
    if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
    k.is_generator.push_back(t->kind() == c10::TypeKind::GeneratorType);
    k.is_scalar.push_back(t->kind() == c10::TypeKind::NumberType);
    auto l = t->cast<c10::ListType>();
    k.is_scalar_list.push_back(l && l->getElementType()->kind() == c10::TypeKind::NumberType);
    if (!arg.is_out() && arg.alias_info() && arg.alias_info()->isWrite())
      k.written_args.push_back(static_cast<int>(k.is_scalar_list.size()) - 1);
  }
  for (const auto& r : schema.returns())
    k.ret_is_tensor.push_back(r.real_type()->kind() == c10::TypeKind::TensorType);
  if (k.n_out_args) k.variant = TPU_VARIANT_OUT;
  else if (!schema.arguments().empty() && schema.arguments()[0].alias_info() &&
           schema.arguments()[0].alias_info()->isWrite())
    k.variant = TPU_VARIANT_INPLACE;
}

// An op of another library (torchvision) whose schema may be defined after this one
// loads: the kernel reads the schema on its first call.
struct LazyOpKernel final : c10::OperatorKernel {
  int index = 0;
  std::once_flag once;
  OpKernel k;
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    std::call_once(once, [&] { init_kernel(k, index, op.schema()); });
    k(op, ks, stack);
  }
};

c10::DeviceIndex device_of_args(c10::ArrayRef<c10::IValue> args) {
  for (const auto& a : args) {
    if (a.isTensor() && a.toTensor().defined() && a.toTensor().device().type() == kTpu)
      return a.toTensor().device().index();
    if (a.isTensorList())
      for (const auto& t : a.toTensorList())
        if (static_cast<at::Tensor>(t).defined() && static_cast<at::Tensor>(t).device().type() == kTpu)
          return static_cast<at::Tensor>(t).device().index();
  }
  return current_device();
}

// A new contiguous tensor on device dev: the registered empty.memory_format, and a
// kernel's outputs, which come here without a second trip through the dispatcher
// (at::empty was ~4% of a 16-element op's dispatch). The guard switches devices only
// for another device than the current one.
at::Tensor empty_on(at::IntArrayRef shape, at::ScalarType dtype, c10::DeviceIndex dev,
                    std::optional<at::MemoryFormat> mf = std::nullopt) {
  c10::OptionalDeviceGuard g;
  if (dev != current_device()) g.reset_device(at::Device(kTpu, dev));
  return at::detail::empty_generic(shape, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dtype, mf);
}

void clear_arg(tpu_arg_t& a) {
  a.kind = TPU_ARG_NONE;
  a.scalar_kind = TPU_SCALAR_INT;
  a.scalar_is_tensor = false;
  a.scalar_dtype = TPU_DTYPE_INVALID;
  a.v.i = 0;
  a.scalar_im = 0;
  a.tensor.storage = nullptr;
  a.list = nullptr;
  a.dlist = nullptr;
  a.tensors = nullptr;
  a.list_len = 0;
  a.s = nullptr;
}

void scalar_arg(tpu_arg_t& a, const c10::Scalar& s, const std::string& op) {
  a.kind = TPU_ARG_SCALAR;
  if (s.isBoolean()) { a.scalar_kind = TPU_SCALAR_BOOL; a.v.i = s.toBool(); }
  else if (s.isIntegral(false)) { a.scalar_kind = TPU_SCALAR_INT; a.v.i = s.toLong(); }
  else if (s.isFloatingPoint()) { a.scalar_kind = TPU_SCALAR_FLOAT; a.v.d = s.toDouble(); }
  else if (s.isComplex()) {
    auto z = s.toComplexDouble();
    a.scalar_kind = TPU_SCALAR_COMPLEX;
    a.v.d = z.real();
    a.scalar_im = z.imag();
  } else check(tpu_status_make(TPU_UNIMPLEMENTED, "%s: this kind of scalar is not supported on tpu", op.c_str()));
}

// Each schema argument as a tpu_arg_t (targs, one per argument, in order).
void OpKernel::convert(c10::ArrayRef<c10::IValue> args, c10::DeviceIndex dev, const std::string& name,
                       c10::SmallVector<tpu_arg_t, 12>& targs, ArgStore& store) const {
  // Each argument's header is cleared below; its 200-byte tensor view is written only
  // for tensor arguments (the only kind that reads it).
  targs.resize_for_overwrite(n_args);
  for (int i = 0; i < n_args; ++i) {
    const c10::IValue& v = args[i];
    tpu_arg_t& a = targs[i];
    clear_arg(a);
    if (v.isNone()) {
      if (is_generator[i]) { a.kind = TPU_ARG_INT; a.v.i = draw_seed(std::nullopt, dev); }
      else a.kind = TPU_ARG_NONE;
    } else if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) { a.kind = TPU_ARG_NONE; continue; }
      if (t.device().type() == kTpu) {
        a.kind = TPU_ARG_TENSOR;
        a.tensor = view_of(t);
      } else if (t.dim() == 0 && t.device().is_cpu()) {
        scalar_arg(a, t.item(), name);
        a.scalar_is_tensor = !t.unsafeGetTensorImpl()->is_wrapped_number();
        a.scalar_dtype = static_cast<tpu_dtype_t>(t.scalar_type());
      } else {
        TORCH_CHECK(false, name, ": Expected all tensors to be on the same device, but found "
                    "at least two devices, tpu:", int(dev), " and ", t.device().str(), "!");
      }
    } else if (is_scalar[i] && v.isScalar()) {
      scalar_arg(a, v.toScalar(), name);
    } else if (v.isInt()) {
      a.kind = TPU_ARG_INT; a.v.i = v.toInt();
    } else if (v.isDouble()) {
      a.kind = TPU_ARG_DOUBLE; a.v.d = v.toDouble();
    } else if (v.isBool()) {
      a.kind = TPU_ARG_BOOL; a.v.b = v.toBool();
    } else if (v.isIntList() && !is_scalar_list[i]) {
      store.ints.push_back(v.toIntVector());
      a.kind = TPU_ARG_INTLIST;
      a.list = store.ints.back().data();
      a.list_len = static_cast<int64_t>(store.ints.back().size());
    } else if (v.isBoolList() && !is_scalar_list[i]) {  // bool[N] (output_mask): 0/1 ints
      store.ints.emplace_back();
      for (bool b : v.toBoolList()) store.ints.back().push_back(b);
      a.kind = TPU_ARG_INTLIST;
      a.list = store.ints.back().data();
      a.list_len = static_cast<int64_t>(store.ints.back().size());
    } else if (v.isDoubleList() && !is_scalar_list[i]) {
      store.dbls.push_back(v.toDoubleVector());
      a.kind = TPU_ARG_DOUBLELIST;
      a.dlist = store.dbls.back().data();
      a.list_len = static_cast<int64_t>(store.dbls.back().size());
    } else if (is_scalar_list[i] && v.isList()) {  // Scalar[] (foreach ops)
      auto& sc = store.scalars.emplace_back();
      for (const c10::IValue& e : v.toListRef()) {
        tpu_arg_t& x = sc.emplace_back();
        clear_arg(x);
        scalar_arg(x, e.toScalar(), name);
      }
      a.kind = TPU_ARG_SCALARLIST;
      a.scalars = sc.data();
      a.list_len = static_cast<int64_t>(sc.size());
    } else if (v.isTensorList() || v.isList()) {
      auto& views = store.views.emplace_back();
      for (const c10::IValue& e : v.toListRef()) {
        tpu_view_t tv{};
        if (e.isTensor() && e.toTensor().defined()) {
          at::Tensor t = e.toTensor();
          if (t.device().type() != kTpu) { t = to_tpu(t, dev); store.keep.push_back(t); }
          tv = view_of(t);
        }
        views.push_back(tv);
      }
      a.kind = TPU_ARG_TENSORLIST;
      a.tensors = views.data();
      a.list_len = static_cast<int64_t>(views.size());
    } else if (v.isString()) {
      a.kind = TPU_ARG_STRING;
      a.s = v.toStringRef().c_str();
    } else if (v.isGenerator()) {
      a.kind = TPU_ARG_INT;
      a.v.i = draw_seed(v.toGenerator(), dev);
    } else if (v.isDevice()) {
      a.kind = TPU_ARG_INT; a.v.i = v.toDevice().index();
    } else {
      TORCH_CHECK_NOT_IMPLEMENTED(false, name, ": argument ", i, " of kind ", v.tagKind(),
                                  " is not supported by the tpu adapter");
    }
  }
}

// ATen's memory-overlap rules for a tensor w an op writes (libtpurt's
// tpu_aten_check_overlap, on the views): w whose elements share memory (an expanded
// tensor) is refused, as is w partly over an input; w exactly equal to an input only where
// the kernel allows it (may_alias: tpu_node_may_alias_input). Without these, kernels read
// what they already overwrote. args are the op's inputs, among them w itself at position
// self (in-place forms; -1 for out=). Host and sparse tensors cannot overlap tpu memory.
void check_overlap(const std::string& name, c10::ArrayRef<c10::IValue> args, const at::Tensor& w,
                   bool may_alias, int self) {
  if (w.layout() != at::kStrided || w.device().type() != kTpu) return;
  const tpu_view_t wv = view_of(w);
  c10::SmallVector<tpu_view_t, 8> views;
  c10::SmallVector<bool, 8> is_w;  // the input is w itself (the same TensorImpl)
  auto add = [&](const at::Tensor& t) {
    if (!t.defined() || t.layout() != at::kStrided || t.device().type() != kTpu) return;
    is_w.push_back(t.is_same(w));
    views.push_back(is_w.back() ? wv : view_of(t));
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a.isTensor()) {
      if (static_cast<int>(i) != self) add(a.toTensor());
    } else if (a.isTensorList()) {
      for (const auto& t : a.toTensorList()) add(t);
    }
  }
  c10::SmallVector<const tpu_view_t*, 8> ins;
  for (size_t i = 0; i < views.size(); ++i) ins.push_back(is_w[i] ? &wv : &views[i]);
  check(tpu_aten_check_overlap(name.c_str(), &wv, ins.data(), static_cast<int>(ins.size()), self >= 0, may_alias));
}

void OpKernel::operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, n_args);
  c10::DeviceIndex dev = device_of_args(args);
  OpSite site;
  // Small inline buffers: most ops have a handful of arguments and no lists, so the
  // common call allocates nothing here (this is on every op's dispatch path).
  c10::SmallVector<tpu_arg_t, 12> targs;
  ArgStore store;
  const std::string& name = op.schema().name();
  if (foreach) {
    // ATen's slow kernel would run each position on its own tensor's device; here every
    // list member must be on tpu (an in-place result must land in self itself).
    for (int i = 0; i < n_args; ++i) {
      if (!args[i].isTensorList()) continue;
      c10::ArrayRef<c10::IValue> list = args[i].toListRef();  // no reference counting per member
      for (size_t k = 0; k < list.size(); ++k) {
        const at::Tensor& t = list[k].toTensor();
        TORCH_CHECK(!t.defined() || t.device().type() == kTpu, name,
                    ": Expected all tensors to be on the same device, but found at least two devices, tpu:",
                    int(dev), " and ", t.device().str(), "! (argument ", i, ", list position ", k, ")");
      }
    }
  }
  convert(args, dev, name, targs, store);
  if (foreach) {
    run_foreach(op, stack, args, dev, targs);
    return;
  }

  if (needs_seed) {
    tpu_arg_t seed;
    clear_arg(seed);
    seed.kind = TPU_ARG_INT;
    seed.v.i = draw_seed(std::nullopt, dev);
    targs.push_back(seed);
  }
  tpu_node_t* node = nullptr;
  tpu_status_t st = tpu_op_prepare(index, variant, targs.data(), static_cast<int>(targs.size()), &node);
  if (st && tpu_status_code(st) == TPU_UNIMPLEMENTED) {
    // e.g. a dtype the native kernel does not cover: the counted CPU fallback runs it
    // (and names libtpurt's reason when the fallback is disabled).
    std::string why = tpu_status_message(st);
    tpu_status_free(st);
    cpu_fallback_with_reason(op, stack, why);
    return;
  }
  check(st);
  int n_out = tpu_node_output_count(node);
  c10::SmallVector<at::Tensor, 4> outs(n_out);
  try {
    const bool may_alias = variant != TPU_VARIANT_FUNCTIONAL && tpu_node_may_alias_input(node);
    const auto ins = args.slice(0, n_args - n_out_args);
    for (int w : written_args) check_overlap(name, ins, args[w].toTensor(), may_alias, w);
    for (int i = 0; i < n_out; ++i) {
      tpu_dtype_t dt;
      int32_t nd;
      int64_t sizes[TPU_MAX_DIMS];
      tpu_node_output_meta(node, i, &dt, &nd, sizes);
      if (nd < 0) continue;  // absent output: an undefined tensor
      at::IntArrayRef shape(sizes, nd);
      if (variant == TPU_VARIANT_INPLACE && static_cast<size_t>(i) < written_args.size()) {
        outs[i] = args[written_args[i]].toTensor();  // self, and any other written argument
        if (i == 0 && resizes_self && outs[i].sizes() != shape) {
          // The node holds self's old contents as an input: a storage large enough to keep
          // would be written while they are read, so that case is refused (CPU computes from
          // partly overwritten contents there).
          const auto& w = outs[i];
          TORCH_CHECK((w.storage_offset() + c10::multiply_integers(shape)) * w.dtype().itemsize() >
                          w.storage().nbytes(),
                      name, ": unsupported operation: some elements of the input tensor and the written-to "
                      "tensor refer to a single memory location. Please clone() the tensor before performing "
                      "the operation.");
          outs[i].resize_(shape);
          check_overlap(name, ins, outs[i], may_alias, -1);
        }
      } else if (variant == TPU_VARIANT_OUT && i < n_out_args) {
        outs[i] = args[n_args - n_out_args + i].toTensor();
        TORCH_CHECK(outs[i].device().type() == kTpu, name, ": out= tensor must be on tpu, got ",
                    outs[i].device().str());
        // an out= tensor that is also an input is read and written: ATen does not resize it
        // (ldexp_ and addr_ come here as their out= forms with out = self)
        if (outs[i].sizes() != shape)
          for (int k = 0; k < n_args - n_out_args; ++k)
            TORCH_CHECK(!args[k].isTensor() || !args[k].toTensor().is_same(outs[i]), name,
                        ": output with shape ", outs[i].sizes(), " doesn't match the broadcast shape ", shape);
        // before resizing (TensorIterator's order) and after (structured kernels')
        check_overlap(name, ins, outs[i], may_alias, -1);
        if (at::native::resize_output(outs[i], shape)) check_overlap(name, ins, outs[i], may_alias, -1);
      } else {
        outs[i] = empty_on(shape, static_cast<at::ScalarType>(dt), dev);
      }
      tpu_view_t ov = view_of(outs[i]);
      check(tpu_node_bind_output(node, i, &ov));
    }
  } catch (...) {
    tpu_node_discard(node);
    throw;
  }
  tpu_status_t sub = tpu_node_submit(node);
  name_heuristic_cuts();
  if (site.active) {
    char w[512];
    while (tpu_take_warning(w, sizeof w)) TORCH_WARN(w);
  }
  check(sub);
  torch::jit::drop(*stack, n_args);
  size_t next = 0;
  for (bool is_tensor : ret_is_tensor) {
    if (!is_tensor) torch::jit::push(*stack, c10::IValue(int64_t{0}));
    else if (next < outs.size()) torch::jit::push(*stack, std::move(outs[next++]));
    else torch::jit::push(*stack, at::empty({0}, at::TensorOptions().device(at::Device(kTpu, dev))));
  }
}

// A torch._foreach_* op: libtpurt prepares the element op's node for every list position,
// then each is bound, then all are submitted in order; so a bad position (a builder's or
// an in-place cast error) fails the call before any position runs. Functional forms: one new tensor per position. In-place forms:
// output i is the i-th written argument, position k of it for a list (self; the fused
// optimizers also update grads and their state lists, GradScaler's unscale found_inf),
// absent outputs left unbound.
void OpKernel::run_foreach(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::ArrayRef<c10::IValue> args,
                           c10::DeviceIndex dev, const c10::SmallVector<tpu_arg_t, 12>& targs) const {
  int64_t len = 0;
  check(tpu_foreach_length(index, targs.data(), n_args, &len));
  std::vector<tpu_node_t*> nodes(static_cast<size_t>(len), nullptr);
  auto discard_from = [&](int64_t k) {
    for (; k < len; ++k) tpu_node_discard(nodes[k]);
  };
  for (int64_t k = 0; k < len; ++k) {
    tpu_status_t st = tpu_foreach_prepare(index, variant, targs.data(), n_args, k, &nodes[k]);
    size_t want = variant == TPU_VARIANT_INPLACE ? written_args.size() : 1;
    if (!st && static_cast<size_t>(tpu_node_output_count(nodes[k])) != want)
      st = tpu_status_make(TPU_INTERNAL, "%s: element op with %d outputs", tpu_aten_op_name(index),
                           tpu_node_output_count(nodes[k]));
    if (!st) continue;
    discard_from(0);
    if (tpu_status_code(st) == TPU_UNIMPLEMENTED) {  // e.g. a dtype: the whole call on the CPU
      std::string why = tpu_status_message(st);
      tpu_status_free(st);
      cpu_fallback_with_reason(op, stack, why);
      return;
    }
    check(st);
  }
  c10::List<at::Tensor> outs;
  if (variant != TPU_VARIANT_INPLACE) outs.reserve(static_cast<size_t>(len));
  try {
    for (int64_t k = 0; k < len; ++k) {
      for (int i = 0; i < tpu_node_output_count(nodes[k]); ++i) {
        tpu_dtype_t dt;
        int32_t nd;
        int64_t sizes[TPU_MAX_DIMS];
        tpu_node_output_meta(nodes[k], i, &dt, &nd, sizes);
        if (nd < 0) continue;  // absent (e.g. max_exp_avg_sqs without amsgrad)
        at::Tensor out;
        if (variant == TPU_VARIANT_INPLACE) {
          const tpu_arg_t& wa = targs[written_args[i]];
          if (wa.kind == TPU_ARG_TENSORLIST) {
            // a written list's views were taken when the arguments were converted (every
            // member is on tpu, checked above): position k's is the output's view
            check(tpu_node_bind_output(nodes[k], i, &wa.tensors[k]));
            continue;
          }
          out = args[written_args[i]].toTensor();
        } else {
          out = empty_on(at::IntArrayRef(sizes, nd), static_cast<at::ScalarType>(dt), dev);
          outs.push_back(out);
        }
        tpu_view_t ov = view_of(out);
        check(tpu_node_bind_output(nodes[k], i, &ov));  // e.g. an in-place cast error
      }
    }
  } catch (...) {
    discard_from(0);
    throw;
  }
  for (int64_t k = 0; k < len; ++k) {
    tpu_status_t st = tpu_node_submit(nodes[k]);
    nodes[k] = nullptr;
    if (st) {
      discard_from(k + 1);
      check(st);
    }
  }
  name_heuristic_cuts();
  if (tpu_get_eager_mode() == TPU_EAGER_DEBUG) {
    char w[512];
    while (tpu_take_warning(w, sizeof w)) TORCH_WARN(w);
  }
  torch::jit::drop(*stack, n_args);
  if (!ret_is_tensor.empty()) torch::jit::push(*stack, std::move(outs));
}

// ---- counted CPU fallback ----------------------------------------------------------------
std::mutex g_fb_mu;
std::map<std::string, int64_t> g_fb_counts;
std::string g_fb_mode = [] {
  const char* e = std::getenv("TORCHTPU_FALLBACK");
  return std::string(e && *e ? e : "warn");
}();

}  // namespace

void cpu_fallback_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  cpu_fallback_with_reason(op, stack, "");
}

void cpu_fallback_with_reason(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& why) {
  const auto& s = op.schema();
  std::string name = s.name() + (s.overload_name().empty() ? "" : "." + s.overload_name());
  bool first;
  std::string mode;
  {
    std::lock_guard<std::mutex> lk(g_fb_mu);
    first = g_fb_counts[name]++ == 0;
    mode = g_fb_mode;
  }
  OpSite site;
  TORCH_CHECK_NOT_IMPLEMENTED(mode != "error", name,
      " has no native tpu kernel", why.empty() ? "" : " for this call (", why, why.empty() ? "" : ")",
      " and the CPU fallback is disabled "
      "(torchtpu.set_fallback(\"error\")). Enable it with torchtpu.set_fallback(\"warn\").");
  if (first && mode == "warn")
    TORCH_WARN(name, " is not implemented natively for tpu; running it on the CPU "
               "(slow: data moves to the host and back). See torchtpu.fallback_report().");
  {  // the CPU kernel sees host copies, which never overlap: check the tpu tensors here
     // (full overlap with an input is left alone where the CPU kernel allows it: most do)
    auto args = torch::jit::last(*stack, static_cast<int64_t>(s.arguments().size()));
    bool may_alias = !(tpu_aten_overlap_rule(s.name().c_str()) & TPU_OVERLAP_NO_FULL_ALIAS);
    for (size_t i = 0; i < s.arguments().size(); ++i) {
      const auto& a = s.arguments()[i];
      if (a.alias_info() && a.alias_info()->isWrite() && args[i].isTensor() && args[i].toTensor().defined() &&
          args[i].toTensor().layout() == at::kStrided)  // sparse members are written whole
        check_overlap(s.name(), a.is_out() ? args.slice(0, i) : args, args[i].toTensor(), may_alias,
                      a.is_out() ? -1 : static_cast<int>(i));
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  if (has_sparse_arg(op, *stack)) sparse_cpu_fallback(op, stack);
  else at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
  if (site.active) {
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    tpu_trace_fallback(name.c_str(), us);
  }
}

std::vector<std::pair<std::string, int64_t>> fallback_counts() {
  std::lock_guard<std::mutex> lk(g_fb_mu);
  return {g_fb_counts.begin(), g_fb_counts.end()};
}
void reset_fallback_counts() {
  std::lock_guard<std::mutex> lk(g_fb_mu);
  g_fb_counts.clear();
}
void set_fallback_mode(const std::string& mode) {
  TORCH_CHECK_VALUE(mode == "allow" || mode == "warn" || mode == "error",
                    "set_fallback: mode must be 'allow', 'warn' or 'error', got '", mode, "'");
  std::lock_guard<std::mutex> lk(g_fb_mu);
  g_fb_mode = mode;
}
std::string fallback_mode() {
  std::lock_guard<std::mutex> lk(g_fb_mu);
  return g_fb_mode;
}

namespace {

// ---- the fixed set of backend ops ----------------------------------------------------
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin, std::optional<at::MemoryFormat> mf) {
  return empty_on(size, c10::dtype_or_default(dtype),
                  device && device->has_index() ? device->index() : current_device(), mf);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin) {
  c10::DeviceGuard g(device.value_or(at::Device(kTpu, current_device())));
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size_sym,
                          std::optional<at::MemoryFormat> mf) {
  auto size = C10_AS_INTARRAYREF_SLOW(size_sym);
  auto* impl = self.unsafeGetTensorImpl();
  int64_t numel = c10::multiply_integers(size);
  size_t needed = (self.storage_offset() + numel) * self.dtype().itemsize();
  if (needed > self.storage().nbytes()) resize_storage_bytes(self.storage(), needed);
  impl->set_sizes_contiguous(size);
  if (mf && *mf != at::MemoryFormat::Preserve) impl->empty_tensor_restride(*mf);
  return self;
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage src, int64_t offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(src));
  impl->set_storage_offset(offset);
  std::optional<c10::IntArrayRef> st = stride.data() ? std::optional(stride) : std::nullopt;
  if (st) impl->set_sizes_and_strides(size, *st);
  else impl->set_sizes_contiguous(size);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage src) {
  int64_t n = static_cast<int64_t>(src.nbytes() / self.dtype().itemsize());
  return set_source_storage_offset(self, std::move(src), 0, {n}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& src) {
  return set_source_storage_offset(self, src.storage(), src.storage_offset(), src.sizes(), src.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  auto storage = at::Storage(at::Storage::use_byte_size_t(), 0, device_allocator(), true);
  return set_source_storage_offset(self, storage, 0, {0}, {});
}

// Dense CPU bytes in t's dtype and shape, ready for tpu_copy_from_host.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.sizes() == dst.sizes() || dst.numel() == self.numel() ||
              at::infer_size(dst.sizes(), self.sizes()) == dst.sizes(),
              "copy_: cannot copy a tensor of shape ", self.sizes(), " into ", dst.sizes());
  if (dst.numel() == 0) return dst;
  bool src_tpu = self.device().type() == kTpu, dst_tpu = dst.device().type() == kTpu;
  if (dst_tpu) {  // copy_'s TensorIterator checks, which a backend's _copy_from is left to make
    const c10::IValue src[] = {src_tpu ? self : at::Tensor()};
    check_overlap("aten::copy_", src, dst, /*may_alias=*/true, -1);
  }
  for (const at::Tensor* t : {&self, &dst})  // (storage-only dtypes included)
    TORCH_CHECK_NOT_IMPLEMENTED(t->device().type() != kTpu ||
                                tpu_dtype_size(static_cast<tpu_dtype_t>(t->scalar_type())) != 0,
        "copy between ", self.device().str(), " and ", dst.device().str(), ": dtype ",
        t->scalar_type(), " is not supported on tpu");
  // Conjugate / negative bits: the values written are self's logical values, stored
  // under dst's own bits (a flagged dst holds the conjugate / negation physically).
  const bool conj = self.is_conj() != dst.is_conj(), neg = self.is_neg() != dst.is_neg();
  if (self.is_complex() && !dst.is_complex()) {
    TORCH_WARN_ONCE("Casting complex values to real discards the imaginary part");
  }
  if (src_tpu && dst_tpu) {
    // Device to device (possibly across devices): the runtime's copy op casts/broadcasts.
    if (self.device() != dst.device()) {
      at::Tensor host = self.cpu();
      return copy_from(host, dst, non_blocking);
    }
    tpu_view_t dv = view_of(dst), sv = view_of(self);
    tpu_status_t st = tpu_copy_math(&dv, &sv, conj, neg);  // libtpurt's copy node: broadcast + dtype cast
    if (tpu_status_code(st) == TPU_UNIMPLEMENTED) {  // a storage-only dtype's conversion: on the CPU
      tpu_status_free(st);
      // (not self.cpu(): for a conjugated self that resolves the bit on tpu first, here again)
      at::Tensor host = at::empty(self.sizes(), self.options().device(at::kCPU));
      copy_from(self, host, false);
      return copy_from(host, dst, non_blocking);
    }
    check(st);
    name_heuristic_cuts();
    return dst;
  }
  if (dst_tpu) {
    at::Tensor src = self.resolve_conj().resolve_neg();
    if (dst.is_conj()) src = src.conj().resolve_conj();
    if (dst.is_neg()) src = src.neg();
    src = src.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    tpu_view_t v = view_of(dst);
    check(tpu_copy_from_host(&v, src.data_ptr()));
    name_heuristic_cuts();
    return dst;
  }
  // tpu -> cpu: read src densely in its own dtype, then let CPU convert/stride.
  CutSite site;
  at::Tensor host = at::empty(self.sizes(), self.options().device(at::kCPU));
  tpu_view_t v = view_of(self);
  check(tpu_copy_to_host(&v, host.data_ptr()));
  if (self.is_conj()) host = host.conj_physical();  // the bytes are the unconjugated values
  if (self.is_neg()) host.neg_();  // the bytes are the un-negated values
  at::Tensor d = dst;
  d.copy_(host);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_output(dst, self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  CutSite site;
  return self.cpu().item();
}

// scaled_dot_product_attention asks the backend (through a dispatch stub) which kernel
// to use. The answer is libtpurt's own: a dry run of the fused op's builder (validation
// only, nothing queued) accepts exactly what the fused kernel supports; anything else
// (attention dropout, other ranks) takes PyTorch's math path over native ops.
int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  static const int index = [] {
    for (int i = 0; i < tpu_aten_op_count(); ++i)
      if (std::string(tpu_aten_op_name(i)) == "_scaled_dot_product_fused_attention_overrideable") return i;
    return -1;
  }();
  if (index < 0) return static_cast<int64_t>(at::SDPBackend::math);
  // torch.compile's tracing asks with FakeTensors, which have no device storage: the dry
  // run then uses empty tpu tensors of the same sizes, strides and dtype.
  auto with_storage = [](const at::Tensor& t) {
    if (t.has_storage() && t.storage().device_type() == kTpu && storage_of(t)) return t;
    // (made below the Python dispatch keys: under FakeTensorMode it would be fake too)
    c10::impl::ExcludeDispatchKeyGuard real(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    int64_t extent = 1;
    for (int64_t d = 0; d < t.dim(); ++d) extent += (t.size(d) - 1) * t.stride(d);
    if (t.numel() == 0) extent = 0;
    return at::empty({t.storage_offset() + extent}, t.options().device(at::Device(kTpu, t.device().index())))
        .as_strided(t.sizes(), t.strides(), t.storage_offset());
  };
  tpu_arg_t args[8] = {};
  at::Tensor held[4];
  const at::Tensor* ts[4] = {&q, &k, &v, mask && mask->defined() ? &*mask : nullptr};
  for (int i = 0; i < 4; ++i) {
    if (!ts[i]) continue;
    // Symbolic sizes (torch.compile with dynamic shapes): the graph serves every size its
    // guards allow, which one dry run cannot answer for; the math composition can run them all.
    if (ts[i]->device().type() != kTpu || ts[i]->dim() > TPU_MAX_DIMS ||
        ts[i]->unsafeGetTensorImpl()->has_symbolic_sizes_strides())
      return static_cast<int64_t>(at::SDPBackend::math);
    held[i] = with_storage(*ts[i]);
    args[i].kind = TPU_ARG_TENSOR;
    args[i].tensor = view_of(held[i]);
  }
  args[4].kind = TPU_ARG_DOUBLE; args[4].v.d = dropout_p;
  args[5].kind = TPU_ARG_BOOL; args[5].v.b = is_causal;
  args[6].kind = TPU_ARG_BOOL; args[6].v.b = false;
  if (scale) { args[7].kind = TPU_ARG_DOUBLE; args[7].v.d = *scale; }
  tpu_node_t* node = nullptr;
  tpu_status_t st = tpu_op_prepare(index, TPU_VARIANT_FUNCTIONAL, args, 8, &node);
  tpu_node_discard(node);
  bool native = st == nullptr;
  tpu_status_free(st);
  return static_cast<int64_t>(native ? at::SDPBackend::overrideable : at::SDPBackend::math);
}

// `param.data = t` and Module.to() ask whether a tensor's metadata may be swapped in
// place; c10 answers yes only for its own dense backends and leaves PrivateUse1 to the
// backend. Dense strided tpu and CPU tensors are interchangeable this way, which keeps
// tied parameters tied across Module.to("tpu") (otherwise every module gets its own copy).
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    auto d = t.device().type();
    return t.layout() == at::kStrided && (d == kTpu || d == at::kCPU);
  };
  return dense(self) && dense(from);
}

// mode.values is CompositeExplicitAutograd in ATen, with a kernel that accepts CPU, CUDA
// and XPU tensors only: for tpu, mode itself (the table's or the fallback's) copied into
// the out= tensors, checked as ATen's out= ops check them.
std::tuple<at::Tensor&, at::Tensor&> mode_values(const at::Tensor& self, int64_t dim, bool keepdim,
                                                 at::Tensor& values, at::Tensor& indices) {
  TORCH_CHECK(values.scalar_type() == self.scalar_type(), "mode(): expected out= values of dtype ",
              self.scalar_type(), ", got ", values.scalar_type());
  TORCH_CHECK(indices.scalar_type() == at::kLong, "mode(): expected out= indices of dtype Long, got ",
              indices.scalar_type());
  auto [v, i] = at::mode(self, dim, keepdim);
  at::native::resize_output(values, v.sizes());
  at::native::resize_output(indices, i.sizes());
  values.copy_(v);
  indices.copy_(i);
  return {values, indices};
}

}  // namespace

std::vector<std::string> g_native, g_skipped;
std::vector<std::string> native_op_names() { return g_native; }
std::vector<std::string> skipped_op_names() { return g_skipped; }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  // complex <-> (..., 2) real views of the same storage: ATen's metadata functions
  // (sizes, strides and offset in the other dtype's elements), no data moves.
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("mode.values", mode_values);
  // The "better transformer" fast path: nn.MultiheadAttention / nn.TransformerEncoderLayer
  // in eval call ATen's _native_multi_head_attention (CPU) and
  // _transformer_encoder_layer_fwd, compositions of dispatcher ops registered for tpu as
  // they are. The CPU-only kernels they call (_transform_bias_rescale_qkv, _masked_softmax,
  // _addmm_activation) are libtpurt ops like any other (the table below).
  m.impl("_native_multi_head_attention", at::native::native_multi_head_attention_cpu);
  m.impl("_transformer_encoder_layer_fwd", at::native::transformer_encoder_layer_forward);

  auto& disp = c10::Dispatcher::singleton();
  for (int i = 0; i < tpu_aten_op_count(); ++i) {
    std::string full = tpu_aten_op_name(i);
    if (full.find("::") != std::string::npos) continue;  // another namespace: below
    auto dot = full.find('.');
    std::string base = full.substr(0, dot), ovl = dot == std::string::npos ? "" : full.substr(dot + 1);
    auto h = disp.findSchema({"aten::" + base, ovl});
    // Unknown names and CompositeImplicitAutograd ops (whose autograd comes from their
    // decomposition) are skipped and listed by torchtpu._C._skipped_ops().
    if (!h || h->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
      g_skipped.push_back(full);
      continue;
    }
    auto k = std::make_unique<OpKernel>();
    init_kernel(*k, i, h->schema());
    g_native.push_back(full);
    m.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(k)));
  }
}

// torchvision's ops (nms, roi_align, ...) from libtpurt's "torchvision::" entries.
// Registered whether or not torchvision is installed or imported yet: the dispatcher
// keeps an implementation for a name whose schema comes later.
TORCH_LIBRARY_IMPL(torchvision, PrivateUse1, m) {
  const std::string prefix = "torchvision::";
  for (int i = 0; i < tpu_aten_op_count(); ++i) {
    std::string full = tpu_aten_op_name(i);
    if (full.rfind(prefix, 0) != 0) continue;
    auto k = std::make_unique<LazyOpKernel>();
    k->index = i;
    g_native.push_back(full);
    m.impl(full.substr(prefix.size()).c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(k)));
  }
}

// The conjugate/negative-bit fallbacks would materialize a flagged source with clone(),
// which copies through _copy_from again: endless recursion for a backend. _copy_from
// sees such tensors itself and resolves the bits in the copy (tpu_copy_math).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback_boxed>());
}

// Autocast for device "tpu": bf16 by default (set in Python), same op policies as CUDA.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  KERNEL_PRIVATEUSEONE(mm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(bmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(baddbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(matmul, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(linear, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv1d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv2d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(scaled_dot_product_attention, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(softmax, int, fp32)
  KERNEL_PRIVATEUSEONE(log_softmax, int, fp32)
  KERNEL_PRIVATEUSEONE(layer_norm, fp32)
  KERNEL_PRIVATEUSEONE(nll_loss, fp32)
  KERNEL_PRIVATEUSEONE(cross_entropy_loss, fp32)
  KERNEL_PRIVATEUSEONE(mse_loss, fp32)
  KERNEL_PRIVATEUSEONE(sum, fp32)
  KERNEL_PRIVATEUSEONE(exp, fp32)
  KERNEL_PRIVATEUSEONE(log, fp32)
  KERNEL_PRIVATEUSEONE(pow, Tensor_Scalar, fp32)
  KERNEL_PRIVATEUSEONE(rsqrt, fp32)
}

// torchvision's detection ops under autocast run in float32, as torchvision's own autocast
// kernels do for CPU and CUDA (the op's result is cast back to the input's dtype).
at::Tensor nms_autocast(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastPrivateUse1);
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchvision::nms", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return op.call(at::autocast::cached_cast(at::kFloat, dets, kTpu),
                 at::autocast::cached_cast(at::kFloat, scores, kTpu), iou_threshold);
}

at::Tensor roi_align_autocast(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                              c10::SymInt pooled_height, c10::SymInt pooled_width, int64_t sampling_ratio,
                              bool aligned) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastPrivateUse1);
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchvision::roi_align", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double, c10::SymInt, c10::SymInt,
                                         int64_t, bool)>();
  return op.call(at::autocast::cached_cast(at::kFloat, input, kTpu),
                 at::autocast::cached_cast(at::kFloat, rois, kTpu), spatial_scale, std::move(pooled_height),
                 std::move(pooled_width), sampling_ratio, aligned)
      .to(input.scalar_type());
}

TORCH_LIBRARY_IMPL(torchvision, AutocastPrivateUse1, m) {
  m.impl("nms", TORCH_FN(nms_autocast));
  m.impl("roi_align", TORCH_FN(roi_align_autocast));
}

}  // namespace torchtpu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchtpu::fused_sdp_choice)
}  // namespace at::native
