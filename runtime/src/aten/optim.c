/* The fused optimizer steps behind torch.optim.Adam / AdamW / SGD with fused=True (the
 * default of Hugging Face's Trainer, "adamw_torch_fused"): ATen's _fused_adam_,
 * _fused_adamw_ and _fused_sgd_ are foreach entries (aten/foreach.c) whose element ops
 * are the entries here, one node per parameter that updates the parameter and its
 * states in place, as ATen's CPU kernels do (aten/src/ATen/native/cpu/Fused*Kernel.cpp).
 * The step count, a tensor learning rate, grad_scale and found_inf are inputs read when
 * the node runs: they live on the device, and reading them here would be a host sync.
 *
 * Adam node (kind ADAM_STEP), per parameter:
 *   in:  0 param, 1 grad, 2 exp_avg, 3 exp_avg_sq, 4 max_exp_avg_sq?, 5 step,
 *        6 lr tensor?, 7 grad_scale?, 8 found_inf?
 *   out: 0 param, 1 grad (only with grad_scale: the unscaled gradient is stored back),
 *        2 exp_avg, 3 exp_avg_sq, 4 max_exp_avg_sq (amsgrad) -- the order of the
 *        schema's mutable lists, which the adapter binds position by position
 *   ia:  0 amsgrad, 1 maximize, 2 AdamW (decoupled weight decay)
 *   da:  0 lr (when not a tensor), 1 beta1, 2 beta2, 3 weight_decay, 4 eps
 * SGD node (kind SGD_STEP):
 *   in:  0 param, 1 grad, 2 momentum_buffer?, 3 lr tensor?, 4 grad_scale?, 5 found_inf?
 *   out: 0 param, 1 grad (with grad_scale), 2 momentum_buffer (momentum != 0)
 *   ia:  0 nesterov, 1 maximize, 2 is_first_step
 *   da:  0 lr, 1 weight_decay, 2 momentum, 3 dampening
 * GradScaler's ops (torch.amp): _amp_foreach_non_finite_check_and_unscale_ is a foreach
 * entry too, one AMP_UNSCALE node per gradient:
 *   in:  0 grad, 1 found_inf, 2 inv_scale;  out: 0 grad (times inv_scale), 1 found_inf
 *        (1.0 once any gradient held a NaN or Inf; never cleared)
 * and _amp_update_scale_ one AMP_UPDATE_SCALE node:
 *   in:  0 scale, 1 growth_tracker, 2 found_inf;  out: 0 scale, 1 growth_tracker
 *   da:  0 growth factor, 1 backoff factor;  ia: 0 growth interval
 * Every tensor of one parameter must have the parameter's dtype and shape and be
 * contiguous; other layouts are left to the CPU fallback (UNIMPLEMENTED). */
#include "aten/aten.h"

static bool dense(const tpu_view_t* v) { return tpu__is_contiguous(v->ndim, v->sizes, v->strides); }

/* A per-parameter tensor (argument i): the parameter's dtype and shape, contiguous. */
static tpu_status_t like_param(tpu_build_t* b, int i, const tpu_view_t* p, const char* what,
                               const tpu_view_t** out) {
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, i, out));
  const tpu_view_t* v = *out;
  if (v->dtype != p->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s must have the parameter's dtype %s, got %s", what,
                    tpu__dtype_c10_name(p->dtype), tpu__dtype_c10_name(v->dtype));
  bool same = v->ndim == p->ndim;
  for (int d = 0; same && d < v->ndim; ++d) same = v->sizes[d] == p->sizes[d];
  if (!same) return tpu__err(b, TPU_INVALID_ARGUMENT, "%s must have the parameter's shape", what);
  if (!dense(v)) return tpu__err(b, TPU_UNIMPLEMENTED, "%s is not contiguous (not supported on tpu)", what);
  return tpu__node_add_input(b->node, v);
}

/* A one-element tensor read at run time (step, lr, grad_scale, found_inf), or absent. */
static tpu_status_t run_time_scalar(tpu_build_t* b, int i, bool required, const char* what) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (!required && (!a || a->kind != TPU_ARG_TENSOR)) return tpu__node_add_absent(b->node);
  const tpu_view_t* v;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, i, &v));
  if (tpu_view_numel(v) != 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s must have one element, got %lld", what,
                    (long long)tpu_view_numel(v));
  if (tpu_dtype_is_complex(v->dtype))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s must be real, got %s", what, tpu__dtype_c10_name(v->dtype));
  return tpu__node_add_input(b->node, v);
}

