// Sparse layouts on tpu: COO (dispatch key SparsePrivateUse1) and the compressed layouts
// CSR/CSC/BSR/BSC (SparseCsrPrivateUse1). A sparse tpu tensor is ATen's own sparse impl
// whose members (indices, values; compressed and plain indices) are dense tpu tensors, so
// construction and the structure queries are ATen's native kernels, registered for these
// keys as CPU and CUDA register them. Every other op on a sparse tpu tensor runs through
// the counted CPU fallback (torchtpu.fallback_report()): the members go to the host, the
// op runs there, and sparse results come back as sparse tpu tensors.
#include <ATen/ATen.h>
#include <ATen/NativeFunctions.h>
#include <torch/library.h>

#include <string>

#include "adapter.h"

namespace torchtpu {
namespace {

// The fallback's way back for a written sparse argument: dst takes src's structure and
// members (on dst's device). Dense-to-dense copies never reach this key.
at::Tensor copy_from_and_resize_sparse(const at::Tensor& src, const at::Tensor& dst) {
  at::Tensor d = dst;
  TORCH_CHECK(src.layout() == dst.layout(), "copying a ", src.layout(), " tensor into a ", dst.layout(),
              " tpu tensor is not supported");
  if (dst.layout() == at::kSparse) return at::native::copy_sparse_(d, src, false);
  return at::native::copy_sparse_compressed_(d, src, false);
}

bool is_tpu_tensor(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == c10::DeviceType::PrivateUse1;
}

// The argument on the host: a tpu tensor (sparse ones through their members, by
// _to_copy), or a list of them; anything else as it is. *device becomes the tpu device
// seen. A copy keeps requires_grad: sparse kernels read it (the sparse mm reduce saves the
// argmax its backward reads only when an input requires grad, and that backward crashes
// on the empty one).
c10::IValue to_host(const c10::IValue& v, std::optional<c10::Device>* device) {
  auto host = [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return t;
    *device = t.device();
    at::Tensor h = t.cpu();
    if (t.requires_grad() && !h.requires_grad()) h.requires_grad_(true);
    return h;
  };
  if (v.isTensor()) return host(v.toTensor());
  if (v.isTensorList()) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(host(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList())
      out.push_back(t ? std::optional<at::Tensor>(host(*t)) : t);
    return out;
  }
  return v;
}

}  // namespace

bool has_sparse_arg(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack) {
  for (const c10::IValue& v : torch::jit::last(stack, op.schema().arguments().size())) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().layout() != at::kStrided) return true;
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorVector())
        if (t.defined() && t.layout() != at::kStrided) return true;
  }
  return false;
}

// ATen's cpu_fallback calls the CPU kernel at the dense CPU key; a sparse call needs the
// sparse CPU kernels, which the host copies select by themselves.
void sparse_cpu_fallback(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack) {
  const auto& schema = op.schema();
  const size_t n_args = schema.arguments().size();
  std::vector<c10::IValue> orig(stack->end() - n_args, stack->end());
  std::optional<c10::Device> device;
  torch::jit::drop(*stack, n_args);
  for (const c10::IValue& v : orig) stack->push_back(to_host(v, &device));
  TORCH_INTERNAL_ASSERT(device, schema.name(), ": sparse CPU fallback without a tpu argument");
  std::vector<c10::IValue> host(stack->end() - n_args, stack->end());
  op.callBoxed(stack);
  // written arguments (in-place, out=) take the host result; a return aliasing one is it
  // (`written`: the written argument a return's alias set names, or -1)
  auto written = [&](const c10::AliasInfo* alias) -> int {
    for (size_t i = 0; alias && alias->isWrite() && i < n_args; ++i) {
      const auto* a = schema.arguments()[i].alias_info();
      if (a && a->isWrite() && a->beforeSets() == alias->beforeSets()) return static_cast<int>(i);
    }
    return -1;
  };
  for (size_t i = 0; i < n_args; ++i) {
    const auto* a = schema.arguments()[i].alias_info();
    if (a && a->isWrite() && is_tpu_tensor(orig[i]))
      at::_copy_from_and_resize(host[i].toTensor(), orig[i].toTensor());
  }
  const size_t n_ret = schema.returns().size();
  for (size_t r = 0; r < n_ret; ++r) {
    c10::IValue& v = (*stack)[stack->size() - n_ret + r];
    int w = written(schema.returns()[r].alias_info());
    if (w >= 0) v = orig[w];
    else if (v.isTensor() && v.toTensor().defined()) v = v.toTensor().to(*device);
    else if (v.isTensorList()) {
      std::vector<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorVector()) out.push_back(t.defined() ? t.to(*device) : t);
      v = out;
    }
  }
}

