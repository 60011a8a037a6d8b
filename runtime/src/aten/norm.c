/* ATen batch normalization: native_batch_norm and its backward.
 *
 * Inputs (in order): input, weight?, bias?, running_mean?, running_var? (backward: grad,
 * input, weight?, running_mean?, running_var?, save_mean?, save_invstd?). ia[0] = training,
 * da[0] = momentum, da[1] = eps. In training mode the forward kernel also updates
 * running_mean/var in place, as ATen's CPU kernel does (these arguments carry no alias
 * annotation in the schema, but the kernel mutates them). */
#include "aten/aten.h"

static tpu_status_t check_channel_vec(tpu_build_t* b, int i, int64_t c, const char* what) {
  if (tpu__arg_is_none(b, i)) return tpu__node_add_absent(b->node);
  const tpu_view_t* v;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, i, &v));
  if (c >= 0 && tpu_view_numel(v) != c)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s should contain %lld elements not %lld", what,
                    (long long)c, (long long)tpu_view_numel(v));
  return tpu__node_add_input(b->node, v);
}

/* c < 0: no size check (eval-mode save_mean/save_invstd are empty). */

/* Stats dtype: f32 when a reduced-precision input meets float parameters (CPU's "mixed
 * type"), otherwise the input's dtype. */
static tpu_dtype_t stats_dtype(tpu_build_t* b, tpu_dtype_t in, int weight_idx) {
  const tpu_arg_t* w = tpu__arg(b, weight_idx);
  if ((in == TPU_DTYPE_BF16 || in == TPU_DTYPE_F16) && w && w->kind == TPU_ARG_TENSOR &&
      w->tensor.dtype == TPU_DTYPE_F32)
    return TPU_DTYPE_F32;
  return in;
}

static tpu_status_t build_bn(tpu_build_t* b) {
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  if (!tpu_dtype_is_floating(x->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "\"batch_norm\" not implemented for '%s'", tpu_dtype_name(x->dtype));
  if (x->ndim < 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected 2D or more input, got %dD", x->ndim);
  int64_t c = x->sizes[1];
  bool training;
  double momentum, eps;
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 5, &training));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 6, &momentum));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 7, &eps));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  TPU_RETURN_IF_ERROR(check_channel_vec(b, 1, c, "weight"));
  TPU_RETURN_IF_ERROR(check_channel_vec(b, 2, c, "bias"));
  TPU_RETURN_IF_ERROR(check_channel_vec(b, 3, c, "running_mean"));
  TPU_RETURN_IF_ERROR(check_channel_vec(b, 4, c, "running_var"));
  if (!training && (tpu__arg_is_none(b, 3) || tpu__arg_is_none(b, 4)))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "running_mean and running_var must be defined in evaluation mode");
  int64_t count = tpu_view_numel(x) / (c ? c : 1);
  if (training && count <= 1)
    return tpu__err(b, TPU_VALUE_ERROR,
                    "Expected more than 1 value per channel when training, got input size [%lld, %lld, ...]",
                    (long long)x->sizes[0], (long long)c);
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_BATCH_NORM;
  n->ia[0] = training;
  n->da[0] = momentum;
  n->da[1] = eps;
  tpu_dtype_t sd = stats_dtype(b, x->dtype, 1);
  int64_t stat_shape[1] = {training ? c : 0};
  tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  tpu__node_add_output(n, sd, 1, stat_shape);
  tpu__node_add_output(n, sd, 1, stat_shape);
  return NULL;
}

static tpu_status_t build_bn_backward(tpu_build_t* b) {
  const tpu_view_t *g, *x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  if (x->ndim < 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected 2D or more input");
  int64_t c = x->sizes[1];
  bool train;
  double eps;
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 7, &train));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 8, &eps));
  const tpu_arg_t* m = tpu__arg(b, 9);
  bool want[3] = {true, true, true};
  if (m && m->kind == TPU_ARG_INTLIST)
    for (int i = 0; i < 3 && i < m->list_len; ++i) want[i] = m->list[i] != 0;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, g));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  static const char* const names[] = {"weight", "running_mean", "running_var", "save_mean", "save_invstd"};
  for (int i = 2; i <= 6; ++i)
    TPU_RETURN_IF_ERROR(check_channel_vec(b, i, (i >= 5 && !train) ? -1 : c, names[i - 2]));
  if (train && (tpu__arg_is_none(b, 5) || tpu__arg_is_none(b, 6)))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "save_mean and save_invstd are required in training mode");
  if (!train && (tpu__arg_is_none(b, 3) || tpu__arg_is_none(b, 4)))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "running_mean and running_var are required in eval mode");
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_BATCH_NORM_BACKWARD;
  n->ia[0] = train;
  n->da[1] = eps;
  tpu_dtype_t wd = tpu__arg_is_none(b, 2) ? x->dtype : tpu__arg(b, 2)->tensor.dtype;
  int64_t cs[1] = {c};
  tpu__node_add_output(n, x->dtype, want[0] ? x->ndim : -1, x->sizes);
  tpu__node_add_output(n, wd, want[1] ? 1 : -1, cs);
  tpu__node_add_output(n, wd, want[2] ? 1 : -1, cs);
  return NULL;
}

const tpu_aten_entry_t tpu__aten_norm[] = {
    {"native_batch_norm", build_bn, NULL},
    {"native_batch_norm_backward", build_bn_backward, NULL},
    {NULL, NULL, NULL},
};
