/* ATen ops of the reduce family: reductions over dims (sum, mean, prod, amax, max.dim,
 * argmax, var/std, any/all, logsumexp, norms), scans (cumsum, cumprod, ...) and
 * softmax forward/backward.
 *
 * Node layout shared with host/reduce.c: in[0] is self (softmax backward: in[0] grad,
 * in[1] output); ia[0] is the bitmask of reduced dims (reductions) or the dim (scans,
 * softmax); ia[1] is 1 for std (take the square root); ia[2] is the dtype the input is
 * first cast to, or -1 (PyTorch casts self to an explicit dtype= before reducing, which
 * matters when that dtype is narrower than the compute dtype, e.g. bool or int8); da[0]
 * is var's correction or the norm's order. */
#include <math.h>
#include <stdio.h>

#include "aten/aten.h"

/* ---- argument helpers -------------------------------------------------------------- */

/* dtype of the k-th of n trailing out= tensors; INVALID outside the out variant. */
static tpu_dtype_t out_dtype(tpu_build_t* b, int k, int n) {
  if (b->variant != TPU_VARIANT_OUT) return TPU_DTYPE_INVALID;
  const tpu_arg_t* a = tpu__arg(b, b->nargs - n + k);
  return a && a->kind == TPU_ARG_TENSOR ? a->tensor.dtype : TPU_DTYPE_INVALID;
}

/* Out tensors whose dtype PyTorch requires to equal the result's exactly. */
static tpu_status_t out_exact(tpu_build_t* b, int k, int n, tpu_dtype_t want) {
  tpu_dtype_t got = out_dtype(b, k, n);
  if (got != TPU_DTYPE_INVALID && got != want)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected out tensor to have dtype %s, but got %s instead",
                    tpu__dtype_cpp_name(want), tpu__dtype_cpp_name(got));
  return NULL;
}

/* Optional ScalarType argument; INVALID when None. */
static tpu_status_t arg_dtype_opt(tpu_build_t* b, int i, tpu_dtype_t* out) {
  *out = TPU_DTYPE_INVALID;
  if (i < 0 || tpu__arg_is_none(b, i)) return NULL;
  int64_t v;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, i, &v));
  if (!tpu_dtype_is_supported((tpu_dtype_t)v)) return tpu__err_dtype(b, (tpu_dtype_t)v, "dtype=");
  *out = (tpu_dtype_t)v;
  return NULL;
}

static tpu_status_t arg_keepdim(tpu_build_t* b, int i, bool* out) {
  *out = false;
  return i < 0 || tpu__arg_is_none(b, i) ? NULL : tpu__arg_bool(b, i, out);
}

static tpu_dtype_t via_for(tpu_dtype_t in, tpu_dtype_t result) {
  tpu_dtype_t c = tpu__compute_dtype(result);
  return result != in && result != c ? result : TPU_DTYPE_INVALID;
}

/* ---- reduced dims and output shapes ------------------------------------------------ */

typedef struct rdims_s {
  uint32_t mask;     /* reduced dims of self */
  bool specified;    /* the caller named dims (not None / not an all-dims empty list) */
  int out_nd;
  int64_t out_sizes[TPU_MAX_DIMS];
} rdims_t;

/* Reads dims from argument ai (-1: none given): None, an int or an int list. An empty
 * list means every dim when empty_all (sum, amax), and no dim otherwise (any.dims). */
static tpu_status_t read_dims(tpu_build_t* b, const tpu_view_t* x, int ai, bool empty_all,
                              bool keepdim, rdims_t* r) {
  int nd = x->ndim;
  memset(r, 0, sizeof *r);
  const int64_t* dims = NULL;
  int nd_list = 0;
  bool given = ai >= 0 && !tpu__arg_is_none(b, ai);
  if (given) TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, ai, &dims, &nd_list));
  if (!given || (nd_list == 0 && empty_all)) {
    r->mask = nd ? (uint32_t)((1u << nd) - 1) : 1u;
  } else {
    r->specified = nd_list > 0;
    for (int k = 0; k < nd_list; ++k) {
      int d;
      TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dims[k], nd, &d));
      if (r->mask & (1u << d))
        return tpu__err(b, TPU_INVALID_ARGUMENT, "dim %d appears multiple times in the list of dims", d);
      r->mask |= 1u << d;
    }
  }
  for (int d = 0; d < nd; ++d) {
    if (r->mask & (1u << d)) {
      if (keepdim) r->out_sizes[r->out_nd++] = 1;
    } else {
      r->out_sizes[r->out_nd++] = x->sizes[d];
    }
  }
  return NULL;
}

/* max-like reductions have no identity: PyTorch rejects empty reductions. */
static tpu_status_t check_nonempty(tpu_build_t* b, const tpu_view_t* x, const rdims_t* r,
                                   const char* fn, tpu_status_code_t all_code, const char* tail) {
  if (!r->specified) {
    if (tpu_view_numel(x) == 0)
      return tpu__err(b, all_code, "%s(): Expected reduction dim to be specified for input.numel() == 0.%s",
                      fn, tail);
    return NULL;
  }
  for (int d = 0; d < x->ndim; ++d)
    if ((r->mask & (1u << d)) && x->sizes[d] == 0)
      return tpu__err(b, TPU_INDEX_ERROR, "%s(): Expected reduction dim %d to have non-zero size.", fn, d);
  return NULL;
}

