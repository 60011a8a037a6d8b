/* ATen elementwise ops: broadcasting, type promotion, scalar operands.
 *
 * Almost every op here is described by one ew_def_t: which schema arguments are
 * operands (tensors or numbers, broadcast together), which of them take part in type
 * promotion, a few dtype rules as flags, and an optional function that reads the op's
 * scalar parameters and applies the checks PyTorch's CPU kernels make. */
#include <float.h>
#include <math.h>

#include "aten/aten.h"

enum {
  EW_FLOAT = 1,        /* integral/bool results are computed in the default float dtype */
  EW_CMP = 2,          /* output is bool */
  EW_NOBOOL = 4,       /* bool results: NotImplementedError, as the CPU kernels lack them */
  EW_FLOATONLY = 8,    /* non-floating results: NotImplementedError */
  EW_INTONLY = 16,     /* floating results: NotImplementedError (bitwise ops) */
  EW_OPTIONAL = 32,    /* operands may be None (clamp); absent ones add no input */
  EW_SCALAR_OPMATH = 64, /* number operands stay in compute precision (not cast to f16/bf16) */
  EW_SCALAR2_OPMATH = 128, /* ... only a number as the second operand: CPU's mul and div
                            * kernels read it unrounded (x * 0.3 multiplies by 0.3f), where
                            * add and the rest cast it to the tensor's dtype first */
};

/* ia[] slot holding the op's result dtype: kernels round f16/bf16 results through it
 * when the bound output has another dtype, as PyTorch computes in the result dtype. */
#define EW_IA_RESULT (TPU_NODE_NUM_IATTR - 1)

typedef struct ew_def_s ew_def_t;
/* Reads parameters into node->da/ia, may change node->kind, *common and *flags.
 * present: bit k set when operand k was given. */
typedef tpu_status_t (*ew_param_fn)(tpu_build_t* b, tpu_dtype_t* common, int* flags, int present);

struct ew_def_s {
  tpu_kind_t kind;
  int8_t ops[4];     /* schema positions of operands, -1 ends the list */
  uint8_t promo;     /* bit k: operand k takes part in result_type; 0 means all */
  int flags;
  ew_param_fn params;
  const char* kname; /* kernel name PyTorch uses in "not implemented" messages */
};

/* c10's names, which PyTorch's "not implemented for 'Long'" messages use. */
static bool arg_is_float(const tpu_arg_t* a) {
  return a && (a->kind == TPU_ARG_DOUBLE || (a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_FLOAT));
}

/* double -> int64 without undefined behaviour for NaN/inf/out-of-range values. */
static int64_t to_i64(double d) {
  if (!(d > -9.2233720368547758e18 && d < 9.2233720368547758e18)) return d > 0 ? INT64_MAX : d < 0 ? INT64_MIN : 0;
  return (int64_t)d;
}

/* Reads scalar argument i (default dflt when None/absent) into da[k] and ia[k]. */
static tpu_status_t param(tpu_build_t* b, int k, int i, double dflt) {
  double d;
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, i, dflt, &d));
  const tpu_arg_t* a = tpu__arg(b, i);
  int64_t iv = to_i64(d);
  if (a && a->kind != TPU_ARG_NONE && !arg_is_float(a)) TPU_RETURN_IF_ERROR(tpu__arg_int(b, i, &iv));
  b->node->da[k] = d;
  b->node->ia[k] = iv;
  return NULL;
}

/* Whether scalar argument i converts to dtype without overflow, as c10's checked
 * Scalar::to<T>() decides (negative integers may wrap into unsigned types). */
static bool scalar_fits(tpu_build_t* b, int i, tpu_dtype_t dt) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (!a || a->kind == TPU_ARG_NONE || !tpu_dtype_is_integral(dt, false)) return true;
  double lo, hi;
  switch (dt) {
    case TPU_DTYPE_U8: lo = 0; hi = 255; break;
    case TPU_DTYPE_I8: lo = -128; hi = 127; break;
    case TPU_DTYPE_I16: lo = -32768; hi = 32767; break;
    case TPU_DTYPE_I32: lo = -2147483648.0; hi = 2147483647.0; break;
    default: return true;
  }
  double d = 0;
  if (tpu__arg_double(b, i, &d)) return true;
  if (arg_is_float(a)) return d >= lo && d <= hi;
  if (dt == TPU_DTYPE_U8 && d < 0) return -d <= hi;
  return d >= lo && d <= hi;
}

static const char* c_type_name(tpu_dtype_t d) {
  switch (d) {
    case TPU_DTYPE_U8: return "uint8_t";
    case TPU_DTYPE_I8: return "int8_t";
    case TPU_DTYPE_I16: return "int16_t";
    case TPU_DTYPE_I32: return "int";
    default: return "int64_t";
  }
}

static tpu_status_t string_arg(tpu_build_t* b, int i, const char* dflt, const char** out) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (!a || a->kind == TPU_ARG_NONE) { *out = dflt; return NULL; }
  if (a->kind != TPU_ARG_STRING || !a->s)
    return tpu__err(b, TPU_TYPE_ERROR, "argument %d must be str", i);
  *out = a->s;
  return NULL;
}

/* A number's value once cast to a half-precision result dtype. */
static double round_half(double d, tpu_dtype_t dt) {
  float f = (float)d;
  if (dt == TPU_DTYPE_F16) return (double)(_Float16)f;
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return d;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}

static int64_t wrap_int(int64_t v, tpu_dtype_t dt) {
  switch (dt) {
    case TPU_DTYPE_U8: return (uint8_t)v;
    case TPU_DTYPE_I8: return (int8_t)v;
    case TPU_DTYPE_I16: return (int16_t)v;
    case TPU_DTYPE_I32: return (int32_t)v;
    case TPU_DTYPE_BOOL: return v != 0;
    default: return v;
  }
}

