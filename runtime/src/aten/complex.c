/* ATen ops on complex dtypes (complex64, complex128): the complex forms of the
 * elementwise arithmetic, polar/complex/angle/conj_physical, and the FFTs
 * (_fft_r2c, _fft_c2c, _fft_c2r).
 *
 * tpu_op_prepare routes every call with a complex argument or output here (aten.h):
 * tpu__aten_complex_alt holds the complex forms of ops whose real forms live in other
 * families, tpu__aten_complex the ops that only this family implements (they also take
 * real arguments: polar, _fft_r2c, angle). Elementwise kinds compute in the complex
 * dtype of the result (host/complex.c); a real operand is (x, 0) there. */
#include <math.h>

#include "aten/aten.h"

enum {
  C_REAL_OUT = 1,   /* abs, angle: the result is the part dtype */
  C_ALPHA = 2,      /* argument 2 is alpha (add, sub) */
  C_NO_INPLACE = 4, /* abs_: PyTorch refuses the in-place form for complex self */
};

typedef struct cdef_s {
  tpu_kind_t kind;
  int8_t ops[2]; /* schema positions of the operands; -1 ends */
  int flags;
} cdef_t;

static tpu_status_t add_operand(tpu_build_t* b, int i, int64_t* shape, int* nd) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (!a || a->kind == TPU_ARG_NONE)
    return tpu__err(b, TPU_TYPE_ERROR, "argument %d must be Tensor or Number, not None", i);
  if (a->kind == TPU_ARG_TENSOR) {
    int64_t tmp[TPU_MAX_DIMS];
    int tn;
    TPU_RETURN_IF_ERROR(tpu__broadcast(b, shape, *nd, a->tensor.sizes, a->tensor.ndim, tmp, &tn));
    memcpy(shape, tmp, sizeof(int64_t) * (size_t)tn);
    *nd = tn;
  }
  return tpu__input_from_arg(b, i);
}

static tpu_status_t build_cew(tpu_build_t* b) {
  const cdef_t* d = b->data;
  tpu_node_t* n = b->node;
  int64_t shape[TPU_MAX_DIMS];
  int nd = 0, np = 0, idx[2];
  for (int k = 0; k < 2 && d->ops[k] >= 0; ++k) {
    TPU_RETURN_IF_ERROR(add_operand(b, d->ops[k], shape, &nd));
    idx[np++] = d->ops[k];
  }
  if ((d->flags & C_NO_INPLACE) && b->variant == TPU_VARIANT_INPLACE)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "In-place abs is not supported for complex tensors.");
  tpu_dtype_t r = tpu__result_type(b, idx, np);
  if (!tpu_dtype_is_complex(r) && !(d->flags & C_REAL_OUT) && d->kind != TPU_KIND_C_CONJ)
    /* real operands, complex only through out=: computed in the real result dtype first
     * on CPU (bf16 rounding included), which the real kernels do */
    return tpu__err(b, TPU_UNIMPLEMENTED, "real operands with a complex out= tensor are not supported on tpu");
  n->kind = d->kind;
  tpu_dtype_t out = r;
  if (d->flags & C_REAL_OUT) {
    if (!tpu_dtype_is_complex(r)) {
      /* angle of a real tensor: pi for negative values, 0 otherwise, NaN stays */
      n->ia[0] = 1;
      if (!tpu_dtype_is_floating(r)) r = tpu__default_float();
      out = r;
    } else {
      out = tpu__real_of(r);
    }
  }
  n->compute = tpu__complex_of(r == TPU_DTYPE_F64 || r == TPU_DTYPE_C128 ? TPU_DTYPE_F64 : TPU_DTYPE_F32);
  if (d->flags & C_ALPHA) {
    const tpu_arg_t* a = tpu__arg(b, 2);
    n->da[0] = 1.0;
    n->da[1] = 0.0;
    if (a && a->kind != TPU_ARG_NONE) {
      TPU_RETURN_IF_ERROR(tpu__arg_double(b, 2, &n->da[0]));
      if (a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_COMPLEX) n->da[1] = a->scalar_im;
    }
  }
  if (tpu__node_add_output(n, out, nd, shape) < 0) return tpu__err(b, TPU_INTERNAL, "too many outputs");
  return NULL;
}