static void set_node(tpu_build_t* b, tpu_kind_t kind, tpu_dtype_t compute, int64_t ia0, tpu_dtype_t via) {
  tpu_node_t* n = b->node;
  n->kind = kind;
  n->compute = compute;
  n->ia[0] = ia0;
  n->ia[2] = via;
}

/* ---- sum, nansum, prod, mean -------------------------------------------------------- */

enum { R_MEAN = 1, R_STRICT_OUT = 2 };

typedef struct rdef_s {
  tpu_kind_t kind;
  int dim_arg, keepdim_arg, dtype_arg;
  int flags;
} rdef_t;

static tpu_status_t build_sumlike(tpu_build_t* b) {
  const rdef_t* d = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  bool keepdim;
  TPU_RETURN_IF_ERROR(arg_keepdim(b, d->keepdim_arg, &keepdim));
  tpu_dtype_t dt;
  TPU_RETURN_IF_ERROR(arg_dtype_opt(b, d->dtype_arg, &dt));
  rdims_t r;
  TPU_RETURN_IF_ERROR(read_dims(b, x, d->dim_arg, true, keepdim, &r));
  tpu_dtype_t res;
  if (d->flags & R_MEAN) {
    if (dt != TPU_DTYPE_INVALID && !tpu_dtype_is_floating(dt))
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "mean(): could not infer output dtype. Optional dtype must be either a floating "
                      "point or complex dtype. Got: %s", tpu__dtype_c10_name(dt));
    if (dt == TPU_DTYPE_INVALID && !tpu_dtype_is_floating(x->dtype))
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "mean(): could not infer output dtype. Input dtype must be either a floating "
                      "point or complex dtype. Got: %s", tpu__dtype_c10_name(x->dtype));
    res = dt != TPU_DTYPE_INVALID ? dt : x->dtype;
  } else {
    tpu_dtype_t o = out_dtype(b, 0, 1);
    if (dt != TPU_DTYPE_INVALID) {
      res = dt;
      if (o != TPU_DTYPE_INVALID && o != dt) TPU_RETURN_IF_ERROR(out_exact(b, 0, 1, dt));
    } else {
      res = tpu_dtype_is_integral(x->dtype, true) ? TPU_DTYPE_I64 : x->dtype;
      /* the dim= out forms reduce in the out tensor's dtype; the all-dims ones insist */
      if (o != TPU_DTYPE_INVALID) {
        if (d->flags & R_STRICT_OUT) TPU_RETURN_IF_ERROR(out_exact(b, 0, 1, res));
        else res = o;
      }
    }
    /* ATen's nansum of a floating input reduces in the result's dtype, floating only */
    if (d->kind == TPU_KIND_RED_NANSUM && tpu_dtype_is_floating(x->dtype) && !tpu_dtype_is_floating(res))
      return tpu__err_not_implemented_for(b, "nansum_cpu", res);
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  set_node(b, d->kind, tpu__compute_dtype(res), r.mask, via_for(x->dtype, res));
  tpu__node_add_output(b->node, res, r.out_nd, r.out_sizes);
  return NULL;
}

/* ---- amax/amin, max/min, argmax/argmin, aminmax ---------------------------------------- */

enum { M_LIST = 1, M_INT = 2, M_OPT_INT = 3, M_NONE = 0 };
enum { M_VALUES = 1, M_INDICES = 2 };

typedef struct mdef_s {
  tpu_kind_t kind;
  const char* fn;
  int dim_mode, dim_arg, keepdim_arg;
  int outputs;
} mdef_t;

