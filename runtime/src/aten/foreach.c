/* torch._foreach_* ops: the optimizers' (Adam, AdamW, SGD, ...) and clip_grad_norm_'s way
 * of applying one op to every parameter. Without an entry here each call reaches ATen's
 * composite "slow" kernel, which calls the element op through the dispatcher once per
 * list position (about a microsecond of dispatch each: 1,600 calls per AdamW step over
 * 200 parameters). Here a call is one adapter call: libtpurt builds the element op's node
 * for every position (tpu_foreach_prepare) from the same argument list, and the nodes
 * are ordinary ones, so defer_and_fuse fuses each parameter's chain of updates.
 *
 * Each entry names its element op, the table entry that ATen's slow kernel calls for one
 * position (aten/src/ATen/native/ForeachOpsKernels.cpp): maximum/minimum with a scalar
 * are clamp_min/clamp_max, norm is linalg_vector_norm(self, ord, None, False, dtype).
 * Position k of every Tensor[] and Scalar[] argument replaces the list; other arguments
 * pass as they are. The fused optimizer steps (_fused_adam_, _fused_adamw_, _fused_sgd_)
 * and GradScaler's unscale are foreach ops too, with element ops of their own
 * (aten/optim.c). Forms not listed (the packed Tensor scalars of addcmul/addcdiv, in-place
 * maximum/minimum of two lists, copy_, clone, mm, powsum, _fused_adagrad_) keep ATen's
 * slow kernel or, for the fused ones, the CPU fallback. */
#include <string.h>

#include "aten/aten.h"

/* An element argument list that is not the foreach op's own, in element order: a foreach
 * argument index, or one of these. */
#define ARG_NONE (-1)
#define ARG_FALSE (-2)
#define MAX_MAP 6

typedef struct foreach_def_s {
  const char* element;
  int n_map;             /* 0: the element op takes the foreach op's arguments */
  int map[MAX_MAP];
  unsigned may_be_empty; /* bit i: list argument i may be empty (each position: None) */
} foreach_def_t;

static tpu_status_t build_direct(tpu_build_t* b) {
  return tpu_status_make(TPU_INTERNAL, "%s: a foreach op is prepared per list position", b->name);
}

