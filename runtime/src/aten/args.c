/* Argument access, broadcasting and type promotion for ATen builders. */
#include <stdarg.h>
#include <stdio.h>

#include "aten/aten.h"

tpu_status_t tpu__err(tpu_build_t* b, tpu_status_code_t code, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tpu_status_make(code, "%s: %s", b->name, msg);
}

const tpu_arg_t* tpu__arg(tpu_build_t* b, int i) { return i >= 0 && i < b->nargs ? &b->args[i] : NULL; }

bool tpu__arg_is_none(tpu_build_t* b, int i) {
  const tpu_arg_t* a = tpu__arg(b, i);
  return !a || a->kind == TPU_ARG_NONE;
}

static const char* kind_name(tpu_arg_kind_t k) {
  static const char* n[] = {"None", "Tensor", "Scalar", "int", "float", "bool", "int[]",
                            "Tensor[]", "str", "float[]"};
  return k >= 0 && k <= TPU_ARG_DOUBLELIST ? n[k] : "?";
}

static tpu_status_t want(tpu_build_t* b, int i, const char* what) {
  const tpu_arg_t* a = tpu__arg(b, i);
  return tpu__err(b, TPU_TYPE_ERROR, "argument %d must be %s, not %s", i, what,
                  a ? kind_name(a->kind) : "missing");
}

tpu_status_t tpu__arg_dtype_err(tpu_build_t* b, int i, tpu_dtype_t d) {
  char what[32];
  snprintf(what, sizeof what, "argument %d", i);
  return tpu__err_dtype(b, d, what);
}

tpu_status_t tpu__arg_tensor(tpu_build_t* b, int i, const tpu_view_t** out) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (!a || a->kind != TPU_ARG_TENSOR) return want(b, i, "Tensor");
  if (!tpu_dtype_is_supported(a->tensor.dtype)) return tpu__arg_dtype_err(b, i, a->tensor.dtype);
  *out = &a->tensor;
  return NULL;
}

tpu_status_t tpu__arg_int(tpu_build_t* b, int i, int64_t* out) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (a && a->kind == TPU_ARG_INT) { *out = a->v.i; return NULL; }
  if (a && a->kind == TPU_ARG_BOOL) { *out = a->v.b; return NULL; }
  if (a && a->kind == TPU_ARG_SCALAR && a->scalar_kind != TPU_SCALAR_FLOAT &&
      a->scalar_kind != TPU_SCALAR_COMPLEX) { *out = a->v.i; return NULL; }
  return want(b, i, "int");
}

tpu_status_t tpu__arg_int_opt(tpu_build_t* b, int i, int64_t dflt, int64_t* out) {
  if (tpu__arg_is_none(b, i)) { *out = dflt; return NULL; }
  return tpu__arg_int(b, i, out);
}

tpu_status_t tpu__arg_double(tpu_build_t* b, int i, double* out) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (a && a->kind == TPU_ARG_DOUBLE) { *out = a->v.d; return NULL; }
  if (a && a->kind == TPU_ARG_INT) { *out = (double)a->v.i; return NULL; }
  if (a && a->kind == TPU_ARG_BOOL) { *out = a->v.b; return NULL; }
  if (a && a->kind == TPU_ARG_SCALAR) {
    *out = a->scalar_kind == TPU_SCALAR_FLOAT || a->scalar_kind == TPU_SCALAR_COMPLEX ? a->v.d : (double)a->v.i;
    return NULL;
  }
  return want(b, i, "float");
}

tpu_status_t tpu__arg_double_opt(tpu_build_t* b, int i, double dflt, double* out) {
  if (tpu__arg_is_none(b, i)) { *out = dflt; return NULL; }
  return tpu__arg_double(b, i, out);
}