static tpu_status_t build_minmax(tpu_build_t* b) {
  const mdef_t* d = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  bool keepdim;
  TPU_RETURN_IF_ERROR(arg_keepdim(b, d->keepdim_arg, &keepdim));
  rdims_t r;
  TPU_RETURN_IF_ERROR(read_dims(b, x, d->dim_mode == M_NONE ? -1 : d->dim_arg, true, keepdim, &r));
  bool is_arg = d->kind == TPU_KIND_RED_ARGMAX || d->kind == TPU_KIND_RED_ARGMIN;
  if (is_arg && x->dtype == TPU_DTYPE_BOOL)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s(): does not support bool input", d->fn);
  if (is_arg) {
    TPU_RETURN_IF_ERROR(check_nonempty(b, x, &r, d->fn, TPU_INDEX_ERROR, ""));
  } else {
    TPU_RETURN_IF_ERROR(check_nonempty(
        b, x, &r, d->fn, TPU_INVALID_ARGUMENT, " Specify the reduction dim with the 'dim' argument."));
  }
  if (b->variant == TPU_VARIANT_OUT) {
    if ((d->kind == TPU_KIND_RED_AMAX || d->kind == TPU_KIND_RED_AMIN) && d->dim_mode != M_NONE) {
      tpu_dtype_t o = out_dtype(b, 0, 1);
      if (o != TPU_DTYPE_INVALID && o != x->dtype)
        return tpu__err(b, TPU_INVALID_ARGUMENT,
                        "Expected the dtype for input and out to match, but got %s for input's dtype "
                        "and %s for out's dtype.", tpu__dtype_c10_name(x->dtype), tpu__dtype_c10_name(o));
    } else if (d->kind == TPU_KIND_RED_MAX_DIM || d->kind == TPU_KIND_RED_MIN_DIM) {
      TPU_RETURN_IF_ERROR(out_exact(b, 0, 2, x->dtype));
      TPU_RETURN_IF_ERROR(out_exact(b, 1, 2, TPU_DTYPE_I64));
    } else if (is_arg) {
      TPU_RETURN_IF_ERROR(out_exact(b, 0, 1, TPU_DTYPE_I64));
    } else if (d->kind == TPU_KIND_RED_AMINMAX) {
      TPU_RETURN_IF_ERROR(out_exact(b, 0, 2, x->dtype));
      TPU_RETURN_IF_ERROR(out_exact(b, 1, 2, x->dtype));
    }
    /* max/min.unary_out: any dtype self casts to (checked when binding) */
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  set_node(b, d->kind, tpu__compute_dtype(x->dtype), r.mask, TPU_DTYPE_INVALID);
  if (d->kind == TPU_KIND_RED_AMINMAX) {
    tpu__node_add_output(b->node, x->dtype, r.out_nd, r.out_sizes);
    tpu__node_add_output(b->node, x->dtype, r.out_nd, r.out_sizes);
    return NULL;
  }
  if (d->outputs & M_VALUES) tpu__node_add_output(b->node, x->dtype, r.out_nd, r.out_sizes);
  if (d->outputs & M_INDICES) tpu__node_add_output(b->node, TPU_DTYPE_I64, r.out_nd, r.out_sizes);
  return NULL;
}

/* ---- var / std (correction forms) ----------------------------------------------------- */

typedef struct vdef_s { bool std; bool with_mean; } vdef_t;

static tpu_status_t build_var(tpu_build_t* b) {
  const vdef_t* d = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  if (!tpu_dtype_is_floating(x->dtype)) {
    if (d->with_mean)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s only support floating point and complex dtypes",
                      d->std ? "std_mean" : "var_mean");
    return tpu__err(b, TPU_INVALID_ARGUMENT, "std and var only support floating point and complex dtypes");
  }
  double corr;
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 2, 1.0, &corr));
  bool keepdim;
  TPU_RETURN_IF_ERROR(arg_keepdim(b, 3, &keepdim));
  rdims_t r;
  TPU_RETURN_IF_ERROR(read_dims(b, x, 1, true, keepdim, &r));
  if (d->with_mean) {
    TPU_RETURN_IF_ERROR(out_exact(b, 0, 2, x->dtype));
    TPU_RETURN_IF_ERROR(out_exact(b, 1, 2, x->dtype));
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  set_node(b, TPU_KIND_RED_VAR, tpu__compute_dtype(x->dtype), r.mask, TPU_DTYPE_INVALID);
  b->node->ia[1] = d->std;
  b->node->da[0] = corr;
  tpu__node_add_output(b->node, x->dtype, r.out_nd, r.out_sizes);
  if (d->with_mean) tpu__node_add_output(b->node, x->dtype, r.out_nd, r.out_sizes);
  return NULL;
}

/* ---- any / all ------------------------------------------------------------------------------ */

typedef struct adef_s { tpu_kind_t kind; int dim_arg, keepdim_arg; bool empty_all; const char* fn; } adef_t;

static tpu_status_t build_anyall(tpu_build_t* b) {
  const adef_t* d = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  bool keepdim;
  TPU_RETURN_IF_ERROR(arg_keepdim(b, d->keepdim_arg, &keepdim));
  rdims_t r;
  TPU_RETURN_IF_ERROR(read_dims(b, x, d->dim_arg, d->empty_all, keepdim, &r));
  tpu_dtype_t res = x->dtype == TPU_DTYPE_U8 ? TPU_DTYPE_U8 : TPU_DTYPE_BOOL;
  tpu_dtype_t o = out_dtype(b, 0, 1);
  if (o != TPU_DTYPE_INVALID) {
    if (o != TPU_DTYPE_BOOL && o != TPU_DTYPE_U8)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s only supports bool tensor for result, got: %s",
                      d->fn, tpu__dtype_c10_name(o));
    res = o;
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  /* Truthiness first: 0.5 is true, so values are packed through bool. A uint8 result
   * makes CPU cast self to uint8 instead (0.5 -> 0, -1.5 -> 255); do the same. */
  set_node(b, d->kind, TPU_DTYPE_I64, r.mask, res == TPU_DTYPE_U8 ? TPU_DTYPE_U8 : TPU_DTYPE_BOOL);
  tpu__node_add_output(b->node, res, r.out_nd, r.out_sizes);
  return NULL;
}