#define D(el) (&(const foreach_def_t){el, 0, {0}, 0})
#define E(name, el) {"_foreach_" name, build_direct, D(el), TPU_ATEN_FOREACH}
#define FUSED(name, el, empty) {name, build_direct, &(const foreach_def_t){el, 0, {0}, empty}, TPU_ATEN_FOREACH}
#define UNARY(op) E(#op, #op), E(#op "_", #op "_")
/* op.Scalar / .ScalarList take the element's Scalar form, .List its Tensor form. */
#define ARITH(op)                                                                    \
  E(#op ".Scalar", #op ".Scalar"), E(#op ".ScalarList", #op ".Scalar"),              \
  E(#op ".List", #op ".Tensor"), E(#op "_.Scalar", #op "_.Scalar"),                  \
  E(#op "_.ScalarList", #op "_.Scalar"), E(#op "_.List", #op "_.Tensor")

/* clamp_min/clamp_max: the scalar forms are the op itself, .List its .Tensor form. */
#define CLAMP(op)                                                                    \
  E(#op ".Scalar", #op), E(#op ".ScalarList", #op), E(#op ".List", #op ".Tensor"),   \
  E(#op "_.Scalar", #op "_"), E(#op "_.ScalarList", #op "_"), E(#op "_.List", #op "_.Tensor")

const tpu_aten_entry_t tpu__aten_foreach[] = {
    UNARY(abs), UNARY(acos), UNARY(asin), UNARY(atan), UNARY(ceil), UNARY(cos), UNARY(cosh),
    UNARY(erf), UNARY(erfc), UNARY(exp), UNARY(expm1), UNARY(floor), UNARY(frac),
    UNARY(lgamma), UNARY(log), UNARY(log10), UNARY(log1p), UNARY(log2), UNARY(neg),
    UNARY(reciprocal), UNARY(round), UNARY(rsqrt), UNARY(sigmoid), UNARY(sign), UNARY(sin),
    UNARY(sinh), UNARY(sqrt), UNARY(tan), UNARY(tanh), UNARY(trunc),
    E("zero_", "zero_"),
    ARITH(add), ARITH(sub), ARITH(div),
    /* CPU's in-place _foreach_mul_ with numbers casts them to an f16/bf16 list's dtype
     * (SGD's momentum buffers, Adam's second moments), unlike mul_ and _foreach_mul */
    E("mul.Scalar", "mul.Scalar"), E("mul.ScalarList", "mul.Scalar"), E("mul.List", "mul.Tensor"),
    E("mul_.Scalar", "tpu::foreach_mul_scalar_"), E("mul_.ScalarList", "tpu::foreach_mul_scalar_"),
    E("mul_.List", "mul_.Tensor"),
    /* a single Tensor other (a 0-dim tensor, e.g. clip_grad_norm_'s clip coefficient) */
    E("add.Tensor", "add.Tensor"), E("add_.Tensor", "add_.Tensor"),
    E("mul.Tensor", "mul.Tensor"), E("mul_.Tensor", "mul_.Tensor"),
    E("div.Tensor", "div.Tensor"), E("div_.Tensor", "div_.Tensor"),
    CLAMP(clamp_min), CLAMP(clamp_max),
    E("maximum.Scalar", "clamp_min"), E("maximum.ScalarList", "clamp_min"),
    E("maximum.List", "maximum"), E("maximum_.Scalar", "clamp_min_"),
    E("maximum_.ScalarList", "clamp_min_"),
    E("minimum.Scalar", "clamp_max"), E("minimum.ScalarList", "clamp_max"),
    E("minimum.List", "minimum"), E("minimum_.Scalar", "clamp_max_"),
    E("minimum_.ScalarList", "clamp_max_"),
    E("addcmul.Scalar", "addcmul"), E("addcmul.ScalarList", "addcmul"),
    E("addcmul_.Scalar", "addcmul_"), E("addcmul_.ScalarList", "addcmul_"),
    E("addcdiv.Scalar", "addcdiv"), E("addcdiv.ScalarList", "addcdiv"),
    E("addcdiv_.Scalar", "addcdiv_"), E("addcdiv_.ScalarList", "addcdiv_"),
    E("lerp.Scalar", "lerp.Scalar"), E("lerp.ScalarList", "lerp.Scalar"),
    E("lerp.List", "lerp.Tensor"), E("lerp_.Scalar", "lerp_.Scalar"),
    E("lerp_.ScalarList", "lerp_.Scalar"), E("lerp_.List", "lerp_.Tensor"),
    E("pow.Scalar", "pow.Tensor_Scalar"), E("pow.ScalarList", "pow.Tensor_Scalar"),
    E("pow.List", "pow.Tensor_Tensor"), E("pow.ScalarAndTensor", "pow.Scalar"),
    E("pow_.Scalar", "pow_.Scalar"), E("pow_.ScalarList", "pow_.Scalar"),
    E("pow_.List", "pow_.Tensor"),
    E("max", "max"),
    /* _foreach_norm(self, ord, dtype) -> linalg_vector_norm(self, ord, None, False, dtype) */
    {"_foreach_norm.Scalar", build_direct,
     &(const foreach_def_t){"linalg_vector_norm", 5, {0, 1, ARG_NONE, ARG_FALSE, 2}, 0}, TPU_ATEN_FOREACH},
    /* fused optimizer steps (aten/optim.c): max_exp_avg_sqs is empty without amsgrad,
     * momentum_buffer_list without momentum */
    FUSED("_fused_adam_", "tpu::adam_step", 1u << 4),
    FUSED("_fused_adam_.tensor_lr", "tpu::adam_step", 1u << 4),
    FUSED("_fused_adamw_", "tpu::adamw_step", 1u << 4),
    FUSED("_fused_adamw_.tensor_lr", "tpu::adamw_step", 1u << 4),
    FUSED("_fused_sgd_", "tpu::sgd_step", 1u << 2),
    FUSED("_fused_sgd_.tensor_lr", "tpu::sgd_step", 1u << 2),
    FUSED("_amp_foreach_non_finite_check_and_unscale_", "tpu::amp_unscale", 0),
    {NULL, NULL, NULL, 0},
};

const char* tpu__foreach_element(const tpu_aten_entry_t* e) {
  return ((const foreach_def_t*)e->data)->element;
}

static bool is_list(const tpu_arg_t* a) {
  return a->kind == TPU_ARG_TENSORLIST || a->kind == TPU_ARG_SCALARLIST;
}

tpu_status_t tpu__foreach_length(const tpu_aten_entry_t* e, const tpu_arg_t* args, int nargs, int64_t* out_len) {
  const char* name = e->name;
  unsigned may_be_empty = ((const foreach_def_t*)e->data)->may_be_empty;
  const tpu_arg_t* first = NULL; /* the first Tensor[] */
  for (int i = 0; i < nargs && !first; ++i)
    if (args[i].kind == TPU_ARG_TENSORLIST) first = &args[i];
  if (!first) return tpu_status_make(TPU_INTERNAL, "%s: no Tensor[] argument", name);
  /* ATen's check_foreach_api_restrictions, with its messages */
  if (first->list_len == 0)
    return tpu_status_make(TPU_INVALID_ARGUMENT, "%s: Tensor list must have at least one tensor.", name);
  for (int i = 0; i < nargs; ++i) {
    const tpu_arg_t* a = &args[i];
    if (a->list_len == 0 && (may_be_empty >> i & 1u)) continue;
    if (a->kind == TPU_ARG_TENSORLIST && a->list_len != first->list_len)
      return tpu_status_make(TPU_INVALID_ARGUMENT,
                             "%s: Tensor lists must have the same number of tensors, got %lld and %lld",
                             name, (long long)first->list_len, (long long)a->list_len);
    if (a->kind == TPU_ARG_SCALARLIST && a->list_len != first->list_len)
      return tpu_status_make(TPU_INVALID_ARGUMENT,
                             "%s: Tensor list must have same number of elements as scalar list.", name);
  }
  *out_len = first->list_len;
  return NULL;
}

tpu_status_t tpu__foreach_args(const tpu_aten_entry_t* e, const tpu_arg_t* args, int nargs, int64_t k,
                               tpu_arg_t* out, int* out_n) {
  const foreach_def_t* d = e->data;
  int n = d->n_map ? d->n_map : nargs;
  if (n > TPU_FOREACH_MAX_ARGS) return tpu_status_make(TPU_INTERNAL, "%s: too many arguments", e->name);
  for (int i = 0; i < n; ++i) {
    int src = d->n_map ? d->map[i] : i;
    tpu_arg_t* a = &out[i];
    if (src < 0 || src >= nargs) {
      memset(a, 0, sizeof(*a));
      a->kind = src == ARG_FALSE ? TPU_ARG_BOOL : TPU_ARG_NONE;
      continue;
    }
    const tpu_arg_t* s = &args[src];
    if (!is_list(s)) { *a = *s; continue; }
    if (s->list_len == 0 && (d->may_be_empty >> src & 1u)) {
      memset(a, 0, sizeof(*a));
      a->kind = TPU_ARG_NONE;
      continue;
    }
    if (k < 0 || k >= s->list_len)
      return tpu_status_make(TPU_INTERNAL, "%s: list position %lld out of range", e->name, (long long)k);
    if (s->kind == TPU_ARG_SCALARLIST) { *a = s->scalars[k]; continue; }
    memset(a, 0, sizeof(*a));
    a->kind = s->tensors[k].storage ? TPU_ARG_TENSOR : TPU_ARG_NONE;
    if (s->tensors[k].storage) a->tensor = s->tensors[k];
  }
  *out_n = n;
  return NULL;
}