tpu_status_t tpu__arg_bool(tpu_build_t* b, int i, bool* out) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (a && a->kind == TPU_ARG_BOOL) { *out = a->v.b; return NULL; }
  if (a && a->kind == TPU_ARG_INT) { *out = a->v.i != 0; return NULL; }
  if (a && a->kind == TPU_ARG_SCALAR && a->scalar_kind != TPU_SCALAR_FLOAT &&
      a->scalar_kind != TPU_SCALAR_COMPLEX) { *out = a->v.i != 0; return NULL; }
  return want(b, i, "bool");
}

tpu_status_t tpu__arg_bool_opt(tpu_build_t* b, int i, bool dflt, bool* out) {
  if (tpu__arg_is_none(b, i)) { *out = dflt; return NULL; }
  return tpu__arg_bool(b, i, out);
}

tpu_status_t tpu__arg_intlist(tpu_build_t* b, int i, const int64_t** out, int* len) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (a && a->kind == TPU_ARG_INTLIST) { *out = a->list; *len = (int)a->list_len; return NULL; }
  if (a && a->kind == TPU_ARG_INT) { *out = &a->v.i; *len = 1; return NULL; }
  if (a && a->kind == TPU_ARG_SCALAR && a->scalar_kind != TPU_SCALAR_FLOAT &&
      a->scalar_kind != TPU_SCALAR_COMPLEX) { *out = &a->v.i; *len = 1; return NULL; }
  return want(b, i, "int[]");
}

tpu_dtype_t tpu__arg_dtype(const tpu_arg_t* a) {
  if (a->kind == TPU_ARG_TENSOR) return a->tensor.dtype;
  if (a->kind == TPU_ARG_SCALAR) {
    if (a->scalar_is_tensor) return a->scalar_dtype;
    return a->scalar_kind == TPU_SCALAR_FLOAT ? TPU_DTYPE_F64
           : a->scalar_kind == TPU_SCALAR_COMPLEX ? TPU_DTYPE_C128
           : a->scalar_kind == TPU_SCALAR_INT ? TPU_DTYPE_I64 : TPU_DTYPE_BOOL;
  }
  if (a->kind == TPU_ARG_DOUBLE) return TPU_DTYPE_F64;
  if (a->kind == TPU_ARG_INT) return TPU_DTYPE_I64;
  if (a->kind == TPU_ARG_BOOL) return TPU_DTYPE_BOOL;
  return TPU_DTYPE_INVALID;
}

tpu_status_t tpu__input_from_arg(tpu_build_t* b, int i) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (!a) return want(b, i, "Tensor or Number");
  if (a->kind == TPU_ARG_TENSOR) {
    if (!tpu_dtype_is_supported(a->tensor.dtype)) return tpu__arg_dtype_err(b, i, a->tensor.dtype);
    return tpu__node_add_input(b->node, &a->tensor);
  }
  double d;
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, i, &d));
  bool is_c = a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_COMPLEX;
  int64_t iv = (a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_FLOAT) || is_c ||
                       a->kind == TPU_ARG_DOUBLE ? (int64_t)d
               : a->kind == TPU_ARG_BOOL ? a->v.b : a->v.i;
  TPU_RETURN_IF_ERROR(tpu__node_add_scalar(b->node, d, iv, tpu__arg_dtype(a)));
  if (is_c) b->node->in[b->node->n_in - 1].scalar_im = a->scalar_im;
  return NULL;
}

tpu_status_t tpu__wrap_dim(tpu_build_t* b, int64_t dim, int ndim, int* out) {
  int n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    return tpu__err(b, TPU_INDEX_ERROR,
                    "Dimension out of range (expected to be in range of [%d, %d], but got %lld)",
                    -n, n - 1, (long long)dim);
  *out = (int)(dim < 0 ? dim + n : dim);
  return NULL;
}

tpu_status_t tpu__broadcast(tpu_build_t* b, const int64_t* a, int na, const int64_t* c, int nc,
                            int64_t* out, int* out_n) {
  int n = na > nc ? na : nc;
  for (int i = 0; i < n; ++i) {
    int ia = na - n + i, ic = nc - n + i;
    int64_t sa = ia >= 0 ? a[ia] : 1, sc = ic >= 0 ? c[ic] : 1;
    if (sa != sc && sa != 1 && sc != 1)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "The size of tensor a (%lld) must match the size of tensor b (%lld) at "
                      "non-singleton dimension %d", (long long)sa, (long long)sc, i);
    out[i] = sa == 1 ? sc : sa;
  }
  *out_n = n;
  return NULL;
}