/* The learning rate: a number (da[0], and an absent input) or a one-element tensor input. */
static tpu_status_t learning_rate(tpu_build_t* b, int i) {
  const tpu_arg_t* a = tpu__arg(b, i);
  if (a && a->kind == TPU_ARG_TENSOR) return run_time_scalar(b, i, true, "lr");
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, i, &b->node->da[0]));
  return tpu__node_add_absent(b->node);
}

static tpu_status_t param_arg(tpu_build_t* b, const tpu_view_t** p) {
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, p));
  tpu_dtype_t dt = (*p)->dtype;
  if (dt != TPU_DTYPE_F32 && dt != TPU_DTYPE_F64 && dt != TPU_DTYPE_BF16 && dt != TPU_DTYPE_F16)
    return tpu__err_not_implemented_for(b, b->name, dt);
  if (!dense(*p)) return tpu__err(b, TPU_UNIMPLEMENTED, "the parameter is not contiguous (not supported on tpu)");
  b->node->compute = dt == TPU_DTYPE_F64 ? TPU_DTYPE_F64 : TPU_DTYPE_F32;
  return tpu__node_add_input(b->node, *p);
}

/* Declares output slot `present ? p's shape : absent`. */
static tpu_status_t out_like(tpu_build_t* b, const tpu_view_t* p, bool present) {
  if (tpu__node_add_output(b->node, p->dtype, present ? p->ndim : -1, p->sizes) < 0)
    return tpu_status_make(TPU_INTERNAL, "%s: too many outputs", b->name);
  return NULL;
}

static tpu_status_t build_adam(tpu_build_t* b) {
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_ADAM_STEP;
  n->flags |= TPU_NODE_STREAMING; /* reads and writes each operand once */
  const tpu_view_t *p, *t;
  bool amsgrad, maximize;
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 11, &amsgrad));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 12, &maximize));
  TPU_RETURN_IF_ERROR(param_arg(b, &p));
  TPU_RETURN_IF_ERROR(like_param(b, 1, p, "grad", &t));
  TPU_RETURN_IF_ERROR(like_param(b, 2, p, "exp_avg", &t));
  TPU_RETURN_IF_ERROR(like_param(b, 3, p, "exp_avg_sq", &t));
  if (amsgrad) TPU_RETURN_IF_ERROR(like_param(b, 4, p, "max_exp_avg_sq", &t));
  else TPU_RETURN_IF_ERROR(tpu__node_add_absent(n));
  TPU_RETURN_IF_ERROR(run_time_scalar(b, 5, true, "state_step"));
  TPU_RETURN_IF_ERROR(learning_rate(b, 6));
  TPU_RETURN_IF_ERROR(run_time_scalar(b, 13, false, "grad_scale"));
  TPU_RETURN_IF_ERROR(run_time_scalar(b, 14, false, "found_inf"));
  for (int i = 7; i <= 10; ++i) TPU_RETURN_IF_ERROR(tpu__arg_double(b, i, &n->da[i - 6]));
  n->ia[0] = amsgrad;
  n->ia[1] = maximize;
  n->ia[2] = b->data != NULL; /* AdamW */
  bool scaled = n->in[7].value != NULL;
  TPU_RETURN_IF_ERROR(out_like(b, p, true));
  TPU_RETURN_IF_ERROR(out_like(b, p, scaled));
  TPU_RETURN_IF_ERROR(out_like(b, p, true));
  TPU_RETURN_IF_ERROR(out_like(b, p, true));
  return out_like(b, p, amsgrad);
}