// Every other aten op with a kernel at `cpu_key` (SparseCPU / SparseCsrCPU) and none yet at
// `own_key` (the natives registered just before) runs through the CPU fallback,
// registered for it by name: ops that also have a composite kernel (mm, addmm:
// CompositeExplicitAutogradNonFunctional) would otherwise take that kernel, which
// allocates a sparse out= for a dense result, before any backend fallback.
void route_to_host(torch::Library& m, c10::DispatchKey cpu_key, c10::DispatchKey own_key) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& op : dispatcher.getAllOpNamesForDispatchKey(cpu_key)) {
    if (op.name.rfind("aten::", 0) != 0) continue;
    auto handle = dispatcher.findOp(op);
    if (!handle || handle->hasKernelForDispatchKey(own_key)) continue;
    std::string name = op.name.substr(6) + (op.overload_name.empty() ? "" : "." + op.overload_name);
    m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&cpu_fallback_boxed>());
  }
}

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims", at::native::new_with_dims_sparse);
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", at::native::new_with_dims_and_tensor_sparse_symint);
  m.impl("empty.memory_format", at::native::empty_sparse);
  m.impl("sparse_dim", at::native::sparse_dim_sparse);
  m.impl("dense_dim", at::native::dense_dim_sparse);
  m.impl("_dimI", at::native::sparse_dim_sparse);
  m.impl("_dimV", at::native::dense_dim_sparse);
  m.impl("_nnz", at::native::_nnz_sparse);
  m.impl("is_coalesced", at::native::is_coalesced_sparse);
  m.impl("_coalesced_", at::native::_coalesced_sparse_);
  m.impl("_indices", at::native::_indices_sparse);
  m.impl("_values", at::native::_values_sparse);
  m.impl("indices", at::native::indices_sparse);
  m.impl("values", at::native::values_sparse);
  m.impl("sparse_resize_", at::native::sparse_resize_);
  m.impl("sparse_resize_and_clear_", at::native::sparse_resize_and_clear_);
  m.impl("copy_", at::native::copy_sparse_wrapper_);
  m.impl("copy_sparse_to_sparse_", at::native::copy_sparse_);
  m.impl("_copy_from_and_resize", copy_from_and_resize_sparse);
  route_to_host(m, c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1);
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("empty.memory_format", at::native::empty_sparse_compressed);
  m.impl("sparse_dim", at::native::sparse_dim_sparse_csr);
  m.impl("dense_dim", at::native::dense_dim_sparse_csr);
  m.impl("_nnz", at::native::_nnz_sparse_csr);
  m.impl("values", at::native::values_sparse_csr);
  m.impl("crow_indices", at::native::crow_indices_sparse_csr);
  m.impl("col_indices", at::native::col_indices_sparse_csr);
  m.impl("ccol_indices", at::native::ccol_indices_sparse_csr);
  m.impl("row_indices", at::native::row_indices_sparse_csr);
  m.impl("copy_", at::native::copy_sparse_compressed_);
  m.impl("_copy_from_and_resize", copy_from_and_resize_sparse);
  route_to_host(m, c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCsrPrivateUse1);
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback_boxed>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback_boxed>());
}

}  // namespace torchtpu