/* ---- logsumexp ---------------------------------------------------------------------------- */

static void fmt_ones(char* buf, size_t cap, int n) {
  size_t o = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < n && o < cap; ++i) o += (size_t)snprintf(buf + o, cap - o, i ? ", 1" : "1");
  if (o < cap) snprintf(buf + o, cap - o, "]");
}

static tpu_status_t build_logsumexp(tpu_build_t* b) {
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  bool keepdim;
  TPU_RETURN_IF_ERROR(arg_keepdim(b, 2, &keepdim));
  const int64_t* dims;
  int nd_list;
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &dims, &nd_list));
  /* CPU reduces an empty dim list over nothing for the max and over everything for the
   * sum, and then fails to fit the result; keep the same failure */
  if (nd_list == 0 && x->ndim > 0 && !keepdim) {
    char s[128];
    fmt_ones(s, sizeof s, x->ndim);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "output with shape [] doesn't match the broadcast shape %s", s);
  }
  rdims_t r;
  TPU_RETURN_IF_ERROR(read_dims(b, x, 1, true, keepdim, &r));
  tpu_dtype_t res = tpu_dtype_is_floating(x->dtype) ? x->dtype : tpu__default_float();
  tpu_dtype_t o = out_dtype(b, 0, 1);
  if (o != TPU_DTYPE_INVALID) {
    if (!tpu_dtype_is_floating(o))
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "logsumexp(): Expected floating point type for result tensor, but got: %s", tpu__dtype_c10_name(o));
    res = o;
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  set_node(b, TPU_KIND_RED_LOGSUMEXP, tpu__compute_dtype(res), r.mask, TPU_DTYPE_INVALID);
  tpu__node_add_output(b->node, res, r.out_nd, r.out_sizes);
  return NULL;
}

/* ---- norms ----------------------------------------------------------------------------------- */

/* Argument positions; -1 when the overload lacks the argument. */
typedef struct ndef_s { int ord_arg, dim_arg, keepdim_arg, dtype_arg; bool linalg; } ndef_t;

static tpu_status_t build_norm(tpu_build_t* b) {
  const ndef_t* d = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  double ord = 2;
  if (d->ord_arg >= 0) TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, d->ord_arg, 2.0, &ord));
  bool keepdim;
  TPU_RETURN_IF_ERROR(arg_keepdim(b, d->keepdim_arg, &keepdim));
  tpu_dtype_t dt;
  TPU_RETURN_IF_ERROR(arg_dtype_opt(b, d->dtype_arg, &dt));
  if (!tpu_dtype_is_floating(x->dtype)) {
    if (d->linalg)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "linalg.vector_norm: Expected a floating point or complex tensor as input. Got %s",
                      tpu__dtype_c10_name(x->dtype));
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "norm(): input dtype should be either floating point or complex. Got %s instead.",
                    tpu__dtype_c10_name(x->dtype));
  }
  if (dt != TPU_DTYPE_INVALID) {
    if (!tpu_dtype_is_floating(dt))
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "linalg.vector_norm: dtype should be floating point or complex, but got %s", tpu__dtype_c10_name(dt));
    if (tpu__promote(x->dtype, dt) != dt)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "linalg.vector_norm: the dtype of the input (%s) should be convertible without "
                      "narrowing to the specified dtype (%s)", tpu__dtype_c10_name(x->dtype), tpu__dtype_c10_name(dt));
  }
  rdims_t r;
  TPU_RETURN_IF_ERROR(read_dims(b, x, d->dim_arg, true, keepdim, &r));
  if (tpu_view_numel(x) == 0 && (ord < 0 || isinf(ord))) {
    bool bad = !r.specified;
    for (int k = 0; k < x->ndim; ++k) bad |= (r.mask & (1u << k)) && x->sizes[k] == 0;
    if (bad)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "linalg.vector_norm cannot compute the %g norm on an empty tensor because the "
                      "operation does not have an identity", ord);
  }
  tpu_dtype_t res = dt != TPU_DTYPE_INVALID ? dt : x->dtype;
  TPU_RETURN_IF_ERROR(out_exact(b, 0, 1, res));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  set_node(b, TPU_KIND_RED_NORM, tpu__compute_dtype(res), r.mask, via_for(x->dtype, res));
  b->node->da[0] = ord;
  tpu__node_add_output(b->node, res, r.out_nd, r.out_sizes);
  return NULL;
}

/* count_nonzero.dim_IntList(self, int[] dim): an empty list reduces every dim. */
static tpu_status_t build_count_nonzero(tpu_build_t* b) {
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  rdims_t r;
  TPU_RETURN_IF_ERROR(read_dims(b, x, 1, true, false, &r));
  TPU_RETURN_IF_ERROR(out_exact(b, 0, 1, TPU_DTYPE_I64));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  set_node(b, TPU_KIND_RED_COUNT_NONZERO, TPU_DTYPE_I64, r.mask, TPU_DTYPE_BOOL);
  tpu__node_add_output(b->node, TPU_DTYPE_I64, r.out_nd, r.out_sizes);
  return NULL;
}