static tpu_status_t build_sgd(tpu_build_t* b) {
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_SGD_STEP;
  n->flags |= TPU_NODE_STREAMING;
  const tpu_view_t *p, *t;
  bool nesterov, maximize, first;
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 3, &n->da[1]));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 4, &n->da[2]));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 6, &n->da[3]));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 7, &nesterov));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 8, &maximize));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 9, &first));
  bool momentum = n->da[2] != 0;
  TPU_RETURN_IF_ERROR(param_arg(b, &p));
  TPU_RETURN_IF_ERROR(like_param(b, 1, p, "grad", &t));
  if (momentum) TPU_RETURN_IF_ERROR(like_param(b, 2, p, "momentum_buffer", &t));
  else TPU_RETURN_IF_ERROR(tpu__node_add_absent(n));
  TPU_RETURN_IF_ERROR(learning_rate(b, 5));
  TPU_RETURN_IF_ERROR(run_time_scalar(b, 10, false, "grad_scale"));
  TPU_RETURN_IF_ERROR(run_time_scalar(b, 11, false, "found_inf"));
  n->ia[0] = nesterov;
  n->ia[1] = maximize;
  n->ia[2] = first;
  bool scaled = n->in[4].value != NULL;
  TPU_RETURN_IF_ERROR(out_like(b, p, true));
  TPU_RETURN_IF_ERROR(out_like(b, p, scaled));
  return out_like(b, p, momentum);
}

/* A one-element float32 tensor that the op reads or writes (found_inf, scale). */
static tpu_status_t f32_scalar(tpu_build_t* b, int i, const char* what, const tpu_view_t** out) {
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, i, out));
  if (tpu_view_numel(*out) != 1) return tpu__err(b, TPU_INVALID_ARGUMENT, "%s must be a 1-element tensor.", what);
  if ((*out)->dtype != TPU_DTYPE_F32) return tpu__err(b, TPU_INVALID_ARGUMENT, "%s must be a float tensor.", what);
  return tpu__node_add_input(b->node, *out);
}

static tpu_status_t build_amp_unscale(tpu_build_t* b) {
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_AMP_UNSCALE;
  n->flags |= TPU_NODE_STREAMING;
  const tpu_view_t *g, *found, *inv;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  if (g->dtype != TPU_DTYPE_F32 && g->dtype != TPU_DTYPE_F64 && g->dtype != TPU_DTYPE_BF16 && g->dtype != TPU_DTYPE_F16)
    return tpu__err_not_implemented_for(b, "_amp_foreach_non_finite_check_and_unscale_cpu", g->dtype);
  n->compute = g->dtype == TPU_DTYPE_F64 ? TPU_DTYPE_F64 : TPU_DTYPE_F32;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  TPU_RETURN_IF_ERROR(f32_scalar(b, 1, "found_inf", &found));
  TPU_RETURN_IF_ERROR(f32_scalar(b, 2, "inv_scale", &inv));
  if (tpu__node_add_output(n, g->dtype, g->ndim, g->sizes) < 0 ||
      tpu__node_add_output(n, found->dtype, found->ndim, found->sizes) < 0)
    return tpu_status_make(TPU_INTERNAL, "%s: too many outputs", b->name);
  return NULL;
}

static tpu_status_t build_amp_update_scale(tpu_build_t* b) {
  tpu_node_t* n = b->node;
  n->kind = TPU_KIND_AMP_UPDATE_SCALE;
  const tpu_view_t *scale, *tracker, *found;
  TPU_RETURN_IF_ERROR(f32_scalar(b, 0, "current_scale", &scale));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &tracker));
  if (tpu_view_numel(tracker) != 1 || tracker->dtype != TPU_DTYPE_I32)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "growth_tracker must be a 1-element int tensor.");
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, tracker));
  TPU_RETURN_IF_ERROR(f32_scalar(b, 2, "found_inf", &found));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 3, &n->da[0]));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 4, &n->da[1]));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 5, &n->ia[0]));
  if (tpu__node_add_output(n, scale->dtype, scale->ndim, scale->sizes) < 0 ||
      tpu__node_add_output(n, tracker->dtype, tracker->ndim, tracker->sizes) < 0)
    return tpu_status_make(TPU_INTERNAL, "%s: too many outputs", b->name);
  return NULL;
}

static const int k_adamw = 1;

const tpu_aten_entry_t tpu__aten_optim[] = {
    /* element ops of the foreach entries _fused_adam_ / _fused_adamw_ / _fused_sgd_: not
     * ATen names, so the adapter registers nothing for them */
    {"tpu::adam_step", build_adam, NULL},
    {"tpu::adamw_step", build_adam, &k_adamw},
    {"tpu::sgd_step", build_sgd, NULL},
    {"tpu::amp_unscale", build_amp_unscale, NULL},
    {"_amp_update_scale_", build_amp_update_scale, NULL},
    {NULL, NULL, NULL},
};