static tpu_status_t build_ew(tpu_build_t* b) {
  const ew_def_t* d = b->data;
  int64_t shape[TPU_MAX_DIMS];
  int nd = 0, np = 0, present = 0;
  int promo_idx[4];
  for (int k = 0; k < 4 && d->ops[k] >= 0; ++k) {
    int i = d->ops[k];
    const tpu_arg_t* a = tpu__arg(b, i);
    if (!a) return tpu__err(b, TPU_TYPE_ERROR, "missing argument %d", i);
    if (a->kind == TPU_ARG_NONE) {
      if (d->flags & EW_OPTIONAL) continue;
      return tpu__err(b, TPU_TYPE_ERROR, "argument %d must be Tensor or Number, not None", i);
    }
    if (a->kind == TPU_ARG_TENSOR) {
      if (!tpu_dtype_is_supported(a->tensor.dtype)) return tpu__arg_dtype_err(b, i, a->tensor.dtype);
      int64_t tmp[TPU_MAX_DIMS];
      int tn;
      TPU_RETURN_IF_ERROR(tpu__broadcast(b, shape, nd, a->tensor.sizes, a->tensor.ndim, tmp, &tn));
      memcpy(shape, tmp, sizeof(int64_t) * (size_t)tn);
      nd = tn;
    }
    TPU_RETURN_IF_ERROR(tpu__input_from_arg(b, i));
    present |= 1 << k;
    if (!d->promo || ((d->promo >> k) & 1)) promo_idx[np++] = i;
  }
  tpu_node_t* n = b->node;
  n->kind = d->kind;
  tpu_dtype_t common = tpu__result_type(b, promo_idx, np);
  int flags = d->flags;
  if (d->params) TPU_RETURN_IF_ERROR(d->params(b, &common, &flags, present));
  const char* kname = d->kname ? d->kname : b->name;
  if ((flags & EW_NOBOOL) && common == TPU_DTYPE_BOOL)
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"%s\" not implemented for 'Bool'", kname);
  if ((flags & EW_FLOATONLY) && !tpu_dtype_is_floating(common))
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"%s\" not implemented for '%s'", kname, tpu__dtype_c10_name(common));
  if ((flags & EW_INTONLY) && tpu_dtype_is_floating(common))
    return tpu__err(b, TPU_UNIMPLEMENTED, "\"%s\" not implemented for '%s'", kname, tpu__dtype_c10_name(common));
  if ((flags & EW_FLOAT) && !tpu_dtype_is_floating(common)) common = tpu__default_float();
  n->compute = tpu__compute_dtype(common);
  /* Number operands take the common integer type first, as TensorIterator casts them
   * (uint8 == -1 compares with 255; clamp(uint8, -2, 3) clamps to 254..3). */
  if (tpu_dtype_is_integral(common, true) && n->compute == TPU_DTYPE_I64)
    for (int j = 0; j < n->n_in; ++j)
      if (n->in[j].is_scalar) n->in[j].scalar_i = wrap_int(n->in[j].scalar_i, common);
  /* ... and half-precision ones round to it (f16 0.1 == 0.1 holds on CPU). */
  if ((common == TPU_DTYPE_F16 || common == TPU_DTYPE_BF16) && !(flags & EW_SCALAR_OPMATH)) {
    for (int j = 0; j < n->n_in; ++j) {
      if (!n->in[j].is_scalar) continue;
      bool opmath = j == 1 && (flags & EW_SCALAR2_OPMATH);
      n->in[j].scalar_d = opmath ? (float)n->in[j].scalar_d /* opmath_t: float */
                                 : round_half(n->in[j].scalar_d, common);
    }
  }
  tpu_dtype_t out_dt = (flags & EW_CMP) ? TPU_DTYPE_BOOL : common;
  n->ia[EW_IA_RESULT] = out_dt;
  if (tpu__node_add_output(n, out_dt, nd, shape) < 0)
    return tpu__err(b, TPU_INTERNAL, "too many outputs");
  return NULL;
}

/* ---- parameter readers and checks ------------------------------------------------- */

/* A scalar factor (add's alpha, addr's beta and alpha) into da/ia[k], with ATen's checks
 * against the result dtype. */
static tpu_status_t factor_param(tpu_build_t* b, int k, int i, tpu_dtype_t common, const char* name) {
  TPU_RETURN_IF_ERROR(param(b, k, i, 1.0));
  const tpu_arg_t* a = tpu__arg(b, i);
  bool is_bool = a && ((a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_BOOL) || a->kind == TPU_ARG_BOOL);
  if (is_bool && common != TPU_DTYPE_BOOL)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Boolean %s only supported for Boolean results.", name);
  if (arg_is_float(a) && !tpu_dtype_is_floating(common))
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "For integral input tensors, argument %s must not be a floating point number.", name);
  return NULL;
}

/* add/sub's alpha, which CPU's kernels cast to a half-precision result dtype (where
 * mul and div keep their number operand in float: EW_SCALAR2_OPMATH). */
static tpu_status_t alpha_param(tpu_build_t* b, tpu_dtype_t common) {
  TPU_RETURN_IF_ERROR(factor_param(b, 0, 2, common, "alpha"));
  if (common == TPU_DTYPE_F16 || common == TPU_DTYPE_BF16) b->node->da[0] = round_half(b->node->da[0], common);
  return NULL;
}

static tpu_status_t p_add(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) { return alpha_param(b, *c); }

static tpu_status_t p_sub(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  const tpu_arg_t *x = tpu__arg(b, 0), *y = tpu__arg(b, 1);
  bool bx = tpu__arg_dtype(x) == TPU_DTYPE_BOOL, by = tpu__arg_dtype(y) == TPU_DTYPE_BOOL;
  if (bx && by)
    return tpu__err(b, TPU_UNIMPLEMENTED, "Subtraction, the `-` operator, with two bool tensors is "
                    "not supported. Use the `^` or `logical_xor()` operator instead.");
  if (bx || by)
    return tpu__err(b, TPU_UNIMPLEMENTED, "Subtraction, the `-` operator, with a bool tensor is not "
                    "supported. If you are trying to invert a mask, use the `~` or `logical_not()` "
                    "operator instead.");
  return alpha_param(b, *c);
}

static tpu_status_t p_neg(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  if (*c == TPU_DTYPE_BOOL)
    return tpu__err(b, TPU_UNIMPLEMENTED, "Negation, the `-` operator, on a bool tensor is not "
                    "supported. If you are trying to invert a mask, use the `~` or `logical_not()` "
                    "operator instead.");
  return NULL;
}

static tpu_status_t p_relu(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  if (*c == TPU_DTYPE_BOOL) return tpu__err(b, TPU_UNIMPLEMENTED, "Boolean inputs not supported for relu");
  return NULL;
}

static tpu_status_t p_div_mode(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  const char* mode = NULL;
  TPU_RETURN_IF_ERROR(string_arg(b, 2, NULL, &mode));
  if (!mode) { *f |= EW_FLOAT; b->node->kind = TPU_KIND_DIV; return NULL; }
  *f |= EW_NOBOOL;
  if (!strcmp(mode, "trunc")) b->node->kind = TPU_KIND_EW_DIV_TRUNC;
  else if (!strcmp(mode, "floor")) b->node->kind = TPU_KIND_EW_DIV_FLOOR;
  else
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '%s'", mode);
  return NULL;
}

static tpu_status_t p_round_dec(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  int64_t dec = 0;
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &dec));
  b->node->ia[0] = dec;
  b->node->da[0] = pow(10.0, (double)(dec < 0 ? -dec : dec));
  return NULL;
}

static double dtype_max(tpu_dtype_t d) {
  switch (d) {
    case TPU_DTYPE_F16: return 65504.0;
    case TPU_DTYPE_BF16: return 3.3895313892515355e38;
    case TPU_DTYPE_F32: return FLT_MAX;
    default: return DBL_MAX;
  }
}