/* ---- scans ---------------------------------------------------------------------------------------- */

typedef struct sdef_s { tpu_kind_t kind; const char* fn; bool has_dtype; } sdef_t;

static tpu_status_t build_scan(tpu_build_t* b) {
  const sdef_t* d = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  int64_t dim;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &dim));
  int wd;
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim, x->ndim, &wd));
  tpu_dtype_t dt = TPU_DTYPE_INVALID;
  if (d->has_dtype) TPU_RETURN_IF_ERROR(arg_dtype_opt(b, 2, &dt));
  tpu_dtype_t res;
  bool is_lcse = d->kind == TPU_KIND_RED_LOGCUMSUMEXP;
  if (is_lcse) {
    res = tpu_dtype_is_floating(x->dtype) ? x->dtype : tpu__default_float();
    if (!tpu_dtype_is_floating(x->dtype))
      return tpu__err(b, TPU_UNIMPLEMENTED, "\"logcumsumexp_out_cpu\" not implemented for '%s'", tpu__dtype_c10_name(x->dtype));
    TPU_RETURN_IF_ERROR(out_exact(b, 0, 1, res));
  } else if (b->variant == TPU_VARIANT_INPLACE) {
    if (dt != TPU_DTYPE_INVALID && dt != x->dtype)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Bad in-place call: input tensor dtype %s and output tensor dtype %s should match",
                      tpu__dtype_cpp_name(x->dtype), tpu__dtype_cpp_name(dt));
    res = x->dtype;
  } else {
    tpu_dtype_t o = out_dtype(b, 0, 1);
    if (dt != TPU_DTYPE_INVALID) {
      res = dt;
      TPU_RETURN_IF_ERROR(out_exact(b, 0, 1, dt));
    } else if (o != TPU_DTYPE_INVALID) {
      res = o;
    } else {
      res = tpu_dtype_is_integral(x->dtype, true) ? TPU_DTYPE_I64 : x->dtype;
    }
  }
  if (res == TPU_DTYPE_BOOL)
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"%s_out_cpu\" not implemented for 'Bool'", d->fn);
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  set_node(b, d->kind, tpu__compute_dtype(res), wd, via_for(x->dtype, res));
  tpu__node_add_output(b->node, res, x->ndim, x->sizes);
  return NULL;
}

/* cummax/cummin(self, dim) -> (values, indices) */
static tpu_status_t build_cumext(tpu_build_t* b) {
  const sdef_t* d = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  int64_t dim;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &dim));
  int wd;
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim, x->ndim, &wd));
  TPU_RETURN_IF_ERROR(out_exact(b, 0, 2, x->dtype));
  TPU_RETURN_IF_ERROR(out_exact(b, 1, 2, TPU_DTYPE_I64));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  set_node(b, d->kind, tpu__compute_dtype(x->dtype), wd, TPU_DTYPE_INVALID);
  tpu__node_add_output(b->node, x->dtype, x->ndim, x->sizes);
  tpu__node_add_output(b->node, TPU_DTYPE_I64, x->ndim, x->sizes);
  return NULL;
}

/* ---- softmax ----------------------------------------------------------------------------------- */

static tpu_status_t build_softmax(tpu_build_t* b) {
  const tpu_kind_t* kind = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  int64_t dim;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &dim));
  bool h2f;
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 2, &h2f));
  int wd;
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim, x->ndim, &wd));
  if (h2f)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "softmax with half to float conversion is not supported on CPU");
  if (!tpu_dtype_is_floating(x->dtype))
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"%s\" not implemented for '%s'",
                    *kind == TPU_KIND_RED_SOFTMAX ? "softmax_kernel_impl" : "log_softmax_kernel_impl",
                    tpu__dtype_c10_name(x->dtype));
  TPU_RETURN_IF_ERROR(out_exact(b, 0, 1, x->dtype));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  set_node(b, *kind, tpu__compute_dtype(x->dtype), wd, TPU_DTYPE_INVALID);
  tpu__node_add_output(b->node, x->dtype, x->ndim, x->sizes);
  return NULL;
}

/* _softmax_backward_data(grad_output, output, dim, input_dtype) */
static tpu_status_t build_softmax_bwd(tpu_build_t* b) {
  const tpu_kind_t* kind = b->data;
  const tpu_view_t *g, *y;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &y));
  int64_t dim;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 2, &dim));
  int wd;
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dim, y->ndim, &wd));
  bool same = g->ndim == y->ndim;
  for (int k = 0; same && k < g->ndim; ++k) same = g->sizes[k] == y->sizes[k];
  if (!same)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected tensor for argument #1 'grad' to have same size as tensor for argument #2 "
                    "'output' (while checking arguments for softmax_backward)");
  if (g->dtype != y->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s",
                    tpu__dtype_c10_name(g->dtype), tpu__dtype_c10_name(y->dtype));
  if (!tpu_dtype_is_floating(g->dtype))
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"softmax_backward\" not implemented for '%s'", tpu__dtype_c10_name(g->dtype));
  TPU_RETURN_IF_ERROR(out_exact(b, 0, 1, g->dtype));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, g));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, y));
  set_node(b, *kind, tpu__compute_dtype(g->dtype), wd, TPU_DTYPE_INVALID);
  tpu__node_add_output(b->node, g->dtype, g->ndim, g->sizes);
  return NULL;
}

