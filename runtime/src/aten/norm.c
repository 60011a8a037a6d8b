/* ATen ops of the norm family: batch norm, weight norm and group norm, each with its
 * backward. Node layouts are documented in host/norm.c.
 *
 * Batch norm inputs (in order): input, weight?, bias?, running_mean?, running_var?
 * (backward: grad, input, weight?, running_mean?, running_var?, save_mean?, save_invstd?).
 * ia[0] = training, da[0] = momentum, da[1] = eps. In training mode the forward kernel
 * also updates running_mean/var in place, as ATen's CPU kernel does (these arguments
 * carry no alias annotation in the schema, but the kernel mutates them). */
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

/* native_batch_norm and _native_batch_norm_legit (what torch.compile's graphs call) share
 * one argument layout: input, weight?, bias?, running_mean, running_var, training,
 * momentum, eps. The legit op's no_stats overload has no running statistics (training
 * moves to argument 3). */
static tpu_status_t build_bn_at(tpu_build_t* b, bool has_stats) {
  const int at = has_stats ? 5 : 3; /* training, momentum, eps */
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  if (!tpu_dtype_is_floating(x->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "\"batch_norm\" not implemented for '%s'", tpu_dtype_name(x->dtype));
  if (x->ndim < 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected 2D or more input, got %dD", x->ndim);
  int64_t c = x->sizes[1];
  bool training;
  double momentum, eps;
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, at, &training));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, at + 1, &momentum));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, at + 2, &eps));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  TPU_RETURN_IF_ERROR(check_channel_vec(b, 1, c, "weight"));
  TPU_RETURN_IF_ERROR(check_channel_vec(b, 2, c, "bias"));
  bool stats = has_stats && !tpu__arg_is_none(b, 3) && !tpu__arg_is_none(b, 4);
  if (has_stats) {
    TPU_RETURN_IF_ERROR(check_channel_vec(b, 3, c, "running_mean"));
    TPU_RETURN_IF_ERROR(check_channel_vec(b, 4, c, "running_var"));
  } else {
    TPU_RETURN_IF_ERROR(tpu__node_add_absent(b->node));
    TPU_RETURN_IF_ERROR(tpu__node_add_absent(b->node));
  }
  if (!training && !stats)
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
static tpu_status_t build_bn(tpu_build_t* b) { return build_bn_at(b, true); }
static tpu_status_t build_bn_no_stats(tpu_build_t* b) { return build_bn_at(b, false); }

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

/* ---- shared helpers ---------------------------------------------------------------- */

static bool is_reduced_float(tpu_dtype_t t) { return t == TPU_DTYPE_BF16 || t == TPU_DTYPE_F16; }

/* ATen's opmath type: reduced floats accumulate (and keep statistics) in float32. */
static tpu_dtype_t opmath(tpu_dtype_t t) { return is_reduced_float(t) ? TPU_DTYPE_F32 : t; }

static tpu_status_t expect_dtype(tpu_build_t* b, tpu_dtype_t expected, tpu_dtype_t found) {
  if (expected == found) return NULL;
  return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", tpu__dtype_c10_name(expected),
                  tpu__dtype_c10_name(found));
}

static bool same_shape(const tpu_view_t* a, const tpu_view_t* c) {
  if (a->ndim != c->ndim) return false;
  for (int i = 0; i < a->ndim; ++i) if (a->sizes[i] != c->sizes[i]) return false;
  return true;
}

/* ---- weight norm -------------------------------------------------------------------- */

/* Shape and dtype rules shared by _weight_norm_interface and its backward: v and g of
 * one floating dtype, 0 <= dim < v.dim(), g holding v.size(dim) elements. ATen's fused CPU
 * kernel takes only dim 0 and the last dim (the composite _weight_norm never passes
 * another); the tpu kernel normalizes over all dims but `dim` for any dim. */
static tpu_status_t weight_norm_check(tpu_build_t* b, const tpu_view_t* v, const tpu_view_t* g, int64_t dim,
                                      const char* kernel) {
  if (!tpu_dtype_is_floating(v->dtype)) return tpu__err_not_implemented_for(b, kernel, v->dtype);
  TPU_RETURN_IF_ERROR(expect_dtype(b, v->dtype, g->dtype));
  if (dim < 0 || dim >= v->ndim)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "weight norm dim %lld is out of range for a %d-dimensional v", (long long)dim, v->ndim);
  if (tpu_view_numel(g) != v->sizes[dim])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "g must hold v.size(%lld) = %lld elements, but has %lld", (long long)dim,
                    (long long)v->sizes[dim], (long long)tpu_view_numel(g));
  return NULL;
}