static tpu_status_t p_nan_to_num(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  double mx = dtype_max(*c);
  TPU_RETURN_IF_ERROR(param(b, 0, 1, 0.0));
  TPU_RETURN_IF_ERROR(param(b, 1, 2, mx));
  TPU_RETURN_IF_ERROR(param(b, 2, 3, -mx));
  return NULL;
}

static tpu_status_t gelu_mode(tpu_build_t* b, int i, tpu_kind_t none, tpu_kind_t tanh_kind) {
  const char* mode = NULL;
  TPU_RETURN_IF_ERROR(string_arg(b, i, "none", &mode));
  if (!strcmp(mode, "none")) b->node->kind = none;
  else if (!strcmp(mode, "tanh")) b->node->kind = tanh_kind;
  else return tpu__err(b, TPU_INVALID_ARGUMENT, "approximate argument must be either none or tanh.");
  return NULL;
}
static tpu_status_t p_gelu(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  return gelu_mode(b, 1, TPU_KIND_EW_GELU, TPU_KIND_EW_GELU_TANH);
}
static tpu_status_t p_gelu_bw(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  return gelu_mode(b, 2, TPU_KIND_EW_GELU_BW, TPU_KIND_EW_GELU_TANH_BW);
}

static tpu_status_t p_hardtanh(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  TPU_RETURN_IF_ERROR(param(b, 0, 1, -1.0));
  TPU_RETURN_IF_ERROR(param(b, 1, 2, 1.0));
  if (*c == TPU_DTYPE_U8 && (b->node->ia[0] < 0 || b->node->ia[1] < 0))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "cannot do hardtanh on an unsigned type with negative limits");
  return NULL;
}

static tpu_status_t p_leaky(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) { return param(b, 0, 1, 0.01); }

static tpu_status_t p_elu(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  for (int k = 0; k < 3; ++k) TPU_RETURN_IF_ERROR(param(b, k, 1 + k, 1.0));
  return NULL;
}

static tpu_status_t p_softplus(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  TPU_RETURN_IF_ERROR(param(b, 0, 1, 1.0));
  return param(b, 1, 2, 20.0);
}

static tpu_status_t p_logit(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) { return param(b, 0, 1, -1.0); }

static tpu_status_t p_threshold(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  for (int i = 1; i <= 2; ++i)
    if (!scalar_fits(b, i, *c))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "value cannot be converted to type %s without overflow", c_type_name(*c));
  TPU_RETURN_IF_ERROR(param(b, 0, 1, 0.0));
  return param(b, 1, 2, 0.0);
}

static tpu_status_t p_pow(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  const tpu_arg_t* e = tpu__arg(b, 1);
  if (e->kind != TPU_ARG_TENSOR && tpu_dtype_is_integral(*c, true) && !arg_is_float(e)) {
    int64_t v = 0;
    TPU_RETURN_IF_ERROR(tpu__arg_int(b, 1, &v));
    if (v < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "Integers to negative integer powers are not allowed.");
  }
  return NULL;
}

static tpu_status_t p_bitwise_not(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  if (*c == TPU_DTYPE_BOOL) b->node->kind = TPU_KIND_EW_LOGICAL_NOT;
  return NULL;
}

static tpu_status_t p_clamp(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  b->node->ia[1] = (present >> 1) & 1;
  b->node->ia[2] = (present >> 2) & 1;
  if (!b->node->ia[1] && !b->node->ia[2])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "torch.clamp: At least one of 'min' or 'max' must not be None");
  /* one bound runs PyTorch's clamp_min/clamp_max kernels, which have bool */
  if (!b->node->ia[1] || !b->node->ia[2]) *f &= ~EW_NOBOOL;
  return NULL;
}
/* clamp_min/clamp_max: ATen's Scalar-bound kernels have no bool (its Tensor ones do) */
static tpu_status_t p_clamp_min(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  b->node->ia[1] = 1;
  if (*c == TPU_DTYPE_BOOL && tpu__arg(b, 1)->kind != TPU_ARG_TENSOR)
    return tpu__err_not_implemented_for(b, "clamp_min_scalar_cpu", *c);
  return NULL;
}
static tpu_status_t p_clamp_max(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  b->node->ia[2] = 1;
  if (*c == TPU_DTYPE_BOOL && tpu__arg(b, 1)->kind != TPU_ARG_TENSOR)
    return tpu__err_not_implemented_for(b, "clamp_max_scalar_cpu", *c);
  return NULL;
}

static tpu_status_t p_where(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  tpu_dtype_t cd = tpu__arg_dtype(tpu__arg(b, 0));
  if (cd != TPU_DTYPE_BOOL && cd != TPU_DTYPE_U8)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "where expected condition to be a boolean tensor, but got a tensor with dtype %s", tpu__dtype_c10_name(cd));
  return NULL;
}

/* masked_fill is where(mask, value, self) stored in self's dtype. */
static tpu_status_t p_masked_fill(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  const tpu_arg_t *self = tpu__arg(b, 0), *mask = tpu__arg(b, 1), *value = tpu__arg(b, 2);
  if (self->kind != TPU_ARG_TENSOR) return tpu__err(b, TPU_TYPE_ERROR, "argument 0 must be Tensor");
  tpu_dtype_t md = tpu__arg_dtype(mask);
  if (md != TPU_DTYPE_BOOL) {
    static const char* names[] = {"unsigned char", "signed char", "short", "int", "long int",
                                  "c10::Half", "float", "double"};
    const char* nm = md >= 0 && md <= TPU_DTYPE_F64 ? names[md] : tpu__dtype_c10_name(md);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "masked_fill_ only supports boolean masks, but got mask with dtype %s", nm);
  }
  if (value->kind == TPU_ARG_TENSOR && value->tensor.ndim != 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "masked_fill_ only supports a 0-dimensional value tensor, "
                    "but got tensor with %d dimension(s).", value->tensor.ndim);
  *c = self->tensor.dtype;
  return NULL;
}

static tpu_status_t p_lerp(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  const tpu_arg_t *self = tpu__arg(b, 0), *end = tpu__arg(b, 1), *w = tpu__arg(b, 2);
  tpu_dtype_t sd = tpu__arg_dtype(self);
  if (tpu__arg_dtype(end) != sd)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected dtype %s for `end` but got dtype %s",
                    tpu_dtype_name(sd), tpu_dtype_name(tpu__arg_dtype(end)));
  if (w->kind == TPU_ARG_TENSOR && w->tensor.dtype != sd)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected dtype %s for `weight` but got dtype %s",
                    tpu_dtype_name(sd), tpu_dtype_name(w->tensor.dtype));
  *c = sd;
  return NULL;
}

static tpu_status_t p_addcmul(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) { return param(b, 0, 3, 1.0); }