/* fill_(self, value) / zero_(self): output 0 has self's dtype and shape. */
static tpu_status_t build_cfill(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  if (!tpu_dtype_is_complex(self->dtype)) /* a complex value into a real tensor: CPU's checks */
    return tpu__err(b, TPU_UNIMPLEMENTED, "a complex fill value for a %s tensor", tpu__dtype_c10_name(self->dtype));
  if (b->data) {
    TPU_RETURN_IF_ERROR(tpu__node_add_scalar(b->node, 0.0, 0, TPU_DTYPE_I64));
  } else {
    TPU_RETURN_IF_ERROR(tpu__fill_value_input(b));
  }
  b->node->kind = TPU_KIND_C_IDENT;
  b->node->compute = tpu__complex_of(tpu__real_of(self->dtype) == TPU_DTYPE_F64 ? TPU_DTYPE_F64 : TPU_DTYPE_F32);
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

/* polar(abs, angle), complex(real, imag): two real floating tensors of one dtype. */
static tpu_status_t build_from_parts(tpu_build_t* b) {
  const tpu_view_t *x, *y;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &y));
  const char* what = b->data == (const void*)1 ? "abs and angle" : "real and imag";
  if (x->dtype != y->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected object of scalar type %s but got scalar type %s "
                    "for second argument (%s must have the same dtype)", tpu__dtype_c10_name(x->dtype),
                    tpu__dtype_c10_name(y->dtype), what);
  if (x->dtype == TPU_DTYPE_F16) /* a ComplexHalf result: the CPU path decides (tpu has no complex32) */
    return tpu__err(b, TPU_UNIMPLEMENTED, "ComplexHalf results are not supported on tpu");
  if (x->dtype != TPU_DTYPE_F32 && x->dtype != TPU_DTYPE_F64)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected both inputs to be Half, Float or Double tensors but "
                    "got %s and %s", tpu__dtype_c10_name(x->dtype), tpu__dtype_c10_name(y->dtype));
  const tpu_arg_t* o = tpu__arg(b, 2);
  if (b->variant == TPU_VARIANT_OUT && o && o->kind == TPU_ARG_TENSOR && o->tensor.dtype != tpu__complex_of(x->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected object of scalar type %s but got scalar type %s for "
                    "argument 'out'", tpu__dtype_c10_name(tpu__complex_of(x->dtype)),
                    tpu__dtype_c10_name(o->tensor.dtype));
  int64_t shape[TPU_MAX_DIMS];
  int nd = 0;
  TPU_RETURN_IF_ERROR(add_operand(b, 0, shape, &nd));
  TPU_RETURN_IF_ERROR(add_operand(b, 1, shape, &nd));
  b->node->kind = b->data == (const void*)1 ? TPU_KIND_C_POLAR : TPU_KIND_C_COMPLEX;
  b->node->compute = tpu__complex_of(x->dtype);
  tpu__node_add_output(b->node, tpu__complex_of(x->dtype), nd, shape);
  return NULL;
}

/* ---- sum, mean ---------------------------------------------------------------------------
 * data: 0 sum over dims, 1 mean over dims, 2 sum over all, 3 mean over all. The dim forms
 * are (self, dim?, keepdim, *, dtype?), the others (self, *, dtype?). */
static tpu_status_t build_csum(tpu_build_t* b) {
  intptr_t form = (intptr_t)b->data;
  bool all = form >= 2, mean = form & 1;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  int dtype_arg = all ? 1 : 3;
  tpu_dtype_t res = x->dtype;
  if (!tpu__arg_is_none(b, dtype_arg)) {
    int64_t d;
    TPU_RETURN_IF_ERROR(tpu__arg_int(b, dtype_arg, &d));
    res = (tpu_dtype_t)d;
  }
  if (!tpu_dtype_is_complex(res) || !tpu_dtype_is_complex(x->dtype))
    return tpu__err_not_implemented_for(b, mean ? "mean" : "sum", res); /* the CPU path decides */
  int64_t mask[TPU_MAX_DIMS] = {0};
  bool keepdim = false;
  const int64_t* dims = NULL;
  int nd = 0;
  if (!all) {
    TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 2, false, &keepdim));
    if (!tpu__arg_is_none(b, 1)) TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &dims, &nd));
  }
  if (nd == 0) for (int k = 0; k < x->ndim; ++k) mask[k] = 1;
  for (int k = 0; k < nd; ++k) {
    int dd;
    TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dims[k], x->ndim, &dd));
    if (x->ndim == 0) continue;
    if (mask[dd]) return tpu__err(b, TPU_INVALID_ARGUMENT, "dim %d appears multiple times in the list of dims", dd);
    mask[dd] = 1;
  }
  int64_t shape[TPU_MAX_DIMS];
  int on = 0;
  for (int k = 0; k < x->ndim; ++k) {
    if (!mask[k]) shape[on++] = x->sizes[k];
    else if (keepdim) shape[on++] = 1;
  }
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(b->node, mask, x->ndim));
  b->node->kind = TPU_KIND_C_SUM;
  b->node->ia[0] = mean;
  b->node->compute = TPU_DTYPE_C128;
  tpu__node_add_output(b->node, res, on, shape);
  return NULL;
}