tpu_status_t tpu__check_expand(tpu_build_t* b, const tpu_view_t* t, int nd, const int64_t* target) {
  char a[256], c[256];
  if (t->ndim > nd)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "expand(torch.%sTensor{%s}, size=%s): the number of sizes provided (%d) must be "
                    "greater or equal to the number of dimensions in the tensor (%d)",
                    tpu__dtype_c10_name(t->dtype), tpu__fmt_shape(a, sizeof a, t->ndim, t->sizes),
                    tpu__fmt_shape(c, sizeof c, nd, target), nd, t->ndim);
  for (int i = 0; i < nd; ++i) {
    int ti = i - (nd - t->ndim);
    if (ti < 0) continue;
    if (t->sizes[ti] != target[i] && t->sizes[ti] != 1)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "The expanded size of the tensor (%lld) must match the existing size (%lld) "
                      "at non-singleton dimension %d.  Target sizes: %s.  Tensor sizes: %s",
                      (long long)target[i], (long long)t->sizes[ti], i,
                      tpu__fmt_shape(a, sizeof a, nd, target), tpu__fmt_shape(c, sizeof c, t->ndim, t->sizes));
  }
  return NULL;
}

/* c10's combine_categories: a higher-priority category wins unless the lower one is a
 * floating type and the higher is bool/integral. */
static tpu_dtype_t combine(tpu_dtype_t higher, tpu_dtype_t lower) {
  if (higher == TPU_DTYPE_INVALID) return lower;
  if (tpu_dtype_is_complex(higher)) return higher;
  if (tpu_dtype_is_complex(lower))  /* keeps a floating higher's precision */
    return tpu_dtype_is_floating(higher) ? tpu__complex_of(higher) : lower;
  if (tpu_dtype_is_floating(higher)) return higher;
  if (higher == TPU_DTYPE_BOOL || tpu_dtype_is_floating(lower))
    return lower == TPU_DTYPE_INVALID ? higher : tpu__promote(higher, lower);
  return higher;
}

tpu_dtype_t tpu__result_type(tpu_build_t* b, const int* idx, int n) {
  tpu_dtype_t dim = TPU_DTYPE_INVALID, zero = TPU_DTYPE_INVALID, wrapped = TPU_DTYPE_INVALID;
  for (int k = 0; k < n; ++k) {
    const tpu_arg_t* a = tpu__arg(b, idx[k]);
    if (!a || a->kind == TPU_ARG_NONE) continue;
    tpu_dtype_t t = tpu__arg_dtype(a);
    if (a->kind == TPU_ARG_TENSOR) {
      if (a->tensor.ndim > 0) dim = tpu__promote(dim, t);
      else zero = tpu__promote(zero, t);
    } else if (a->kind == TPU_ARG_SCALAR && a->scalar_is_tensor) {
      zero = tpu__promote(zero, t);
    } else {
      if (tpu_dtype_is_floating(t)) t = tpu__default_float();
      else if (tpu_dtype_is_complex(t)) t = tpu__complex_of(tpu__default_float());
      wrapped = tpu__promote(wrapped, t);
    }
  }
  return combine(dim, combine(zero, wrapped));
}

bool tpu__dtype_ok_for_out(tpu_dtype_t computed, tpu_dtype_t out) { return tpu__can_cast(computed, out); }

tpu_status_t tpu__arg_tensor_opt(tpu_build_t* b, int i, const tpu_view_t** out) {
  *out = NULL;
  if (tpu__arg_is_none(b, i)) return NULL;
  const tpu_arg_t* a = tpu__arg(b, i);
  if (a->kind == TPU_ARG_TENSOR && !a->tensor.storage) return NULL;
  return tpu__arg_tensor(b, i, out);
}