static tpu_status_t p_addcdiv(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  if (tpu_dtype_is_integral(tpu__arg_dtype(tpu__arg(b, 1)), true) &&
      tpu_dtype_is_integral(tpu__arg_dtype(tpu__arg(b, 2)), true))
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Integer division with addcdiv is no longer supported, and in a future  release "
                    "addcdiv will perform a true division of tensor1 and tensor2. The historic addcdiv "
                    "behavior can be implemented as (input + value * torch.trunc(tensor1 / tensor2))"
                    ".to(input.dtype) for integer inputs and as (input + value * tensor1 / tensor2) for "
                    "float inputs. The future addcdiv behavior is just the latter implementation: "
                    "(input + value * tensor1 / tensor2), for all dtypes.");
  return param(b, 0, 3, 1.0);
}

static tpu_status_t p_addr(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  TPU_RETURN_IF_ERROR(factor_param(b, 1, 3, *c, "beta"));
  TPU_RETURN_IF_ERROR(factor_param(b, 0, 4, *c, "alpha"));
  if (*c == TPU_DTYPE_F16 || *c == TPU_DTYPE_BF16) /* CPU's kernel takes them in the dtype */
    for (int k = 0; k < 2; ++k) b->node->da[k] = round_half(b->node->da[k], *c);
  return NULL;
}

static tpu_status_t p_thr_bw(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) { return param(b, 0, 2, 0.0); }

static tpu_status_t p_htanh_bw(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  TPU_RETURN_IF_ERROR(param(b, 0, 2, -1.0));
  return param(b, 1, 3, 1.0);
}

static tpu_status_t p_lrelu_bw(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  TPU_RETURN_IF_ERROR(param(b, 0, 2, 0.01));
  bool is_result = false;
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 3, &is_result));
  if (is_result && b->node->da[0] < 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "In-place leakyReLu backward calculation is triggered with a negative slope which is "
                    "not supported. This is caused by calling in-place forward function with a negative "
                    "slope, please call out-of-place version instead. File an issue at "
                    "https://github.com/pytorch/pytorch if you do require supporting in-place leakRelu "
                    "backward calculation with negative slope");
  return NULL;
}

static tpu_status_t p_elu_bw(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  for (int k = 0; k < 3; ++k) TPU_RETURN_IF_ERROR(param(b, k, 1 + k, 1.0));
  bool is_result = false;
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 4, &is_result));
  if (is_result && b->node->da[0] < 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "In-place elu backward calculation is triggered with a negative slope which is not "
                    "supported. This is caused by calling in-place forward function with a negative "
                    "slope, please call out-of-place version instead.");
  b->node->ia[3] = is_result;
  return NULL;
}

static tpu_status_t p_splus_bw(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  TPU_RETURN_IF_ERROR(param(b, 0, 2, 1.0));
  return param(b, 1, 3, 20.0);
}

static tpu_status_t p_logit_bw(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) { return param(b, 0, 2, -1.0); }

static tpu_status_t p_deg2rad(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  b->node->da[0] = 3.14159265358979323846 / 180.0; /* ATen multiplies by it as mul does: unrounded for f16/bf16 */
  return NULL;
}
static tpu_status_t p_rad2deg(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  b->node->da[0] = 180.0 / 3.14159265358979323846; /* ATen multiplies by it as mul does: unrounded for f16/bf16 */
  return NULL;
}

static tpu_status_t p_heaviside(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  if (tpu__arg_dtype(tpu__arg(b, 0)) != tpu__arg_dtype(tpu__arg(b, 1)))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "heaviside is not yet implemented for tensors with different dtypes.");
  return NULL;
}

static tpu_status_t p_hardshrink(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) { return param(b, 0, 1, 0.5); }
static tpu_status_t p_softshrink(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  TPU_RETURN_IF_ERROR(param(b, 0, 1, 0.5));
  if (b->node->da[0] < 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "lambda must be greater or equal to 0, but found to be %g.", b->node->da[0]);
  return NULL;
}
static tpu_status_t p_shrink_bw(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) { return param(b, 0, 2, 0.5); }

/* Kernels built without type promotion insist on one dtype. */
static tpu_status_t p_same_dtype(tpu_build_t* b, tpu_dtype_t* c, int* f, int present) {
  tpu_dtype_t want = tpu__arg_dtype(tpu__arg(b, 0));
  for (int i = 1; i < 3; ++i) {
    tpu_dtype_t got = tpu__arg_dtype(tpu__arg(b, i));
    if (got != want)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Found dtype %s but expected %s", tpu__dtype_c10_name(got), tpu__dtype_c10_name(want));
  }
  return NULL;
}

/* ---- builders outside the generic shape --------------------------------------------- */

/* log_sigmoid_forward(self) -> (output, buffer): PyTorch's CPU kernel keeps
 * buffer = exp(-|self|) for the backward, which reads it. */
static tpu_status_t build_log_sigmoid(tpu_build_t* b) {
  TPU_RETURN_IF_ERROR(build_ew(b));
  tpu_operand_t* o = &b->node->out[0];
  if (tpu__node_add_output(b->node, o->dtype, o->ndim, o->sizes) < 0)
    return tpu__err(b, TPU_INTERNAL, "too many outputs");
  return NULL;
}

/* addr(self, vec1, vec2, *, beta, alpha) [_, .out]: beta * self + alpha * outer(vec1,
 * vec2), one elementwise node over [n, m] reading vec1 as a column and vec2 as a row, with
 * the rules of CPU's TensorIterator kernel: inputs promoted to one dtype, beta == 0 ignores
 * self (NaN included), bool results ((beta && self) || (alpha && vec1 && vec2)) left to
 * the CPU. self is expanded to [n, m], except in place, where it must have that shape. */
static tpu_status_t build_addr(tpu_build_t* b) {
  tpu_arg_t args[6];
  if (b->nargs < 5 || b->nargs > 6) return tpu__err(b, TPU_INTERNAL, "unexpected arguments");
  memcpy(args, b->args, sizeof(tpu_arg_t) * (size_t)b->nargs);
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  int64_t nm[2];
  for (int k = 1; k <= 2; ++k) {
    tpu_view_t* v = &args[k].tensor;
    if (args[k].kind != TPU_ARG_TENSOR) return tpu__err(b, TPU_TYPE_ERROR, "argument %d must be Tensor", k);
    if (v->ndim != 1)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "addr: Expected 1-D argument vec%d, but got %d-D", k, v->ndim);
    nm[k - 1] = v->sizes[0];
    int64_t stride = v->strides[0];
    v->ndim = 2; /* vec1 as [n, 1], vec2 as [1, m] */
    v->sizes[2 - k] = 1; v->strides[2 - k] = 0;
    v->sizes[k - 1] = nm[k - 1]; v->strides[k - 1] = stride;
  }
  if (b->variant != TPU_VARIANT_INPLACE) {
    TPU_RETURN_IF_ERROR(tpu__check_expand(b, self, 2, nm));
  } else {
    char s[256];
    if (self->ndim != 2)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "2D tensor expected, got %dD tensor for input", self->ndim);
    if (self->sizes[0] != nm[0] || self->sizes[1] != nm[1])
      return tpu__err(b, TPU_INVALID_ARGUMENT, "size mismatch, input: %s, v1: [%lld], v2: [%lld]",
                      tpu__fmt_shape(s, sizeof s, 2, self->sizes), (long long)nm[0], (long long)nm[1]);
  }
  tpu_build_t g = *b;
  g.args = args;
  return build_ew(&g);
}