/* ---- FFTs ------------------------------------------------------------------------------ */

/* self, dim, normalization: the wrapped dims (distinct) into the node's ilist. */
static tpu_status_t fft_common(tpu_build_t* b, const tpu_view_t** out_x) {
  const tpu_view_t* x = NULL;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  const int64_t* dims;
  int nd;
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &dims, &nd));
  if (nd < 1 || nd > x->ndim)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected 1 to %d dims to transform, got %d", x->ndim, nd);
  int64_t w[TPU_MAX_DIMS];
  bool seen[TPU_MAX_DIMS] = {0};
  for (int k = 0; k < nd; ++k) {
    int dd;
    TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, dims[k], x->ndim, &dd));
    if (seen[dd]) return tpu__err(b, TPU_INVALID_ARGUMENT, "dims must be unique, got dim %d twice", dd);
    seen[dd] = true;
    w[k] = dd;
  }
  int64_t norm;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 2, &norm));
  if (norm < 0 || norm > 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "invalid normalization mode %lld", (long long)norm);
  b->node->ia[0] = norm;
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(b->node, w, nd));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  *out_x = x;
  return NULL;
}

static tpu_status_t check_signal(tpu_build_t* b, const int64_t* sizes) {
  for (int k = 0; k < b->node->ilist_len; ++k)
    if (sizes[b->node->ilist[k]] < 1)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Invalid number of data points (%lld) specified",
                      (long long)sizes[b->node->ilist[k]]);
  return NULL;
}

/* _fft_r2c(self, dim, normalization, onesided): real floating input. */
static tpu_status_t build_fft_r2c(tpu_build_t* b) {
  const tpu_view_t* x = NULL;
  TPU_RETURN_IF_ERROR(fft_common(b, &x));
  if (x->dtype != TPU_DTYPE_F32 && x->dtype != TPU_DTYPE_F64)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Unsupported dtype %s", tpu__dtype_c10_name(x->dtype));
  bool onesided;
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 3, &onesided));
  TPU_RETURN_IF_ERROR(check_signal(b, x->sizes));
  b->node->ia[1] = onesided;
  int64_t shape[TPU_MAX_DIMS];
  memcpy(shape, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
  int last = (int)b->node->ilist[b->node->ilist_len - 1];
  if (onesided) shape[last] = shape[last] / 2 + 1;
  b->node->kind = TPU_KIND_FFT_R2C;
  b->node->compute = tpu__complex_of(x->dtype);
  tpu__node_add_output(b->node, tpu__complex_of(x->dtype), x->ndim, shape);
  return NULL;
}

/* _fft_c2c(self, dim, normalization, forward): complex input. */
static tpu_status_t build_fft_c2c(tpu_build_t* b) {
  const tpu_view_t* x = NULL;
  TPU_RETURN_IF_ERROR(fft_common(b, &x));
  if (!tpu_dtype_is_complex(x->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expects a complex input tensor, but got %s",
                    tpu__dtype_c10_name(x->dtype));
  bool forward;
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 3, &forward));
  TPU_RETURN_IF_ERROR(check_signal(b, x->sizes));
  b->node->ia[1] = forward;
  b->node->kind = TPU_KIND_FFT_C2C;
  b->node->compute = x->dtype;
  tpu__node_add_output(b->node, x->dtype, x->ndim, x->sizes);
  return NULL;
}

/* _fft_c2r(self, dim, normalization, last_dim_size): the first last_dim_size/2+1
 * elements of the last transformed dim are the half spectrum. */
