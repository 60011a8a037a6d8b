/* ATen elementwise ops: broadcasting, type promotion, scalar operands. */
#include "aten/aten.h"

enum { EW_FLOAT = 1, EW_CMP = 2, EW_ALPHA = 4 };

typedef struct ew_def_s { tpu_kind_t kind; int n_in; int flags; } ew_def_t;

/* Common builder: inputs are schema args 0..n_in-1 (tensors or scalars). */
static tpu_status_t build_ew(tpu_build_t* b) {
  const ew_def_t* d = b->data;
  int idx[3] = {0, 1, 2};
  int64_t shape[TPU_MAX_DIMS];
  int nd = 0;
  for (int i = 0; i < d->n_in; ++i) {
    const tpu_arg_t* a = tpu__arg(b, i);
    if (!a) return tpu__err(b, TPU_TYPE_ERROR, "missing argument %d", i);
    if (a->kind == TPU_ARG_TENSOR) {
      if (!tpu_dtype_is_supported(a->tensor.dtype))
        return tpu__err(b, TPU_TYPE_ERROR, "dtype of argument %d is not supported on tpu", i);
      int64_t tmp[TPU_MAX_DIMS];
      int tn;
      TPU_RETURN_IF_ERROR(tpu__broadcast(b, shape, nd, a->tensor.sizes, a->tensor.ndim, tmp, &tn));
      memcpy(shape, tmp, sizeof(int64_t) * (size_t)tn);
      nd = tn;
    }
    TPU_RETURN_IF_ERROR(tpu__input_from_arg(b, i));
  }
  tpu_dtype_t common = tpu__result_type(b, idx, d->n_in);
  if ((d->flags & EW_FLOAT) && !tpu_dtype_is_floating(common)) common = tpu__default_float();
  tpu_node_t* n = b->node;
  n->kind = d->kind;
  n->compute = tpu__compute_dtype(common);
  if (d->flags & EW_ALPHA) {
    double alpha = 1;
    TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, d->n_in, 1.0, &alpha));
    const tpu_arg_t* a = tpu__arg(b, d->n_in);
    bool alpha_float = a && (a->kind == TPU_ARG_DOUBLE ||
                             (a->kind == TPU_ARG_SCALAR && a->scalar_kind == TPU_SCALAR_FLOAT));
    if (alpha_float && !tpu_dtype_is_floating(common))
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "For integral input tensors, argument alpha must not be a floating point number.");
    n->da[0] = alpha;
    n->ia[0] = (int64_t)alpha;
  }
  tpu__node_add_output(n, (d->flags & EW_CMP) ? TPU_DTYPE_BOOL : common, nd, shape);
  return NULL;
}

/* fill_(self, value): output 0 is self, the single input the scalar/0-dim value. */
static tpu_status_t build_fill(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  const tpu_arg_t* v = tpu__arg(b, 1);
  if (v && v->kind == TPU_ARG_TENSOR && v->tensor.ndim != 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "fill_ only supports 0-dimension value tensor but got tensor with %d dimensions.",
                    v->tensor.ndim);
  TPU_RETURN_IF_ERROR(tpu__input_from_arg(b, 1));
  b->node->kind = TPU_KIND_FILL;
  b->node->compute = tpu__compute_dtype(self->dtype);
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

/* copy_(self, src, non_blocking): dtype conversion and broadcasting of src into self. */
__attribute__((unused)) static tpu_status_t build_copy(tpu_build_t* b) {
  const tpu_view_t* self;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &self));
  TPU_RETURN_IF_ERROR(tpu__input_from_arg(b, 1));
  const tpu_arg_t* s = tpu__arg(b, 1);
  if (s->kind == TPU_ARG_TENSOR) {
    int64_t tmp[TPU_MAX_DIMS];
    int tn;
    TPU_RETURN_IF_ERROR(tpu__broadcast(b, self->sizes, self->ndim, s->tensor.sizes, s->tensor.ndim, tmp, &tn));
    if (tn != self->ndim)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "source has more dimensions than destination");
  }
  b->node->kind = TPU_KIND_COPY;
  tpu__node_add_output(b->node, self->dtype, self->ndim, self->sizes);
  return NULL;
}

#define EW(name, kind, nin, flags) static const ew_def_t name = {TPU_KIND_##kind, nin, flags};
EW(d_add, ADD, 2, EW_ALPHA)
EW(d_sub, SUB, 2, EW_ALPHA)
EW(d_mul, MUL, 2, 0)
EW(d_div, DIV, 2, EW_FLOAT)
EW(d_eq, EQ, 2, EW_CMP)
EW(d_ne, NE, 2, EW_CMP)
EW(d_lt, LT, 2, EW_CMP)
EW(d_le, LE, 2, EW_CMP)
EW(d_gt, GT, 2, EW_CMP)
EW(d_ge, GE, 2, EW_CMP)
EW(d_neg, NEG, 1, 0)
EW(d_exp, EXP, 1, EW_FLOAT)

/* The three forms of an op: functional, in-place, out=. */
#define FORMS3(base, ovl, outname, def) \
  {base "." ovl, build_ew, &def}, {base "_." ovl, build_ew, &def}, {base "." outname, build_ew, &def}

const tpu_aten_entry_t tpu__aten_elementwise[] = {
    FORMS3("add", "Tensor", "out", d_add), {"add.Scalar", build_ew, &d_add}, {"add_.Scalar", build_ew, &d_add},
    FORMS3("sub", "Tensor", "out", d_sub), {"sub.Scalar", build_ew, &d_sub}, {"sub_.Scalar", build_ew, &d_sub},
    FORMS3("mul", "Tensor", "out", d_mul), {"mul.Scalar", build_ew, &d_mul}, {"mul_.Scalar", build_ew, &d_mul},
    FORMS3("div", "Tensor", "out", d_div), {"div.Scalar", build_ew, &d_div}, {"div_.Scalar", build_ew, &d_div},
    FORMS3("eq", "Tensor", "Tensor_out", d_eq), FORMS3("eq", "Scalar", "Scalar_out", d_eq),
    FORMS3("ne", "Tensor", "Tensor_out", d_ne), FORMS3("ne", "Scalar", "Scalar_out", d_ne),
    FORMS3("lt", "Tensor", "Tensor_out", d_lt), FORMS3("lt", "Scalar", "Scalar_out", d_lt),
    FORMS3("le", "Tensor", "Tensor_out", d_le), FORMS3("le", "Scalar", "Scalar_out", d_le),
    FORMS3("gt", "Tensor", "Tensor_out", d_gt), FORMS3("gt", "Scalar", "Scalar_out", d_gt),
    FORMS3("ge", "Tensor", "Tensor_out", d_ge), FORMS3("ge", "Scalar", "Scalar_out", d_ge),
    {"neg", build_ew, &d_neg}, {"neg_", build_ew, &d_neg}, {"neg.out", build_ew, &d_neg},
    {"exp", build_ew, &d_exp}, {"exp_", build_ew, &d_exp}, {"exp.out", build_ew, &d_exp},
    {"fill_.Scalar", build_fill, NULL}, {"fill_.Tensor", build_fill, NULL},
    {NULL, NULL, NULL},
};