tpu_status_t tpu__node_add_opt(tpu_build_t* b, const tpu_view_t* v) {
  return v ? tpu__node_add_input(b->node, v) : tpu__node_add_absent(b->node);
}

tpu_status_t tpu__err_dtype(tpu_build_t* b, tpu_dtype_t d, const char* what) {
  if (tpu_dtype_is_storage_only(d))
    return tpu__err(b, TPU_UNIMPLEMENTED, "%s is %s, which tpu stores but has no kernels for", what,
                    tpu_dtype_name(d));
  return tpu__err(b, TPU_TYPE_ERROR, "dtype of %s is not supported on tpu", what);
}

tpu_status_t tpu__err_not_implemented_for(tpu_build_t* b, const char* kernel, tpu_dtype_t t) {
  return tpu__err(b, TPU_UNIMPLEMENTED, "\"%s\" not implemented for '%s'", kernel, tpu__dtype_c10_name(t));
}

tpu_status_t tpu__arg_bool_mask(tpu_build_t* b, int i, int want, bool* mask) {
  for (int k = 0; k < want; ++k) mask[k] = true;
  const tpu_arg_t* a = tpu__arg(b, i);
  if (!a || a->kind == TPU_ARG_NONE) return NULL;
  if (a->kind == TPU_ARG_BOOL) { for (int k = 0; k < want; ++k) mask[k] = a->v.b; return NULL; }
  if (a->kind != TPU_ARG_INTLIST || a->list_len != want)
    return tpu__err(b, TPU_TYPE_ERROR, "argument %d must be bool[%d]", i, want);
  for (int k = 0; k < want; ++k) mask[k] = a->list[k] != 0;
  return NULL;
}

tpu_status_t tpu__norm_params_mixed(tpu_build_t* b, tpu_dtype_t x, const tpu_view_t* p1,
                                    const tpu_view_t* p2, bool* mixed) {
  *mixed = (p1 && p1->dtype != x) || (p2 && p2->dtype != x);
  if (!*mixed) return NULL;
  if ((p1 && p1->dtype != TPU_DTYPE_F32) || (p2 && p2->dtype != TPU_DTYPE_F32))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "mixed dtype (CPU): expect parameter to have scalar type of Float");
  if (x != TPU_DTYPE_BF16 && x != TPU_DTYPE_F16)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "mixed dtype (CPU): all inputs must share same datatype.");
  return NULL;
}

const char* tpu__dtype_cpp_name(tpu_dtype_t d) {
  switch (d) {
    case TPU_DTYPE_U8: return "unsigned char";
    case TPU_DTYPE_I8: return "signed char";
    case TPU_DTYPE_I16: return "short int";
    case TPU_DTYPE_I32: return "int";
    case TPU_DTYPE_I64: return "long int";
    case TPU_DTYPE_F16: return "c10::Half";
    case TPU_DTYPE_F32: return "float";
    case TPU_DTYPE_F64: return "double";
    case TPU_DTYPE_BOOL: return "bool";
    case TPU_DTYPE_BF16: return "c10::BFloat16";
    default: return "unknown";
  }
}

tpu_status_t tpu__out_dtypes_exact(tpu_build_t* b) {
  if (b->variant != TPU_VARIANT_OUT) return NULL;
  const tpu_node_t* n = b->node;
  for (int k = 0; k < n->n_out; ++k) {
    const tpu_arg_t* a = tpu__arg(b, b->nargs - n->n_out + k);
    if (!a || a->kind != TPU_ARG_TENSOR || tpu__output_absent(&n->out[k])) continue;
    if (a->tensor.dtype != n->out[k].dtype)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected out tensor to have dtype %s, but got %s instead",
                      tpu__dtype_cpp_name(n->out[k].dtype), tpu__dtype_cpp_name(a->tensor.dtype));
  }
  return NULL;
}