/* _weight_norm_interface(v, g, dim=0) -> (w, norms): w = v * g / ||v|| with the norm over
 * every dim but `dim`; norms has g's shape, in float32 for a reduced-float g. */
static tpu_status_t build_weight_norm(tpu_build_t* b) {
  const tpu_view_t *v, *g;
  int64_t dim;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &v));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 2, 0, &dim));
  TPU_RETURN_IF_ERROR(weight_norm_check(b, v, g, dim, "weight_norm_kernel"));
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, v));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  n->kind = TPU_KIND_WEIGHT_NORM;
  n->ia[0] = dim;
  tpu__node_add_output(n, v->dtype, v->ndim, v->sizes);
  tpu__node_add_output(n, opmath(g->dtype), g->ndim, g->sizes);
  return NULL;
}

/* _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim)
 * -> (grad_v, grad_g) */
static tpu_status_t build_weight_norm_backward(tpu_build_t* b) {
  const tpu_view_t *gw, *v, *g, *norms;
  int64_t dim;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &gw));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &v));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 3, &norms));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 4, &dim));
  TPU_RETURN_IF_ERROR(weight_norm_check(b, v, g, dim, "weight_norm_backward_kernel"));
  TPU_RETURN_IF_ERROR(expect_dtype(b, v->dtype, gw->dtype));
  TPU_RETURN_IF_ERROR(expect_dtype(b, opmath(v->dtype), norms->dtype));
  if (!same_shape(gw, v)) return tpu__err(b, TPU_INVALID_ARGUMENT, "grad_w must have the shape of saved_v");
  if (tpu_view_numel(norms) != v->sizes[dim])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "saved_norms must hold %lld elements, but has %lld",
                    (long long)v->sizes[dim], (long long)tpu_view_numel(norms));
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, gw));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, v));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, norms));
  n->kind = TPU_KIND_WEIGHT_NORM_BACKWARD;
  n->ia[0] = dim;
  tpu__node_add_output(n, v->dtype, v->ndim, v->sizes);
  tpu__node_add_output(n, g->dtype, g->ndim, g->sizes);
  return NULL;
}

/* ---- group norm --------------------------------------------------------------------- */

static tpu_status_t gn_param_check(tpu_build_t* b, const tpu_view_t* x, const tpu_view_t* p, int64_t c,
                                   const char* what, const tpu_view_t* shown) {
  if (!p || (p->ndim == 1 && p->sizes[0] == c)) return NULL;
  char s1[256], s2[256];
  tpu__fmt_shape(s1, sizeof s1, shown ? shown->ndim : 0, shown ? shown->sizes : NULL);
  tpu__fmt_shape(s2, sizeof s2, x->ndim, x->sizes);
  return tpu__err(b, TPU_INVALID_ARGUMENT,
                  "Expected %s to be a vector of size equal to the number of channels in input, but got %s "
                  "of shape %s and input of shape %s", what, what, s1, s2);
}