static tpu_status_t build_fft_c2r(tpu_build_t* b) {
  const tpu_view_t* x = NULL;
  TPU_RETURN_IF_ERROR(fft_common(b, &x));
  if (!tpu_dtype_is_complex(x->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expects a complex input tensor, but got %s",
                    tpu__dtype_c10_name(x->dtype));
  int64_t n;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 3, &n));
  int last = (int)b->node->ilist[b->node->ilist_len - 1];
  if (n < 1) return tpu__err(b, TPU_INVALID_ARGUMENT, "Invalid number of data points (%lld) specified", (long long)n);
  if (x->sizes[last] < n / 2 + 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected at least %lld elements in dim %d for an output of "
                    "%lld points, got %lld", (long long)(n / 2 + 1), last, (long long)n, (long long)x->sizes[last]);
  int64_t shape[TPU_MAX_DIMS];
  memcpy(shape, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
  shape[last] = n;
  TPU_RETURN_IF_ERROR(check_signal(b, shape));
  b->node->ia[2] = n;
  b->node->kind = TPU_KIND_FFT_C2R;
  b->node->compute = x->dtype;
  tpu__node_add_output(b->node, tpu__real_of(x->dtype), x->ndim, shape);
  return NULL;
}

/* ---- tables ------------------------------------------------------------------------------ */

#define CDEF(name, kind, a0, a1, flags) static const cdef_t name = {TPU_KIND_##kind, {a0, a1}, flags};
CDEF(c_add, C_ADD, 0, 1, C_ALPHA)
CDEF(c_sub, C_SUB, 0, 1, C_ALPHA)
CDEF(c_mul, C_MUL, 0, 1, 0)
CDEF(c_div, C_DIV, 0, 1, 0)
CDEF(c_neg, C_NEG, 0, -1, 0)
CDEF(c_conj, C_CONJ, 0, -1, 0)
CDEF(c_sgn, C_SGN, 0, -1, 0)
CDEF(c_abs, C_ABS, 0, -1, C_REAL_OUT | C_NO_INPLACE)
CDEF(c_angle, C_ANGLE, 0, -1, C_REAL_OUT)

#define E(name, def) {name, build_cew, &def}
#define FORMS3(base, ovl, outname, def) E(base "." ovl, def), E(base "_." ovl, def), E(base "." outname, def)
#define U3(base, def) E(base, def), E(base "_", def), E(base ".out", def)

const tpu_aten_entry_t tpu__aten_complex_alt[] = {
    FORMS3("add", "Tensor", "out", c_add), FORMS3("add", "Scalar", "Scalar_out", c_add),
    FORMS3("sub", "Tensor", "out", c_sub), FORMS3("sub", "Scalar", "Scalar_out", c_sub),
    FORMS3("mul", "Tensor", "out", c_mul), FORMS3("mul", "Scalar", "Scalar_out", c_mul),
    FORMS3("div", "Tensor", "out", c_div), FORMS3("div", "Scalar", "Scalar_out", c_div),
    U3("neg", c_neg), U3("abs", c_abs), U3("sgn", c_sgn),
    {"fill_.Scalar", build_cfill, NULL}, {"fill_.Tensor", build_cfill, NULL},
    {"zero_", build_cfill, (const void*)1}, {"zero", build_cfill, (const void*)1},
    {"zero.out", build_cfill, (const void*)1},
    {"sum.dim_IntList", build_csum, (const void*)0}, {"sum.IntList_out", build_csum, (const void*)0},
    {"mean.dim", build_csum, (const void*)1}, {"mean.out", build_csum, (const void*)1},
    {"sum", build_csum, (const void*)2}, {"sum.out", build_csum, (const void*)2},
    {"mean", build_csum, (const void*)3}, {"mean.dtype_out", build_csum, (const void*)3},
    {NULL, NULL, NULL},
};

const tpu_aten_entry_t tpu__aten_complex[] = {
    E("angle", c_angle), E("angle.out", c_angle),
    E("conj_physical.out", c_conj), E("conj_physical_", c_conj), E("_conj_physical", c_conj),
    {"polar", build_from_parts, (const void*)1}, {"polar.out", build_from_parts, (const void*)1},
    {"complex", build_from_parts, NULL}, {"complex.out", build_from_parts, NULL},
    {"_fft_r2c", build_fft_r2c, NULL}, {"_fft_r2c.out", build_fft_r2c, NULL},
    {"_fft_c2c", build_fft_c2c, NULL}, {"_fft_c2c.out", build_fft_c2c, NULL},
    {"_fft_c2r", build_fft_c2r, NULL}, {"_fft_c2r.out", build_fft_c2r, NULL},
    {NULL, NULL, NULL},
};