/* ---- histc ---------------------------------------------------------------------------------------- */

/* c10 narrows an integer to a smaller one by dropping the high bits. */
static int64_t wrap_int(int64_t v, tpu_dtype_t t) {
  switch (t) {
    case TPU_DTYPE_U8: return (uint8_t)v;
    case TPU_DTYPE_I8: return (int8_t)v;
    case TPU_DTYPE_I16: return (int16_t)v;
    case TPU_DTYPE_I32: return (int32_t)v;
    default: return v;
  }
}

/* Scalar::to<int64_t>(): integers as they are, floating values truncated (None: 0). */
static tpu_status_t scalar_to_i64(tpu_build_t* b, int i, int64_t* out) {
  const tpu_arg_t* a = tpu__arg(b, i);
  *out = 0;
  if (!a || a->kind == TPU_ARG_NONE) return NULL;
  if (a->kind == TPU_ARG_DOUBLE || (a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_FLOAT)) {
    if (!(a->v.d >= -0x1p63 && a->v.d < 0x1p63))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "value cannot be converted to type int64_t without overflow");
    *out = (int64_t)a->v.d;
    return NULL;
  }
  return tpu__arg_int(b, i, out);
}

/* histc(self, bins=100, min=0, max=0). Floating inputs follow PyTorch CPU (bins computed
 * in the input dtype's arithmetic; a value equal to max lands in the last bin). Integer
 * inputs, which CPU rejects, follow CUDA (bounds narrowed to the input dtype, integer bin
 * arithmetic, counts in the input dtype): Mixture-of-Experts routers count tokens per
 * expert with an integer histc on accelerators. min == max over a non-empty input takes
 * the range from the data; the kernel finds it (CPU and CUDA read it back to the host). */
static tpu_status_t build_histc(tpu_build_t* b) {
  const tpu_view_t* x;
  int64_t bins;
  double lo, hi;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 1, 100, &bins));
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 2, 0, &lo));
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 3, 0, &hi));
  tpu_dtype_t o = out_dtype(b, 0, 1);
  if (o != TPU_DTYPE_INVALID && o != x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "torch.histogram: input tensor and hist tensor should have the same "
                    "dtype, but got input %s and hist %s", tpu__dtype_cpp_name(x->dtype), tpu__dtype_cpp_name(o));
  if (bins <= 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "torch.histogram(): bins must be > 0, but got %lld for dimension 0",
                    (long long)bins);
  if (x->dtype == TPU_DTYPE_BOOL)
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"linspace_cpu\" not implemented for 'Bool'");
  tpu_node_t* n = b->node;
  bool empty = tpu_view_numel(x) == 0;
  if (tpu_dtype_is_floating(x->dtype)) {
    n->ia[1] = lo == hi && !empty;
    if (!n->ia[1]) {
      if (lo == hi) { lo -= 1; hi += 1; }
      if (!isfinite(lo) || !isfinite(hi))
        return tpu__err(b, TPU_INVALID_ARGUMENT, "torch.histc: range of [%g, %g] is not finite", lo, hi);
      if (!(lo < hi)) return tpu__err(b, TPU_INVALID_ARGUMENT, "torch.histc: max must be larger than min");
      /* the bin edges are made in the input dtype (linspace's Scalar::to<scalar_t>) */
      double top = x->dtype == TPU_DTYPE_F16 ? 65504.0 : x->dtype == TPU_DTYPE_F64 ? INFINITY : 0x1.fffffep127;
      if (x->dtype == TPU_DTYPE_BF16) top = 0x1.fep127;
      if (fabs(lo) > top || fabs(hi) > top)
        return tpu__err(b, TPU_INVALID_ARGUMENT, "value cannot be converted to type %s without overflow",
                        x->dtype == TPU_DTYPE_F16 ? "c10::Half" : x->dtype == TPU_DTYPE_BF16 ? "c10::BFloat16" : "float");
    }
    n->da[0] = lo;
    n->da[1] = hi;
  } else {
    /* CUDA: Scalar::to<int64_t>, then narrowed to the input dtype; min == max compares
     * the int64 bounds. */
    int64_t ilo, ihi;
    TPU_RETURN_IF_ERROR(scalar_to_i64(b, 2, &ilo));
    TPU_RETURN_IF_ERROR(scalar_to_i64(b, 3, &ihi));
    n->ia[1] = ilo == ihi && !empty;
    ilo = wrap_int(ilo, x->dtype);
    ihi = wrap_int(ihi, x->dtype);
    if (!n->ia[1]) {
      if (ilo == ihi) { ilo = wrap_int(ilo - 1, x->dtype); ihi = wrap_int(ihi + 1, x->dtype); }
      if (!(ilo < ihi)) return tpu__err(b, TPU_INVALID_ARGUMENT, "max must be larger than min");
    }
    n->ia[2] = ilo;
    n->ia[3] = ihi;
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_HISTC;
  n->ia[0] = bins;
  tpu__node_add_output(n, x->dtype, 1, &bins);
  return NULL;
}