tpu_status_t tpu__fill_value_input(tpu_build_t* b) {
  const tpu_arg_t* v = tpu__arg(b, 1);
  if (v && v->kind == TPU_ARG_TENSOR && v->tensor.ndim != 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "fill_ only supports 0-dimension value tensor but got tensor with %d dimensions.",
                    v->tensor.ndim);
  return tpu__input_from_arg(b, 1);
}

/* fill_(self, value): output 0 is self, the single input the scalar/0-dim value. */
static tpu_status_t build_fill(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__fill_value_input(b));
  b->node->kind = TPU_KIND_FILL;
  b->node->compute = tpu__compute_dtype(self->dtype);
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

/* zero_(self), zero(self), zero.out(self, out): a fill with 0 of self's shape. */
static tpu_status_t build_zero(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__node_add_scalar(b->node, 0.0, 0, TPU_DTYPE_I64));
  b->node->kind = TPU_KIND_FILL;
  b->node->compute = tpu__compute_dtype(self->dtype);
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

/* ---- op definitions ------------------------------------------------------------------ */

#define OPS1 {0, -1, -1, -1}
#define OPS2 {0, 1, -1, -1}
#define OPS3 {0, 1, 2, -1}
#define DEF(name, kind, ops, promo, flags, params, kname) \
  static const ew_def_t name = {TPU_KIND_##kind, ops, promo, flags, params, kname};

DEF(d_add, ADD, OPS2, 0, 0, p_add, NULL)
DEF(d_sub, SUB, OPS2, 0, 0, p_sub, NULL)
DEF(d_rsub, EW_RSUB, OPS2, 0, 0, p_sub, NULL)
DEF(d_mul, MUL, OPS2, 0, EW_SCALAR2_OPMATH, NULL, NULL)
DEF(d_mul_rounded, MUL, OPS2, 0, 0, NULL, NULL) /* the element op of _foreach_mul_ with numbers */
DEF(d_div, DIV, OPS2, 0, EW_FLOAT | EW_SCALAR2_OPMATH, NULL, NULL)
DEF(d_div_mode, DIV, OPS2, 0, EW_SCALAR2_OPMATH, p_div_mode, "div_floor_cpu")
DEF(d_eq, EQ, OPS2, 0, EW_CMP, NULL, NULL)
DEF(d_ne, NE, OPS2, 0, EW_CMP, NULL, NULL)
DEF(d_lt, LT, OPS2, 0, EW_CMP, NULL, NULL)
DEF(d_le, LE, OPS2, 0, EW_CMP, NULL, NULL)
DEF(d_gt, GT, OPS2, 0, EW_CMP, NULL, NULL)
DEF(d_ge, GE, OPS2, 0, EW_CMP, NULL, NULL)
DEF(d_neg, NEG, OPS1, 0, 0, p_neg, NULL)
DEF(d_exp, EXP, OPS1, 0, EW_FLOAT, NULL, NULL)
/* unary */
DEF(d_abs, EW_ABS, OPS1, 0, EW_NOBOOL, NULL, "abs_cpu")
DEF(d_sqrt, EW_SQRT, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_rsqrt, EW_RSQRT, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_log, EW_LOG, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_log1p, EW_LOG1P, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_log2, EW_LOG2, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_log10, EW_LOG10, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_exp2, EW_EXP2, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_expm1, EW_EXPM1, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_sin, EW_SIN, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_cos, EW_COS, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_tan, EW_TAN, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_tanh, EW_TANH, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_sigmoid, EW_SIGMOID, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_relu, EW_RELU, OPS1, 0, 0, p_relu, NULL)
DEF(d_erf, EW_ERF, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_erfinv, EW_ERFINV, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_reciprocal, EW_RECIPROCAL, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_floor, EW_FLOOR, OPS1, 0, EW_NOBOOL, NULL, "floor")
DEF(d_ceil, EW_CEIL, OPS1, 0, EW_NOBOOL, NULL, "ceil")
DEF(d_round, EW_ROUND, OPS1, 0, EW_NOBOOL, NULL, "round")
DEF(d_round_dec, EW_ROUND_DEC, OPS1, 0, EW_FLOATONLY, p_round_dec, "round_cpu")
DEF(d_trunc, EW_TRUNC, OPS1, 0, EW_NOBOOL, NULL, "trunc")
DEF(d_sign, EW_SIGN, OPS1, 0, 0, NULL, NULL)
DEF(d_frac, EW_FRAC, OPS1, 0, EW_FLOATONLY, NULL, "frac_cpu")
DEF(d_asin, EW_ASIN, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_acos, EW_ACOS, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_atan, EW_ATAN, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_sinh, EW_SINH, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_cosh, EW_COSH, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_asinh, EW_ASINH, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_acosh, EW_ACOSH, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_atanh, EW_ATANH, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_logical_not, EW_LOGICAL_NOT, OPS1, 0, EW_CMP, NULL, NULL)
DEF(d_bitwise_not, EW_BITWISE_NOT, OPS1, 0, EW_INTONLY, p_bitwise_not, "bitwise_not_cpu")
DEF(d_isnan, EW_ISNAN, OPS1, 0, EW_CMP, NULL, NULL)
DEF(d_isinf, EW_ISINF, OPS1, 0, EW_CMP, NULL, NULL)
DEF(d_isposinf, EW_ISPOSINF, OPS1, 0, EW_CMP, NULL, NULL)
DEF(d_isneginf, EW_ISNEGINF, OPS1, 0, EW_CMP, NULL, NULL)
DEF(d_signbit, EW_SIGNBIT, OPS1, 0, EW_CMP, NULL, NULL)
DEF(d_nan_to_num, EW_NAN_TO_NUM, OPS1, 0, 0, p_nan_to_num, NULL)
DEF(d_gelu, EW_GELU, OPS1, 0, EW_FLOATONLY, p_gelu, "GeluKernelImpl")
DEF(d_silu, EW_SILU, OPS1, 0, EW_FLOATONLY, NULL, "silu_cpu")
DEF(d_hardtanh, EW_HARDTANH, OPS1, 0, EW_NOBOOL, p_hardtanh, "clamp_cpu")
DEF(d_leaky_relu, EW_LEAKY_RELU, OPS1, 0, EW_FLOATONLY, p_leaky, "leaky_relu_cpu")
DEF(d_elu, EW_ELU, OPS1, 0, EW_FLOATONLY, p_elu, "elu_cpu")
DEF(d_softplus, EW_SOFTPLUS, OPS1, 0, EW_FLOATONLY, p_softplus, "softplus_cpu")
DEF(d_hardsigmoid, EW_HARDSIGMOID, OPS1, 0, EW_FLOATONLY, NULL, "hardsigmoid_cpu")
DEF(d_hardswish, EW_HARDSWISH, OPS1, 0, EW_FLOATONLY, NULL, "hardswish_cpu")
DEF(d_mish, EW_MISH, OPS1, 0, EW_FLOATONLY, NULL, "mish_cpu")
DEF(d_logit, EW_LOGIT, OPS1, 0, EW_FLOAT, p_logit, NULL)
DEF(d_threshold, EW_THRESHOLD, OPS1, 0, EW_NOBOOL, p_threshold, "threshold_cpu")
/* binary */
DEF(d_pow, EW_POW, OPS2, 0, EW_NOBOOL | EW_SCALAR_OPMATH, p_pow, "pow")
DEF(d_maximum, EW_MAXIMUM, OPS2, 0, 0, NULL, NULL)
DEF(d_minimum, EW_MINIMUM, OPS2, 0, 0, NULL, NULL)
DEF(d_fmax, EW_FMAX, OPS2, 0, 0, NULL, NULL)
DEF(d_fmin, EW_FMIN, OPS2, 0, 0, NULL, NULL)
DEF(d_atan2, EW_ATAN2, OPS2, 0, EW_FLOAT, NULL, NULL)
DEF(d_remainder, EW_REMAINDER, OPS2, 0, EW_NOBOOL, NULL, "remainder_cpu")
DEF(d_fmod, EW_FMOD, OPS2, 0, EW_NOBOOL, NULL, "fmod_cpu")
DEF(d_floor_divide, EW_DIV_FLOOR, OPS2, 0, EW_NOBOOL | EW_SCALAR2_OPMATH, NULL, "div_floor_cpu")
DEF(d_bitwise_and, EW_BITWISE_AND, OPS2, 0, EW_INTONLY, NULL, "bitwise_and_cpu")
DEF(d_bitwise_or, EW_BITWISE_OR, OPS2, 0, EW_INTONLY, NULL, "bitwise_or_cpu")
DEF(d_bitwise_xor, EW_BITWISE_XOR, OPS2, 0, EW_INTONLY, NULL, "bitwise_xor_cpu")
DEF(d_logical_and, EW_LOGICAL_AND, OPS2, 0, EW_CMP, NULL, NULL)
DEF(d_logical_or, EW_LOGICAL_OR, OPS2, 0, EW_CMP, NULL, NULL)
DEF(d_logical_xor, EW_LOGICAL_XOR, OPS2, 0, EW_CMP, NULL, NULL)
DEF(d_hypot, EW_HYPOT, OPS2, 0, EW_FLOATONLY, NULL, "hypot_cpu")
DEF(d_copysign, EW_COPYSIGN, OPS2, 0, EW_FLOAT, NULL, NULL)
DEF(d_xlogy, EW_XLOGY, OPS2, 0, EW_FLOAT, NULL, NULL)
/* ternary and masked */
DEF(d_where, WHERE, OPS3, 6, 0, p_where, NULL)
static const ew_def_t d_masked_fill = {TPU_KIND_WHERE, {1, 2, 0, -1}, 0, 0, p_masked_fill, NULL};
DEF(d_addcmul, EW_ADDCMUL, OPS3, 0, EW_NOBOOL, p_addcmul, "addcmul_cpu_out")
DEF(d_addcdiv, EW_ADDCDIV, OPS3, 0, EW_NOBOOL, p_addcdiv, "addcdiv_cpu_out")
DEF(d_addr, EW_ADDR, OPS3, 0, EW_NOBOOL, p_addr, "addr")
DEF(d_lerp, EW_LERP, OPS3, 0, EW_FLOATONLY | EW_SCALAR_OPMATH, p_lerp, "lerp_kernel_scalar")
DEF(d_clamp, EW_CLAMP, OPS3, 0, EW_OPTIONAL | EW_NOBOOL, p_clamp, "clamp_cpu")
DEF(d_clamp_min, EW_CLAMP, OPS2, 0, 0, p_clamp_min, NULL)
DEF(d_clamp_max, EW_CLAMP, OPS2, 0, 0, p_clamp_max, NULL)
DEF(d_erfc, EW_ERFC, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_lgamma, EW_LGAMMA, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_sinc, EW_SINC, OPS1, 0, EW_FLOAT, NULL, NULL)
DEF(d_deg2rad, EW_SCALE, OPS1, 0, EW_FLOAT, p_deg2rad, NULL)
DEF(d_rad2deg, EW_SCALE, OPS1, 0, EW_FLOAT, p_rad2deg, NULL)
DEF(d_logaddexp, EW_LOGADDEXP, OPS2, 0, EW_FLOATONLY, NULL, "logaddexp_cpu")
DEF(d_logaddexp2, EW_LOGADDEXP2, OPS2, 0, EW_FLOATONLY, NULL, "logaddexp2_cpu")
DEF(d_heaviside, EW_HEAVISIDE, OPS2, 0, 0, p_heaviside, NULL)
DEF(d_hardshrink, EW_HARDSHRINK, OPS1, 0, EW_FLOATONLY, p_hardshrink, "hardshrink_cpu")
DEF(d_softshrink, EW_SOFTSHRINK, OPS1, 0, EW_FLOATONLY, p_softshrink, "softshrink_cpu")
DEF(d_shrink_bw, EW_SHRINK_BW, OPS2, 0, EW_FLOATONLY, p_shrink_bw, "shrink_backward_cpu")
DEF(d_log_sigmoid, EW_LOG_SIGMOID, OPS1, 0, EW_FLOATONLY, NULL, "log_sigmoid_cpu")
DEF(d_log_sigmoid_bw, EW_LOG_SIGMOID_BW, OPS3, 0, EW_FLOATONLY, p_same_dtype, "log_sigmoid_backward_cpu")
DEF(d_lshift, EW_LSHIFT, OPS2, 0, EW_INTONLY | EW_NOBOOL, NULL, "lshift_cpu")
DEF(d_rshift, EW_RSHIFT, OPS2, 0, EW_INTONLY | EW_NOBOOL, NULL, "rshift_cpu")
/* activation backward */
DEF(d_threshold_bw, EW_THRESHOLD_BW, OPS2, 0, EW_NOBOOL, p_thr_bw, "threshold_cpu")
DEF(d_gelu_bw, EW_GELU_BW, OPS2, 0, EW_FLOATONLY, p_gelu_bw, "gelu_backward_cpu")
DEF(d_silu_bw, EW_SILU_BW, OPS2, 0, EW_FLOATONLY, NULL, "silu_backward_cpu")
DEF(d_sigmoid_bw, EW_SIGMOID_BW, OPS2, 0, EW_FLOATONLY, NULL, "sigmoid_backward_cpu")
DEF(d_tanh_bw, EW_TANH_BW, OPS2, 0, EW_FLOATONLY, NULL, "tanh_backward_cpu")
DEF(d_hardtanh_bw, EW_HARDTANH_BW, OPS2, 0, EW_FLOATONLY, p_htanh_bw, "hardtanh_backward_cpu")
DEF(d_leaky_relu_bw, EW_LEAKY_RELU_BW, OPS2, 0, EW_FLOATONLY, p_lrelu_bw, "leaky_relu_backward_cpu")
static const ew_def_t d_elu_bw = {TPU_KIND_EW_ELU_BW, {0, 5, -1, -1}, 0, EW_FLOATONLY, p_elu_bw, "elu_backward_cpu"};
DEF(d_softplus_bw, EW_SOFTPLUS_BW, OPS2, 0, EW_FLOATONLY, p_splus_bw, "softplus_backward_cpu")
DEF(d_hardsigmoid_bw, EW_HARDSIGMOID_BW, OPS2, 0, EW_FLOATONLY, NULL, "hardsigmoid_backward")
DEF(d_hardswish_bw, EW_HARDSWISH_BW, OPS2, 0, EW_FLOATONLY, NULL, "hardswish_backward")
DEF(d_logit_bw, EW_LOGIT_BW, OPS2, 0, EW_FLOATONLY, p_logit_bw, "logit_backward_cpu")

/* Table rows. E(name, def) is one schema; the others expand the usual overload sets. */
#define E(name, def) {name, build_ew, &def}
/* f, f_, f.out */
#define U3(base, def) E(base, def), E(base "_", def), E(base ".out", def)
/* f.ovl, f_.ovl, f.outname */
#define FORMS3(base, ovl, outname, def) E(base "." ovl, def), E(base "_." ovl, def), E(base "." outname, def)

const tpu_aten_entry_t tpu__aten_elementwise[] = {
    FORMS3("add", "Tensor", "out", d_add), FORMS3("add", "Scalar", "Scalar_out", d_add),
    FORMS3("sub", "Tensor", "out", d_sub), FORMS3("sub", "Scalar", "Scalar_out", d_sub),
    FORMS3("mul", "Tensor", "out", d_mul), FORMS3("mul", "Scalar", "Scalar_out", d_mul),
    E("tpu::foreach_mul_scalar_", d_mul_rounded), /* not an ATen name: registers nothing */
    FORMS3("div", "Tensor", "out", d_div), FORMS3("div", "Scalar", "Scalar_out", d_div),
    FORMS3("div", "Tensor_mode", "out_mode", d_div_mode), FORMS3("div", "Scalar_mode", "Scalar_mode_out", d_div_mode),
    E("rsub.Tensor", d_rsub), E("rsub.Scalar", d_rsub), E("rsub.Tensor_out", d_rsub), E("rsub.Scalar_out", d_rsub),
    FORMS3("eq", "Tensor", "Tensor_out", d_eq), FORMS3("eq", "Scalar", "Scalar_out", d_eq),
    FORMS3("ne", "Tensor", "Tensor_out", d_ne), FORMS3("ne", "Scalar", "Scalar_out", d_ne),
    FORMS3("lt", "Tensor", "Tensor_out", d_lt), FORMS3("lt", "Scalar", "Scalar_out", d_lt),
    FORMS3("le", "Tensor", "Tensor_out", d_le), FORMS3("le", "Scalar", "Scalar_out", d_le),
    FORMS3("gt", "Tensor", "Tensor_out", d_gt), FORMS3("gt", "Scalar", "Scalar_out", d_gt),
    FORMS3("ge", "Tensor", "Tensor_out", d_ge), FORMS3("ge", "Scalar", "Scalar_out", d_ge),
    U3("neg", d_neg), U3("exp", d_exp),
    /* unary */
    U3("abs", d_abs), U3("sqrt", d_sqrt), U3("rsqrt", d_rsqrt), U3("log", d_log), U3("log1p", d_log1p),
    U3("log2", d_log2), U3("log10", d_log10), U3("exp2", d_exp2), U3("expm1", d_expm1),
    U3("sin", d_sin), U3("cos", d_cos), U3("tan", d_tan), U3("tanh", d_tanh), U3("sigmoid", d_sigmoid),
    U3("relu", d_relu), U3("erf", d_erf), U3("erfinv", d_erfinv), U3("reciprocal", d_reciprocal),
    U3("floor", d_floor), U3("ceil", d_ceil), U3("round", d_round),
    E("round.decimals", d_round_dec), E("round_.decimals", d_round_dec), E("round.decimals_out", d_round_dec),
    U3("trunc", d_trunc), U3("sign", d_sign), U3("sgn", d_sign), U3("frac", d_frac),
    U3("asin", d_asin), U3("acos", d_acos), U3("atan", d_atan), U3("sinh", d_sinh), U3("cosh", d_cosh),
    U3("asinh", d_asinh), U3("acosh", d_acosh), U3("atanh", d_atanh),
    U3("logical_not", d_logical_not), U3("bitwise_not", d_bitwise_not),
    E("isnan", d_isnan), E("isnan.out", d_isnan), E("isinf", d_isinf), E("isinf.out", d_isinf),
    E("isposinf", d_isposinf), E("isposinf.out", d_isposinf),
    E("isneginf", d_isneginf), E("isneginf.out", d_isneginf),
    E("signbit", d_signbit), E("signbit.out", d_signbit),
    U3("nan_to_num", d_nan_to_num), U3("gelu", d_gelu), U3("silu", d_silu), U3("hardtanh", d_hardtanh),
    U3("leaky_relu", d_leaky_relu), U3("elu", d_elu), E("softplus", d_softplus), E("softplus.out", d_softplus),
    U3("hardsigmoid", d_hardsigmoid), U3("hardswish", d_hardswish), U3("mish", d_mish), U3("logit", d_logit),
    U3("threshold", d_threshold),
    /* binary */
    E("pow.Tensor_Tensor", d_pow), E("pow.Tensor_Scalar", d_pow), E("pow.Scalar", d_pow),
    E("pow.Tensor_Tensor_out", d_pow), E("pow.Tensor_Scalar_out", d_pow), E("pow.Scalar_out", d_pow),
    E("pow_.Tensor", d_pow), E("pow_.Scalar", d_pow),
    E("maximum", d_maximum), E("maximum.out", d_maximum), E("minimum", d_minimum), E("minimum.out", d_minimum),
    E("fmax", d_fmax), E("fmax.out", d_fmax), E("fmin", d_fmin), E("fmin.out", d_fmin),
    U3("atan2", d_atan2),
    FORMS3("remainder", "Tensor", "Tensor_out", d_remainder), FORMS3("remainder", "Scalar", "Scalar_out", d_remainder),
    E("remainder.Scalar_Tensor", d_remainder), E("remainder.Scalar_Tensor_out", d_remainder),
    FORMS3("fmod", "Tensor", "Tensor_out", d_fmod), FORMS3("fmod", "Scalar", "Scalar_out", d_fmod),
    E("floor_divide", d_floor_divide), E("floor_divide.out", d_floor_divide), E("floor_divide_.Tensor", d_floor_divide),
    E("floor_divide.Scalar", d_floor_divide), E("floor_divide.Scalar_out", d_floor_divide),
    E("floor_divide_.Scalar", d_floor_divide),
    FORMS3("bitwise_and", "Tensor", "Tensor_out", d_bitwise_and), FORMS3("bitwise_and", "Scalar", "Scalar_out", d_bitwise_and),
    E("bitwise_and.Scalar_Tensor", d_bitwise_and), E("bitwise_and.Scalar_Tensor_out", d_bitwise_and),
    FORMS3("bitwise_or", "Tensor", "Tensor_out", d_bitwise_or), FORMS3("bitwise_or", "Scalar", "Scalar_out", d_bitwise_or),
    E("bitwise_or.Scalar_Tensor", d_bitwise_or), E("bitwise_or.Scalar_Tensor_out", d_bitwise_or),
    FORMS3("bitwise_xor", "Tensor", "Tensor_out", d_bitwise_xor), FORMS3("bitwise_xor", "Scalar", "Scalar_out", d_bitwise_xor),
    E("bitwise_xor.Scalar_Tensor", d_bitwise_xor), E("bitwise_xor.Scalar_Tensor_out", d_bitwise_xor),
    U3("logical_and", d_logical_and), U3("logical_or", d_logical_or), U3("logical_xor", d_logical_xor),
    U3("hypot", d_hypot),
    E("copysign.Tensor", d_copysign), E("copysign_.Tensor", d_copysign), E("copysign.out", d_copysign),
    FORMS3("copysign", "Scalar", "Scalar_out", d_copysign),
    E("xlogy.Tensor", d_xlogy), E("xlogy_.Tensor", d_xlogy), E("xlogy.OutTensor", d_xlogy),
    E("xlogy.Scalar_Other", d_xlogy), E("xlogy_.Scalar_Other", d_xlogy), E("xlogy.OutScalar_Other", d_xlogy),
    E("xlogy.Scalar_Self", d_xlogy), E("xlogy.OutScalar_Self", d_xlogy),
    /* ternary and masked */
    E("where.self", d_where), E("where.self_out", d_where),
    FORMS3("masked_fill", "Scalar", "Scalar_out", d_masked_fill), FORMS3("masked_fill", "Tensor", "Tensor_out", d_masked_fill),
    U3("addcmul", d_addcmul), U3("addcdiv", d_addcdiv),
    {"addr", build_addr, &d_addr}, {"addr_", build_addr, &d_addr}, {"addr.out", build_addr, &d_addr},
    FORMS3("lerp", "Scalar", "Scalar_out", d_lerp), FORMS3("lerp", "Tensor", "Tensor_out", d_lerp),
    U3("clamp", d_clamp), FORMS3("clamp", "Tensor", "Tensor_out", d_clamp),
    U3("clamp_min", d_clamp_min), FORMS3("clamp_min", "Tensor", "Tensor_out", d_clamp_min),
    U3("clamp_max", d_clamp_max), FORMS3("clamp_max", "Tensor", "Tensor_out", d_clamp_max),
    /* activation backward */
    E("threshold_backward", d_threshold_bw), E("threshold_backward.grad_input", d_threshold_bw),
    E("gelu_backward", d_gelu_bw), E("gelu_backward.grad_input", d_gelu_bw),
    E("silu_backward.grad_input", d_silu_bw),
    E("sigmoid_backward", d_sigmoid_bw), E("sigmoid_backward.grad_input", d_sigmoid_bw),
    E("tanh_backward", d_tanh_bw), E("tanh_backward.grad_input", d_tanh_bw),
    E("hardtanh_backward", d_hardtanh_bw), E("hardtanh_backward.grad_input", d_hardtanh_bw),
    E("leaky_relu_backward", d_leaky_relu_bw), E("leaky_relu_backward.grad_input", d_leaky_relu_bw),
    E("elu_backward", d_elu_bw), E("elu_backward.grad_input", d_elu_bw),
    E("softplus_backward", d_softplus_bw), E("softplus_backward.grad_input", d_softplus_bw),
    E("hardsigmoid_backward", d_hardsigmoid_bw), E("hardsigmoid_backward.grad_input", d_hardsigmoid_bw),
    E("hardswish_backward", d_hardswish_bw), E("hardswish_backward.out", d_hardswish_bw),
    E("logit_backward", d_logit_bw), E("logit_backward.grad_input", d_logit_bw),
    U3("erfc", d_erfc), U3("lgamma", d_lgamma), U3("sinc", d_sinc), U3("deg2rad", d_deg2rad),
    U3("rad2deg", d_rad2deg), E("logaddexp", d_logaddexp), E("logaddexp.out", d_logaddexp),
    E("logaddexp2", d_logaddexp2), E("logaddexp2.out", d_logaddexp2), U3("heaviside", d_heaviside),
    E("hardshrink", d_hardshrink), E("hardshrink.out", d_hardshrink),
    E("softshrink", d_softshrink), E("softshrink.out", d_softshrink),
    E("hardshrink_backward", d_shrink_bw), E("hardshrink_backward.grad_input", d_shrink_bw),
    E("softshrink_backward", d_shrink_bw), E("softshrink_backward.grad_input", d_shrink_bw),
    {"log_sigmoid_forward", build_log_sigmoid, &d_log_sigmoid},
    {"log_sigmoid_forward.output", build_log_sigmoid, &d_log_sigmoid},
    E("log_sigmoid_backward", d_log_sigmoid_bw), E("log_sigmoid_backward.grad_input", d_log_sigmoid_bw),
    FORMS3("bitwise_left_shift", "Tensor", "Tensor_out", d_lshift),
    FORMS3("bitwise_left_shift", "Tensor_Scalar", "Tensor_Scalar_out", d_lshift),
    E("bitwise_left_shift.Scalar_Tensor", d_lshift), E("bitwise_left_shift.Scalar_Tensor_out", d_lshift),
    FORMS3("bitwise_right_shift", "Tensor", "Tensor_out", d_rshift),
    FORMS3("bitwise_right_shift", "Tensor_Scalar", "Tensor_Scalar_out", d_rshift),
    E("bitwise_right_shift.Scalar_Tensor", d_rshift), E("bitwise_right_shift.Scalar_Tensor_out", d_rshift),
    /* fills and copies */
    {"fill_.Scalar", build_fill, NULL}, {"fill_.Tensor", build_fill, NULL},
    {"zero_", build_zero, NULL}, {"zero", build_zero, NULL}, {"zero.out", build_zero, NULL},
    {NULL, NULL, NULL},
};