/* Reads N, C, HxW, group (schema arguments first..first+3) and checks them. */
static tpu_status_t gn_dims(tpu_build_t* b, int first, const tpu_view_t* x, int64_t d[4]) {
  for (int i = 0; i < 4; ++i) TPU_RETURN_IF_ERROR(tpu__arg_int(b, first + i, &d[i]));
  if (d[3] <= 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected num groups to be greater than 0, got %lld", (long long)d[3]);
  if (d[1] % d[3] != 0) {
    char s[256];
    tpu__fmt_shape(s, sizeof s, x->ndim, x->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected number of channels in input to be divisible by num_groups, but got input of "
                    "shape %s and num_groups=%lld", s, (long long)d[3]);
  }
  if (d[0] < 0 || d[1] < 0 || d[2] < 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "N, C and HxW must be non-negative");
  return NULL;
}

/* native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean, rstd).
 * The input is read as (N, C, HxW) in its logical (row-major) order, whatever its memory
 * layout (channels-last included); mean and rstd are (N, group), float32 when a
 * reduced-float input meets float32 parameters, else the input's dtype. */
static tpu_status_t build_group_norm(tpu_build_t* b) {
  const tpu_view_t *x, *w, *bias;
  int64_t d[4];
  double eps;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 1, &w));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 2, &bias));
  TPU_RETURN_IF_ERROR(gn_dims(b, 3, x, d));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 7, &eps));
  TPU_RETURN_IF_ERROR(gn_param_check(b, x, w, d[1], "weight", w));
  /* ATen prints the weight's shape in the bias message too */
  TPU_RETURN_IF_ERROR(gn_param_check(b, x, bias, d[1], "bias", w));
  bool mixed;
  TPU_RETURN_IF_ERROR(tpu__norm_params_mixed(b, x->dtype, w, bias, &mixed));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, "GroupNormKernelImpl", x->dtype);
  if (d[1] == 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected number of channels to be greater than 0, got 0");
  if (d[2] == 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected HxW to be greater than 0, got 0");
  if (tpu_view_numel(x) != 0 && tpu_view_numel(x) != d[0] * d[1] * d[2])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected X.numel() == N * C * HxW to be true, but got false.");
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, w));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, bias));
  n->kind = TPU_KIND_GROUP_NORM;
  for (int i = 0; i < 4; ++i) n->ia[i] = d[i];
  n->da[0] = eps;
  int64_t stat[2] = {d[0], d[3]};
  tpu_dtype_t sdt = mixed ? TPU_DTYPE_F32 : x->dtype;
  tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  tpu__node_add_output(n, sdt, 2, stat);
  tpu__node_add_output(n, sdt, 2, stat);
  return NULL;
}

/* native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW, group,
 * output_mask) -> (grad_input, grad_weight, grad_bias); unrequested outputs are absent. */
static tpu_status_t build_group_norm_backward(tpu_build_t* b) {
  const tpu_view_t *dy, *x, *mean, *rstd, *w;
  int64_t d[4];
  bool mask[3];
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &dy));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &mean));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 3, &rstd));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 4, &w));
  TPU_RETURN_IF_ERROR(gn_dims(b, 5, x, d));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_mask(b, 9, 3, mask));
  if (x->dtype != dy->dtype) return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected scalar types of X and dY are same.");
  bool mixed;
  TPU_RETURN_IF_ERROR(tpu__norm_params_mixed(b, x->dtype, mean, rstd, &mixed));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, "GroupNormBackwardKernelImpl", x->dtype);
  int64_t numel = tpu_view_numel(x);
  if (numel != 0) {
    if (numel != d[0] * d[1] * d[2] || tpu_view_numel(dy) != numel)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected X.numel() == N * C * HxW and dY.numel() == N * C * HxW");
    if (tpu_view_numel(mean) != d[0] * d[3] || tpu_view_numel(rstd) != d[0] * d[3])
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected mean.numel() == N * group and rstd.numel() == N * group");
    if (w && tpu_view_numel(w) != d[1])
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected gamma.numel() == C");
  }
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, dy));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, mean));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, rstd));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, w));
  n->kind = TPU_KIND_GROUP_NORM_BACKWARD;
  for (int i = 0; i < 4; ++i) n->ia[i] = d[i];
  tpu_dtype_t pdt = w ? w->dtype : x->dtype;
  int64_t cs[1] = {d[1]};
  tpu__node_add_output(n, x->dtype, mask[0] ? x->ndim : -1, x->sizes);
  tpu__node_add_output(n, pdt, mask[1] ? 1 : -1, cs);
  tpu__node_add_output(n, pdt, mask[2] ? 1 : -1, cs);
  return NULL;
}

const tpu_aten_entry_t tpu__aten_norm[] = {
    {"native_batch_norm", build_bn, NULL},
    {"_native_batch_norm_legit", build_bn, NULL},
    {"_native_batch_norm_legit.out", build_bn, NULL},
    {"_native_batch_norm_legit.no_stats", build_bn_no_stats, NULL},
    {"_native_batch_norm_legit.no_stats_out", build_bn_no_stats, NULL},
    {"native_batch_norm_backward", build_bn_backward, NULL},
    {"_weight_norm_interface", build_weight_norm, NULL},
    {"_weight_norm_interface.out", build_weight_norm, NULL},
    {"_weight_norm_interface_backward", build_weight_norm_backward, NULL},
    {"_weight_norm_interface_backward.out", build_weight_norm_backward, NULL},
    {"native_group_norm", build_group_norm, NULL},
    {"native_group_norm.out", build_group_norm, NULL},
    {"native_group_norm_backward", build_group_norm_backward, NULL},
    {"native_group_norm_backward.out", build_group_norm_backward, NULL},
    {NULL, NULL, NULL},
};