/* ---- the table ------------------------------------------------------------------------------------ */

#define K(x) TPU_KIND_RED_##x
/* sum(self, *, dtype); sum.dim_IntList(self, dim, keepdim, *, dtype) */
static const rdef_t d_sum_all = {K(SUM), -1, -1, 1, R_STRICT_OUT};
static const rdef_t d_sum_dim = {K(SUM), 1, 2, 3, 0};
static const rdef_t d_nansum = {K(NANSUM), 1, 2, 3, 0};
static const rdef_t d_prod_all = {K(PROD), -1, -1, 1, R_STRICT_OUT};
static const rdef_t d_prod_dim = {K(PROD), 1, 2, 3, 0};
static const rdef_t d_mean_all = {K(MEAN), -1, -1, 1, R_MEAN};
static const rdef_t d_mean_dim = {K(MEAN), 1, 2, 3, R_MEAN};

static const mdef_t d_amax = {K(AMAX), "amax", M_LIST, 1, 2, M_VALUES};
static const mdef_t d_amin = {K(AMIN), "amin", M_LIST, 1, 2, M_VALUES};
static const mdef_t d_max_all = {K(AMAX), "max", M_NONE, -1, -1, M_VALUES};
static const mdef_t d_min_all = {K(AMIN), "min", M_NONE, -1, -1, M_VALUES};
static const mdef_t d_max_dim = {K(MAX_DIM), "max", M_INT, 1, 2, M_VALUES | M_INDICES};
static const mdef_t d_min_dim = {K(MIN_DIM), "min", M_INT, 1, 2, M_VALUES | M_INDICES};
static const mdef_t d_argmax = {K(ARGMAX), "argmax", M_OPT_INT, 1, 2, M_INDICES};
static const mdef_t d_argmin = {K(ARGMIN), "argmin", M_OPT_INT, 1, 2, M_INDICES};
/* aminmax(self, *, dim=None, keepdim) */
static const mdef_t d_aminmax = {K(AMINMAX), "aminmax", M_OPT_INT, 1, 2, 0};

static const vdef_t d_var = {false, false}, d_std = {true, false};
static const vdef_t d_var_mean = {false, true}, d_std_mean = {true, true};

static const adef_t d_any_all = {K(ANY), -1, -1, true, "any"};
static const adef_t d_any_dim = {K(ANY), 1, 2, true, "any"};
static const adef_t d_any_dims = {K(ANY), 1, 2, false, "any"};
static const adef_t d_all_all = {K(ALL), -1, -1, true, "all"};
static const adef_t d_all_dim = {K(ALL), 1, 2, true, "all"};
static const adef_t d_all_dims = {K(ALL), 1, 2, false, "all"};

/* linalg_vector_norm(self, ord, dim?, keepdim, *, dtype?) */
static const ndef_t d_vnorm = {1, 2, 3, 4, true};
/* norm.Scalar(self, p); norm.ScalarOpt_dim(self, p?, dim, keepdim);
 * norm.ScalarOpt_dim_dtype(self, p?, dim, keepdim, *, dtype); norm.ScalarOpt_dtype(self, p?, *, dtype) */
static const ndef_t d_norm_all = {1, -1, -1, -1, false};
static const ndef_t d_norm_dim = {1, 2, 3, -1, false};
static const ndef_t d_norm_dim_dtype = {1, 2, 3, 4, false};
static const ndef_t d_norm_dtype = {1, -1, -1, 2, false};

static const sdef_t d_cumsum = {K(CUMSUM), "cumsum", true};
static const sdef_t d_cumprod = {K(CUMPROD), "cumprod", true};
static const sdef_t d_lcse = {K(LOGCUMSUMEXP), "logcumsumexp", false};
static const sdef_t d_cummax = {K(CUMMAX), "cummax", false};
static const sdef_t d_cummin = {K(CUMMIN), "cummin", false};

static const tpu_kind_t d_softmax = K(SOFTMAX), d_log_softmax = K(LOG_SOFTMAX);
static const tpu_kind_t d_softmax_bwd = K(SOFTMAX_BWD), d_log_softmax_bwd = K(LOG_SOFTMAX_BWD);
#undef K

const tpu_aten_entry_t tpu__aten_reduce[] = {
    {"sum", build_sumlike, &d_sum_all},
    {"sum.out", build_sumlike, &d_sum_all},
    {"sum.dim_IntList", build_sumlike, &d_sum_dim},
    {"sum.IntList_out", build_sumlike, &d_sum_dim},
    {"nansum", build_sumlike, &d_nansum},
    {"nansum.out", build_sumlike, &d_nansum},
    {"prod", build_sumlike, &d_prod_all},
    {"prod.out", build_sumlike, &d_prod_all},
    {"prod.dim_int", build_sumlike, &d_prod_dim},
    {"prod.int_out", build_sumlike, &d_prod_dim},
    {"mean", build_sumlike, &d_mean_all},
    {"mean.dtype_out", build_sumlike, &d_mean_all},
    {"mean.dim", build_sumlike, &d_mean_dim},
    {"mean.out", build_sumlike, &d_mean_dim},
    {"amax", build_minmax, &d_amax},
    {"amax.out", build_minmax, &d_amax},
    {"amin", build_minmax, &d_amin},
    {"amin.out", build_minmax, &d_amin},
    {"max", build_minmax, &d_max_all},
    {"max.unary_out", build_minmax, &d_max_all},
    {"min", build_minmax, &d_min_all},
    {"min.unary_out", build_minmax, &d_min_all},
    {"max.dim", build_minmax, &d_max_dim},
    {"max.dim_max", build_minmax, &d_max_dim},
    {"min.dim", build_minmax, &d_min_dim},
    {"min.dim_min", build_minmax, &d_min_dim},
    {"argmax", build_minmax, &d_argmax},
    {"argmax.out", build_minmax, &d_argmax},
    {"argmin", build_minmax, &d_argmin},
    {"argmin.out", build_minmax, &d_argmin},
    {"aminmax", build_minmax, &d_aminmax},
    {"aminmax.out", build_minmax, &d_aminmax},
    {"var.correction", build_var, &d_var},
    {"var.correction_out", build_var, &d_var},
    {"std.correction", build_var, &d_std},
    {"std.correction_out", build_var, &d_std},
    {"var_mean.correction", build_var, &d_var_mean},
    {"var_mean.correction_out", build_var, &d_var_mean},
    {"std_mean.correction", build_var, &d_std_mean},
    {"std_mean.correction_out", build_var, &d_std_mean},
    {"any", build_anyall, &d_any_all},
    {"any.all_out", build_anyall, &d_any_all},
    {"any.dim", build_anyall, &d_any_dim},
    {"any.out", build_anyall, &d_any_dim},
    {"any.dims", build_anyall, &d_any_dims},
    {"any.dims_out", build_anyall, &d_any_dims},
    {"all", build_anyall, &d_all_all},
    {"all.all_out", build_anyall, &d_all_all},
    {"all.dim", build_anyall, &d_all_dim},
    {"all.out", build_anyall, &d_all_dim},
    {"all.dims", build_anyall, &d_all_dims},
    {"all.dims_out", build_anyall, &d_all_dims},
    {"logsumexp", build_logsumexp, NULL},
    {"logsumexp.out", build_logsumexp, NULL},
    {"linalg_vector_norm", build_norm, &d_vnorm},
    {"linalg_vector_norm.out", build_norm, &d_vnorm},
    {"norm.Scalar", build_norm, &d_norm_all},
    {"norm.Scalar_out", build_norm, &d_norm_all},
    {"norm.ScalarOpt_dim", build_norm, &d_norm_dim},
    {"norm.out", build_norm, &d_norm_dim},
    {"norm.ScalarOpt_dim_dtype", build_norm, &d_norm_dim_dtype},
    {"norm.dtype_out", build_norm, &d_norm_dim_dtype},
    {"norm.ScalarOpt_dtype", build_norm, &d_norm_dtype},
    {"norm.ScalarOpt_dtype_out", build_norm, &d_norm_dtype},
    {"count_nonzero.dim_IntList", build_count_nonzero, NULL},
    {"count_nonzero.dim_IntList_out", build_count_nonzero, NULL},
    {"cumsum", build_scan, &d_cumsum},
    {"cumsum_", build_scan, &d_cumsum},
    {"cumsum.out", build_scan, &d_cumsum},
    {"cumprod", build_scan, &d_cumprod},
    {"cumprod_", build_scan, &d_cumprod},
    {"cumprod.out", build_scan, &d_cumprod},
    {"_logcumsumexp", build_scan, &d_lcse},
    {"_logcumsumexp.out", build_scan, &d_lcse},
    {"cummax", build_cumext, &d_cummax},
    {"cummax.out", build_cumext, &d_cummax},
    {"cummin", build_cumext, &d_cummin},
    {"cummin.out", build_cumext, &d_cummin},
    {"_softmax", build_softmax, &d_softmax},
    {"_softmax.out", build_softmax, &d_softmax},
    {"_log_softmax", build_softmax, &d_log_softmax},
    {"_log_softmax.out", build_softmax, &d_log_softmax},
    {"_softmax_backward_data", build_softmax_bwd, &d_softmax_bwd},
    {"_softmax_backward_data.out", build_softmax_bwd, &d_softmax_bwd},
    {"_log_softmax_backward_data", build_softmax_bwd, &d_log_softmax_bwd},
    {"_log_softmax_backward_data.out", build_softmax_bwd, &d_log_softmax_bwd},
    {"histc", build_histc, NULL},
    {"histc.out", build_histc, NULL},
    {NULL, NULL, NULL},
};
