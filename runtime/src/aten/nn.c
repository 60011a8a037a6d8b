/* ATen ops of the nn family: layer norm, embedding, embedding_bag, nll loss, fused
 * attention, the pointwise losses, reflection/replication padding and im2col/col2im.
 * Builders check arguments the way ATen's CPU kernels do, so the same Python exception
 * (and nearly the same text) comes back. Node layouts of the padding, window and
 * embedding_bag kinds are in host/nn.c. */
#include <math.h>
#include <stdio.h>

#include "aten/aten.h"

/* c10's short ScalarType names, used by ATen's dispatch-macro messages ("... for 'Long'"). */
static int64_t numel_of(int nd, const int64_t* s) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= s[i];
  return n;
}

static bool same_shape(int na, const int64_t* a, int nb, const int64_t* c) {
  if (na != nb) return false;
  for (int i = 0; i < na; ++i) if (a[i] != c[i]) return false;
  return true;
}

/* ---- layer norm ------------------------------------------------------------------- */

/* Checks normalized_shape against input/weight/bias; returns the first normalized axis. */
static tpu_status_t layer_norm_shapes(tpu_build_t* b, const tpu_view_t* x, const int64_t* ns, int k,
                                      const tpu_view_t* w, const tpu_view_t* bias, int* axis) {
  char s1[256], s2[256];
  tpu__fmt_shape(s2, sizeof s2, k, ns);
  if (k < 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                    "least one element, but got normalized_shape = %s", s2);
  if (w && !same_shape(w->ndim, w->sizes, k, ns)) {
    tpu__fmt_shape(s1, sizeof s1, w->ndim, w->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected weight to be of same shape as normalized_shape, but got weight of "
                    "shape %s and normalized_shape = %s", s1, s2);
  }
  if (bias && !same_shape(bias->ndim, bias->sizes, k, ns)) {
    tpu__fmt_shape(s1, sizeof s1, bias->ndim, bias->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected bias to be of same shape as normalized_shape, but got bias of "
                    "shape %s and normalized_shape = %s", s1, s2);
  }
  bool ok = x->ndim >= k;
  for (int i = 0; ok && i < k; ++i) ok = x->sizes[x->ndim - k + i] == ns[i];
  if (!ok) {
    char s3[256];
    tpu__fmt_shape(s3, sizeof s3, k, ns);
    s3[strlen(s3) - 1] = 0; /* "[*, 3]" reuses the list without its brackets */
    tpu__fmt_shape(s1, sizeof s1, x->ndim, x->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Given normalized_shape=%s, expected input with shape [*, %s], but got input of size%s",
                    s2, s3 + 1, s1);
  }
  *axis = x->ndim - k;
  return NULL;
}

/* native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd) */
static tpu_status_t build_layer_norm(tpu_build_t* b) {
  const tpu_view_t *x, *w, *bias;
  const int64_t* ns;
  int k, axis;
  double eps;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &ns, &k));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 2, &w));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 3, &bias));
  TPU_RETURN_IF_ERROR(tpu__arg_double(b, 4, &eps));
  TPU_RETURN_IF_ERROR(layer_norm_shapes(b, x, ns, k, w, bias, &axis));
  bool mixed;
  TPU_RETURN_IF_ERROR(tpu__norm_params_mixed(b, x->dtype, w, bias, &mixed));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, "LayerNormKernelImpl", x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, w));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, bias));
  n->kind = TPU_KIND_LAYER_NORM;
  n->compute = tpu__compute_dtype(x->dtype);
  n->ia[0] = axis;
  n->da[0] = eps;
  int64_t stat[TPU_MAX_DIMS];
  for (int i = 0; i < x->ndim; ++i) stat[i] = i < axis ? x->sizes[i] : 1;
  tpu_dtype_t sdt = mixed ? TPU_DTYPE_F32 : x->dtype;
  tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  tpu__node_add_output(n, sdt, x->ndim, stat);
  tpu__node_add_output(n, sdt, x->ndim, stat);
  return NULL;
}

/* native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
 * output_mask) -> (grad_input, grad_weight, grad_bias). An output whose mask bit is false
 * is absent (an undefined tensor), as on CPU. */
static tpu_status_t build_layer_norm_backward(tpu_build_t* b) {
  const tpu_view_t *dy, *x, *mean, *rstd, *w, *bias;
  const int64_t* ns;
  int k, axis;
  bool mask[3];
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &dy));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 2, &ns, &k));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 3, &mean));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 4, &rstd));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 5, &w));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 6, &bias));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_mask(b, 7, 3, mask));
  TPU_RETURN_IF_ERROR(layer_norm_shapes(b, x, ns, k, w, bias, &axis));
  bool mixed;
  TPU_RETURN_IF_ERROR(tpu__norm_params_mixed(b, x->dtype, w, bias, &mixed));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, "LayerNormBackwardKernelImpl", x->dtype);
  if (!same_shape(dy->ndim, dy->sizes, x->ndim, x->sizes))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "grad_out must have the shape of input");
  int64_t m = numel_of(axis, x->sizes);
  if (tpu_view_numel(mean) != m || tpu_view_numel(rstd) != m)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "mean and rstd must have %lld elements", (long long)m);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, dy));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, mean));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, rstd));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, w));
  n->kind = TPU_KIND_LAYER_NORM_BACKWARD;
  n->compute = tpu__compute_dtype(x->dtype);
  n->ia[0] = axis;
  for (int i = 0; i < 3; ++i) n->ia[1 + i] = mask[i];
  if (mask[0]) tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  else tpu__node_add_output(n, x->dtype, -1, NULL);
  const tpu_view_t* params[2] = {w, bias};
  for (int i = 0; i < 2; ++i) {
    tpu_dtype_t dt = params[i] ? params[i]->dtype : x->dtype;
    if (mask[1 + i]) tpu__node_add_output(n, dt, k, ns);
    else tpu__node_add_output(n, dt, -1, NULL);
  }
  return NULL;
}

/* ---- embedding -------------------------------------------------------------------- */

static tpu_status_t check_indices(tpu_build_t* b, const tpu_view_t* idx, int argno, const char* fn) {
  if (idx->dtype == TPU_DTYPE_I64 || idx->dtype == TPU_DTYPE_I32) return NULL;
  return tpu__err(b, TPU_INVALID_ARGUMENT,
                  "Expected tensor for argument #%d 'indices' to have one of the following scalar "
                  "types: Long, Int; but got torch.%sTensor instead (while checking arguments for %s)",
                  argno, tpu__dtype_c10_name(idx->dtype), fn);
}

/* embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse): a row gather. The
 * last three only matter for the backward. */
static tpu_status_t build_embedding(tpu_build_t* b) {
  const tpu_view_t *w, *idx;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &w));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &idx));
  if (w->ndim != 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "'weight' must be 2-D");
  TPU_RETURN_IF_ERROR(check_indices(b, idx, 1, "embedding"));
  if (idx->ndim + 1 > TPU_MAX_DIMS) return tpu__err(b, TPU_INVALID_ARGUMENT, "too many dimensions");
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, w));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, idx));
  n->kind = TPU_KIND_EMBEDDING;
  n->compute = w->dtype;
  int64_t shape[TPU_MAX_DIMS];
  for (int i = 0; i < idx->ndim; ++i) shape[i] = idx->sizes[i];
  shape[idx->ndim] = w->sizes[1];
  tpu__node_add_output(n, w->dtype, idx->ndim + 1, shape);
  return NULL;
}

/* embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq) */
static tpu_status_t build_embedding_backward(tpu_build_t* b) {
  const tpu_view_t *g, *idx;
  int64_t nw, pad;
  bool scale;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &idx));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 2, &nw));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 3, &pad));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 4, &scale));
  TPU_RETURN_IF_ERROR(check_indices(b, idx, 2, "embedding_backward"));
  if (nw < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "num_weights must be non-negative, got %lld", (long long)nw);
  int64_t d = g->ndim ? g->sizes[g->ndim - 1] : 1;
  int64_t ni = tpu_view_numel(idx), ng = tpu_view_numel(g);
  if (ni * d != ng)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "shape '[%lld, %lld]' is invalid for input of size %lld",
                    (long long)ni, (long long)d, (long long)ng);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, idx));
  n->kind = TPU_KIND_EMBEDDING_BACKWARD;
  n->compute = tpu__compute_dtype(g->dtype);
  n->ia[0] = nw;
  n->ia[1] = pad;
  n->ia[2] = scale;
  int64_t shape[2] = {nw, d};
  tpu__node_add_output(n, g->dtype, 2, shape);
  return NULL;
}

/* ---- embedding_bag ------------------------------------------------------------------ */

static const char* torch_type(tpu_dtype_t d) { return tpu__dtype_c10_name(d); }

static tpu_status_t check_types_for_bag(tpu_build_t* b, const tpu_view_t* t, const char* what, bool floating) {
  bool ok = floating ? tpu_dtype_is_floating(t->dtype) : (t->dtype == TPU_DTYPE_I64 || t->dtype == TPU_DTYPE_I32);
  if (ok) return NULL;
  return tpu__err(b, TPU_INVALID_ARGUMENT,
                  "Expected tensor for argument #1 '%s' to have one of the following scalar types: %s; but got "
                  "torch.%sTensor instead (while checking arguments for embedding_bag)", what,
                  floating ? "Half, BFloat16, Float, Double" : "Long, Int", torch_type(t->dtype));
}

/* _embedding_bag / _embedding_bag_forward_only(weight, indices, offsets,
 * scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset, padding_idx)
 * -> (output, offset2bag, bag_size, max_indices). Shape checks here in CPU's order; the
 * checks that read offsets and indices (offsets[0] == 0, offsets[-1] <= len, offsets
 * non-decreasing, indices in range) are the kernel's, reported at the next sync. The
 * auxiliary outputs have CPU's shapes and contents (host/nn.c), so either device's
 * backward can consume them. 2-D indices (which F.embedding_bag flattens before calling)
 * go to the CPU fallback. */
static const int bag_forward_only = 1;
static tpu_status_t build_embedding_bag(tpu_build_t* b) {
  bool fwd_only = b->data != NULL;
  const tpu_view_t *w, *idx, *off, *psw;
  bool scale, sparse, ilo;
  int64_t mode, pad;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &w));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &idx));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &off));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 3, false, &scale));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 4, 0, &mode));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 5, false, &sparse));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 6, &psw));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 7, false, &ilo));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 8, -1, &pad));
  (void)scale; (void)sparse; /* backward only */
  if (idx->ndim != 1 && idx->ndim != 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "input has to be a 1D or 2D Tensor, but got Tensor of dimension %d",
                    idx->ndim);
  if (idx->ndim == 2)
    return tpu__err(b, TPU_UNIMPLEMENTED, "2-D indices (F.embedding_bag flattens them) run on the CPU fallback");
  if (off->ndim != 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "offsets has to be a 1D Tensor, but got Tensor of dimension %d",
                    off->ndim);
  if (w->ndim != 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "weight has to be a 2D Tensor, but got Tensor of dimension %d", w->ndim);
  TPU_RETURN_IF_ERROR(check_types_for_bag(b, idx, "indices", false));
  TPU_RETURN_IF_ERROR(check_types_for_bag(b, off, "offsets", false));
  TPU_RETURN_IF_ERROR(check_types_for_bag(b, w, "weight", true));
  if (mode < 0 || mode > 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "`mode` must be sum, mean, or max.");
  int64_t len = idx->sizes[0], nof = off->sizes[0], D = w->sizes[1];
  if (ilo && nof < 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "include_last_offset: number of offset should be at least 1");
  if (psw) {
    if (psw->dtype != w->dtype)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 "
                      "'per_sample_weights'; but type torch.%sTensor does not equal torch.%sTensor (while checking "
                      "arguments for embedding_bag)", torch_type(w->dtype), torch_type(psw->dtype));
    if (mode != 0)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "embedding_bag: per_sample_weights only supported with mode='sum'");
    if (psw->ndim != 1)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected per_sample_weights.value().dim() == 1 to be true, but got "
                      "false. (per_sample_weights has %d dims)", psw->ndim);
    if (tpu_view_numel(psw) != len)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected per_sample_weights.value().numel() == indices.numel() to be "
                      "true, but got false. (%lld per_sample_weights for %lld indices)",
                      (long long)tpu_view_numel(psw), (long long)len);
  }
  int64_t B = ilo ? nof - 1 : nof;
  /* CPU skips offset2bag on its fast sum path (contiguous rows of a float type, no
   * padding_idx); its backwards rebuild it from offsets. */
  bool fast_sum = mode == 0 && pad < 0 && w->strides[1] == 1 &&
                  (w->dtype == TPU_DTYPE_F32 || w->dtype == TPU_DTYPE_F16 || w->dtype == TPU_DTYPE_BF16) &&
                  (!psw || psw->strides[0] == 1 || psw->sizes[0] <= 1);
  tpu_dtype_t aux = idx->dtype == TPU_DTYPE_I32 && off->dtype == TPU_DTYPE_I32 ? TPU_DTYPE_I32 : TPU_DTYPE_I64;
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, w));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, idx));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, off));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, psw));
  n->kind = TPU_KIND_EMBEDDING_BAG;
  n->compute = tpu__compute_dtype(w->dtype);
  n->ia[0] = mode;
  n->ia[1] = pad;
  n->ia[2] = ilo;
  int64_t shape[2] = {B, D}, o2b = fast_sum ? 0 : len;
  /* _embedding_bag_forward_only's sum mode sizes bag_size / max_indices by the offsets */
  int64_t nbs = fwd_only && mode == 0 && ilo ? nof : B;
  tpu__node_add_output(n, w->dtype, 2, shape);
  tpu__node_add_output(n, aux, 1, &o2b);
  tpu__node_add_output(n, aux, 1, &nbs);
  if (mode == 2) tpu__node_add_output(n, aux, 2, shape);
  else tpu__node_add_output(n, aux, 1, &nbs);
  return NULL;
}

static tpu_status_t check_bag_index_args(tpu_build_t* b, const tpu_view_t* g, const tpu_view_t* idx,
                                         const tpu_view_t* o2b) {
  if (g->ndim != 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "embedding_bag_backward: expected grad to be 2-D, but got %d-D", g->ndim);
  if (idx->ndim != 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "embedding_bag_backward: expected indices to be 1-D, but got %d-D",
                    idx->ndim);
  TPU_RETURN_IF_ERROR(check_types_for_bag(b, idx, "indices", false));
  TPU_RETURN_IF_ERROR(check_types_for_bag(b, o2b, "offset2bag", false));
  if (tpu_view_numel(o2b) != 0 && tpu_view_numel(o2b) != idx->sizes[0])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "embedding_bag_backward: offset2bag has %lld elements for %lld indices",
                    (long long)tpu_view_numel(o2b), (long long)idx->sizes[0]);
  return NULL;
}

/* _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
 * num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx) and
 * _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
 * num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx): the dense
 * weight gradient. A sparse gradient runs on the CPU fallback. */
static const int bag_dense = 1;
static tpu_status_t build_embedding_bag_backward(tpu_build_t* b) {
  bool dense = b->data != NULL;
  int k = dense ? -1 : 0; /* argument shift: the dense form has no offsets and no sparse */
  const tpu_view_t *g, *idx, *off = NULL, *o2b, *bs, *mi, *psw;
  int64_t nw, mode, pad;
  bool scale, sparse = false;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &idx));
  if (!dense) TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &off));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 3 + k, &o2b));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 4 + k, &bs));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 5 + k, &mi));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 6 + k, &nw));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 7 + k, &scale));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 8 + k, &mode));
  if (!dense) TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 9, &sparse));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, dense ? 8 : 10, &psw));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, dense ? 9 : 11, -1, &pad));
  if (sparse) return tpu__err(b, TPU_UNIMPLEMENTED, "sparse embedding_bag gradients run on the CPU fallback");
  TPU_RETURN_IF_ERROR(check_bag_index_args(b, g, idx, o2b));
  if (mode < 0 || mode > 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "Unknown mode for embedding_bag_backward with "
                                            "dense gradients: %lld", (long long)mode);
  if (!tpu_dtype_is_floating(g->dtype)) return tpu__err_not_implemented_for(b, "embedding_bag_backward", g->dtype);
  if (nw < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "num_weights must be non-negative, got %lld", (long long)nw);
  int64_t len = idx->sizes[0], B = g->sizes[0], D = g->sizes[1];
  if (tpu_view_numel(o2b) == 0 && len != 0 && !off)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "embedding_bag_backward: offset2bag is empty and no offsets were given");
  if (off && off->ndim != 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "offsets has to be a 1D Tensor, but got Tensor of dimension %d",
                    off->ndim);
  if (mode != 0 && tpu_view_numel(bs) < B)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "embedding_bag_backward: bag_size has %lld elements for %lld bags",
                    (long long)tpu_view_numel(bs), (long long)B);
  if (mode == 2 && (mi->ndim != 2 || mi->sizes[0] != B || mi->sizes[1] != D))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "embedding_bag_backward: max_indices must have grad's shape [%lld, %lld]",
                    (long long)B, (long long)D);
  if (psw && tpu_view_numel(psw) != len)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "embedding_bag_backward: per_sample_weights has %lld elements for %lld "
                    "indices", (long long)tpu_view_numel(psw), (long long)len);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, idx));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, o2b));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, bs));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, mi));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, psw));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, off));
  n->kind = TPU_KIND_EMBEDDING_BAG_BACKWARD;
  n->compute = tpu__compute_dtype(g->dtype);
  n->ia[0] = nw;
  n->ia[1] = scale;
  n->ia[2] = mode;
  n->ia[3] = pad;
  int64_t shape[2] = {nw, D};
  tpu__node_add_output(n, g->dtype, 2, shape);
  return NULL;
}

/* _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag,
 * mode, padding_idx): per index, grad's bag row dotted with the weight row. */
static tpu_status_t build_embedding_bag_psw_backward(tpu_build_t* b) {
  const tpu_view_t *g, *w, *idx, *off, *o2b;
  int64_t mode, pad;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &g));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &w));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &idx));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 3, &off));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 4, &o2b));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 5, &mode));
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, 6, -1, &pad));
  if (mode != 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "embedding_bag_backward: per_sample_weights only supported for mode='sum'");
  TPU_RETURN_IF_ERROR(check_bag_index_args(b, g, idx, o2b));
  if (w->ndim != 2 || w->sizes[1] != g->sizes[1])
    return tpu__err(b, TPU_INVALID_ARGUMENT, "embedding_bag_backward: weight must be 2-D with grad's %lld columns",
                    (long long)g->sizes[1]);
  if (off->ndim != 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "offsets has to be a 1D Tensor, but got Tensor of dimension %d",
                    off->ndim);
  if (!tpu_dtype_is_floating(g->dtype) || !tpu_dtype_is_floating(w->dtype))
    return tpu__err_not_implemented_for(b, "embedding_bag_per_sample_weights_backward", g->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, w));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, idx));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, off));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, o2b));
  n->kind = TPU_KIND_EMBEDDING_BAG_PSW_BACKWARD;
  n->compute = tpu__compute_dtype(g->dtype);
  n->ia[0] = pad;
  int64_t len = idx->sizes[0];
  tpu__node_add_output(n, g->dtype, 1, &len);
  return NULL;
}

/* ---- nll loss --------------------------------------------------------------------- */

enum { NLL_1D = 0, NLL_2D = 1 };
static const int k_nll1d = NLL_1D, k_nll2d = NLL_2D;

/* Shape rules of nll_loss / nll_loss2d shared by forward and backward. Self is at arg
 * `si`, target at si+1, weight at si+2. Fills (N, C, P): batch, classes, spatial size. */
static tpu_status_t nll_check(tpu_build_t* b, int si, const tpu_view_t** out_self,
                              const tpu_view_t** out_target, const tpu_view_t** out_w, int64_t ncp[3]) {
  const tpu_view_t *x, *t, *w;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, si, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, si + 1, &t));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, si + 2, &w));
  bool is2d = *(const int*)b->data == NLL_2D;
  char s1[256], s2[256];
  tpu__fmt_shape(s1, sizeof s1, x->ndim, x->sizes);
  tpu__fmt_shape(s2, sizeof s2, t->ndim, t->sizes);
  if (!is2d) {
    if (x->ndim < 1 || x->ndim > 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "input tensor should be 1D or 2D");
    if (t->ndim > 1)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "0D or 1D target tensor expected, multi-target not supported");
    bool no_batch = x->ndim == 1 && t->ndim == 0;
    if (!(no_batch || x->sizes[0] == t->sizes[0]))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "size mismatch (got input: %s, target: %s)", s1, s2);
    ncp[0] = x->ndim == 2 ? x->sizes[0] : 1;
    ncp[1] = x->sizes[x->ndim - 1];
    ncp[2] = 1;
    if (x->ndim == 1 && tpu_view_numel(t) != 1)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "size mismatch (got input: %s, target: %s)", s1, s2);
  } else {
    if (t->ndim != 3)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "only batches of spatial targets supported (3D tensors) but got targets of dimension: %d", t->ndim);
    if (x->ndim != 4)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "only batches of spatial inputs supported (4D tensors), but got input of dimension: %d", x->ndim);
    if (x->sizes[0] != t->sizes[0] || x->sizes[2] != t->sizes[1] || x->sizes[3] != t->sizes[2])
      return tpu__err(b, TPU_INVALID_ARGUMENT, "size mismatch (got input: %s , target: %s", s1, s2);
    ncp[0] = x->sizes[0];
    ncp[1] = x->sizes[1];
    ncp[2] = x->sizes[2] * x->sizes[3];
  }
  if (w && tpu_view_numel(w) != ncp[1]) {
    if (is2d) return tpu__err(b, TPU_INVALID_ARGUMENT, "weight tensor should be defined either for all or no classes");
    tpu__fmt_shape(s1, sizeof s1, w->ndim, w->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "weight tensor should be defined either for all %lld classes or no classes but got "
                    "weight tensor of shape: %s", (long long)ncp[1], s1);
  }
  if (t->dtype != TPU_DTYPE_I64 && t->dtype != TPU_DTYPE_U8)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected target dtype to be Long or Byte, but got %s", tpu__dtype_c10_name(t->dtype));
  if (!tpu_dtype_is_floating(x->dtype))
    return tpu__err_not_implemented_for(b, is2d ? "nll_loss2d_forward_out_frame" : "nll_loss_out_frame", x->dtype);
  if (w && w->dtype != x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", tpu__dtype_c10_name(x->dtype), tpu__dtype_c10_name(w->dtype));
  *out_self = x;
  *out_target = t;
  *out_w = w;
  return NULL;
}

/* nll_loss_forward / nll_loss2d_forward(self, target, weight?, reduction, ignore_index)
 * -> (output, total_weight). Reductions: 0 none, 1 mean, other values sum (as ATen). */
static tpu_status_t build_nll(tpu_build_t* b) {
  const tpu_view_t *x, *t, *w;
  int64_t ncp[3], red, ignore;
  TPU_RETURN_IF_ERROR(nll_check(b, 0, &x, &t, &w, ncp));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 3, &red));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 4, &ignore));
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, t));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, w));
  n->kind = TPU_KIND_NLL_LOSS;
  n->compute = tpu__compute_dtype(x->dtype);
  n->ia[0] = red;
  n->ia[1] = ignore;
  n->ia[2] = ncp[0]; n->ia[3] = ncp[1]; n->ia[4] = ncp[2];
  bool is2d = *(const int*)b->data == NLL_2D;
  if (red == 0 && is2d) tpu__node_add_output(n, x->dtype, 3, t->sizes);
  else if (red == 0 && x->ndim == 2) tpu__node_add_output(n, x->dtype, 1, ncp);
  else tpu__node_add_output(n, x->dtype, 0, NULL);
  tpu__node_add_output(n, x->dtype, 0, NULL);
  return NULL;
}

/* nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight?, reduction,
 * ignore_index, total_weight) -> grad_input */
static tpu_status_t build_nll_backward(tpu_build_t* b) {
  const tpu_view_t *go, *x, *t, *w, *tw;
  int64_t ncp[3], red, ignore;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(nll_check(b, 1, &x, &t, &w, ncp));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 4, &red));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 5, &ignore));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 6, &tw));
  char s[256];
  if (tpu_view_numel(tw) != 1) {
    tpu__fmt_shape(s, sizeof s, tw->ndim, tw->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected total_weight to be a single element tensor, got: %s (%lld elements)",
                    s, (long long)tpu_view_numel(tw));
  }
  bool batched_none = red == 0 && (x->ndim > 1);
  if (batched_none ? tpu_view_numel(go) != ncp[0] * ncp[2] : tpu_view_numel(go) != 1) {
    tpu__fmt_shape(s, sizeof s, go->ndim, go->sizes);
    if (batched_none)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "grad_output must have %lld elements for reduction='none', but got: %s",
                      (long long)(ncp[0] * ncp[2]), s);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected a single element grad_output tensor, but got: %s", s);
  }
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, go));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, t));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, w));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, tw));
  n->kind = TPU_KIND_NLL_LOSS_BACKWARD;
  n->compute = tpu__compute_dtype(x->dtype);
  n->ia[0] = red;
  n->ia[1] = ignore;
  n->ia[2] = ncp[0]; n->ia[3] = ncp[1]; n->ia[4] = ncp[2];
  tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  return NULL;
}

/* ---- fused attention -------------------------------------------------------------- */

/* Checks q (B,H,L,E), k (B,Hk,S,E), v (B,Hk,S,Ev) with H % Hk == 0 (grouped-query
 * attention), and that the bias broadcasts to (B,H,L,S). */
static tpu_status_t sdpa_check(tpu_build_t* b, const tpu_view_t* q, const tpu_view_t* k,
                               const tpu_view_t* v, const tpu_view_t* bias) {
  if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "expected 4-D query, key and value (batch, heads, seq, dim), got %d-D, %d-D, %d-D",
                    q->ndim, k->ndim, v->ndim);
  if (q->dtype != k->dtype || q->dtype != v->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected query, key, and value to have the same dtype, but got query.dtype: %s "
                    "key.dtype: %s and value.dtype: %s instead.",
                    tpu_dtype_name(q->dtype), tpu_dtype_name(k->dtype), tpu_dtype_name(v->dtype));
  if (!tpu_dtype_is_floating(q->dtype))
    return tpu__err_not_implemented_for(b, "scaled_dot_product_attention", q->dtype);
  if (k->sizes[0] != q->sizes[0] || v->sizes[0] != q->sizes[0] || k->sizes[1] != v->sizes[1] ||
      k->sizes[2] != v->sizes[2] || k->sizes[3] != q->sizes[3] || k->sizes[1] <= 0 ||
      q->sizes[1] % k->sizes[1] != 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "incompatible shapes: query [%lld, %lld, %lld, %lld], key [%lld, %lld, %lld, %lld], "
                    "value [%lld, %lld, %lld, %lld]",
                    (long long)q->sizes[0], (long long)q->sizes[1], (long long)q->sizes[2], (long long)q->sizes[3],
                    (long long)k->sizes[0], (long long)k->sizes[1], (long long)k->sizes[2], (long long)k->sizes[3],
                    (long long)v->sizes[0], (long long)v->sizes[1], (long long)v->sizes[2], (long long)v->sizes[3]);
  /* the kernels hand dimensions to 32-bit BLAS */
  for (int i = 2; i < 4; ++i)
    if (q->sizes[i] > INT32_MAX || k->sizes[i] > INT32_MAX || v->sizes[i] > INT32_MAX)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "sequence and head dimensions must fit in 32 bits");
  if (bias) {
    if (bias->dtype != TPU_DTYPE_BOOL && !tpu_dtype_is_floating(bias->dtype))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "attn_bias must be a bool or floating tensor, got %s",
                      tpu_dtype_name(bias->dtype));
    int64_t full[4] = {q->sizes[0], q->sizes[1], q->sizes[2], k->sizes[2]}, out[TPU_MAX_DIMS];
    int no;
    TPU_RETURN_IF_ERROR(tpu__broadcast(b, full, 4, bias->sizes, bias->ndim, out, &no));
    if (!same_shape(no, out, 4, full))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "attn_bias must broadcast to [%lld, %lld, %lld, %lld]",
                      (long long)full[0], (long long)full[1], (long long)full[2], (long long)full[3]);
  }
  return NULL;
}

static tpu_status_t sdpa_scale(tpu_build_t* b, int i, const tpu_view_t* q, double* out) {
  return tpu__arg_double_opt(b, i, 1.0 / sqrt((double)(q->sizes[3] > 0 ? q->sizes[3] : 1)), out);
}

/* _scaled_dot_product_fused_attention_overrideable(query, key, value, attn_bias?, dropout_p,
 * is_causal, return_debug_mask, *, scale?) -> (output, logsumexp, ...). The node declares
 * only output and logsumexp; the remaining returns carry nothing for a dropout-free
 * kernel. */
static tpu_status_t build_sdpa(tpu_build_t* b) {
  const tpu_view_t *q, *k, *v, *bias;
  double dropout, scale;
  bool causal;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &q));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &k));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &v));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 3, &bias));
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 4, 0.0, &dropout));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 5, false, &causal));
  TPU_RETURN_IF_ERROR(sdpa_check(b, q, k, v, bias));
  TPU_RETURN_IF_ERROR(sdpa_scale(b, 7, q, &scale));
  if (dropout != 0.0)
    return tpu__err(b, TPU_UNIMPLEMENTED, "dropout_p > 0 is not supported by the tpu fused attention kernel");
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, q));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, k));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, v));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, bias));
  n->kind = TPU_KIND_SDPA;
  n->compute = tpu__compute_dtype(q->dtype);
  n->ia[0] = causal;
  n->da[0] = scale;
  int64_t os[4] = {q->sizes[0], q->sizes[1], q->sizes[2], v->sizes[3]};
  tpu__node_add_output(n, q->dtype, 4, os);
  tpu__node_add_output(n, n->compute, 3, q->sizes);
  return NULL;
}

/* _scaled_dot_product_fused_attention_overrideable_backward(grad_out, query, key, value,
 * attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
 * dropout_p, is_causal, philox_seed, philox_offset, *, scale?) -> (gq, gk, gv, gbias).
 * Gradients that grad_input_mask does not ask for, and grad_attn_bias without a floating
 * bias, are absent (undefined tensors). */
static tpu_status_t build_sdpa_backward(tpu_build_t* b) {
  const tpu_view_t *go, *q, *k, *v, *bias, *o, *lse;
  double dropout, scale;
  bool causal, mask[4];
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &q));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 2, &k));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 3, &v));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, 4, &bias));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_mask(b, 5, 4, mask));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 6, &o));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 7, &lse));
  TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, 12, 0.0, &dropout));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_opt(b, 13, false, &causal));
  TPU_RETURN_IF_ERROR(sdpa_check(b, q, k, v, bias));
  TPU_RETURN_IF_ERROR(sdpa_scale(b, 16, q, &scale));
  if (dropout != 0.0)
    return tpu__err(b, TPU_UNIMPLEMENTED, "dropout_p > 0 is not supported by the tpu fused attention kernel");
  int64_t os[4] = {q->sizes[0], q->sizes[1], q->sizes[2], v->sizes[3]};
  if (!same_shape(go->ndim, go->sizes, 4, os) || !same_shape(o->ndim, o->sizes, 4, os))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "grad_out and out must have the output's shape");
  if (!same_shape(lse->ndim, lse->sizes, 3, q->sizes))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "logsumexp must have shape [batch, heads, seq_q]");
  bool gbias = bias && mask[3] && tpu_dtype_is_floating(bias->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, go));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, q));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, k));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, v));
  TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, bias));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, o));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, lse));
  n->kind = TPU_KIND_SDPA_BACKWARD;
  n->compute = tpu__compute_dtype(q->dtype);
  n->ia[0] = causal;
  n->ia[1] = gbias;
  n->da[0] = scale;
  tpu__node_add_output(n, q->dtype, mask[0] ? 4 : -1, q->sizes);
  tpu__node_add_output(n, k->dtype, mask[1] ? 4 : -1, k->sizes);
  tpu__node_add_output(n, v->dtype, mask[2] ? 4 : -1, v->sizes);
  if (gbias) tpu__node_add_output(n, bias->dtype, bias->ndim, bias->sizes);
  else tpu__node_add_output(n, q->dtype, -1, NULL);
  return NULL;
}

/* ---- pointwise losses ------------------------------------------------------------- */

enum { LOSS_MSE = 0, LOSS_BCE = 1, LOSS_SMOOTH_L1 = 2, LOSS_HUBER = 3 };
typedef struct loss_def_s { int loss; const char* kernel; bool backward; } loss_def_t;

/* forward: (self, target, [weight?,] reduction, [beta|delta]);
 * backward: (grad_output, self, target, [weight?,] reduction, [beta|delta]). */
static tpu_status_t build_point_loss(tpu_build_t* b) {
  const loss_def_t* d = b->data;
  int a0 = d->backward ? 1 : 0;
  const tpu_view_t *go = NULL, *x, *t, *w = NULL;
  if (d->backward) TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, a0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, a0 + 1, &t));
  int ai = a0 + 2;
  if (d->loss == LOSS_BCE) TPU_RETURN_IF_ERROR(tpu__arg_tensor_opt(b, ai++, &w));
  int64_t red;
  double param = 1.0;
  TPU_RETURN_IF_ERROR(tpu__arg_int_opt(b, ai++, 1, &red));
  if (d->loss == LOSS_SMOOTH_L1 || d->loss == LOSS_HUBER) TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, ai, 1.0, &param));
  if (d->loss == LOSS_SMOOTH_L1 && param < 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "smooth_l1_loss does not support negative values for beta.");
  if (d->loss == LOSS_HUBER && param <= 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "huber_loss does not support non-positive values for delta.");
  const tpu_view_t* ops[4] = {go, x, t, w};
  int64_t shape[TPU_MAX_DIMS];
  int nd = 0;
  for (int i = 0; i < 4; ++i) {
    if (!ops[i]) continue;
    int64_t tmp[TPU_MAX_DIMS];
    int tn;
    TPU_RETURN_IF_ERROR(tpu__broadcast(b, shape, nd, ops[i]->sizes, ops[i]->ndim, tmp, &tn));
    memcpy(shape, tmp, sizeof(int64_t) * (size_t)tn);
    nd = tn;
  }
  tpu_dtype_t dt;
  if (d->loss == LOSS_BCE) {
    if (t->dtype != x->dtype)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "Found dtype %s but expected %s", tpu__dtype_c10_name(t->dtype), tpu__dtype_c10_name(x->dtype));
    dt = x->dtype;
  } else {
    int idx[2] = {a0, a0 + 1};
    dt = tpu__result_type(b, idx, 2);
  }
  if (d->backward) dt = x->dtype;
  if (!tpu_dtype_is_floating(dt)) return tpu__err_not_implemented_for(b, d->kernel, dt);
  tpu_node_t* n = b->node;
  for (int i = 0; i < 4; ++i) {
    if (i == 0 && !d->backward) continue;
    if (i == 3 && d->loss != LOSS_BCE) continue;
    TPU_RETURN_IF_ERROR(tpu__node_add_opt(b, ops[i]));
  }
  n->kind = d->backward ? TPU_KIND_POINT_LOSS_BACKWARD : TPU_KIND_POINT_LOSS;
  n->compute = tpu__compute_dtype(dt);
  n->ia[0] = d->loss;
  n->ia[1] = red;
  n->ia[2] = tpu_view_numel(x);
  n->da[0] = param;
  if (d->backward || red == 0) tpu__node_add_output(n, dt, nd, shape);
  else tpu__node_add_output(n, dt, 0, NULL);
  return NULL;
}

static const loss_def_t k_mse = {LOSS_MSE, "mse_cpu", false}, k_mse_bw = {LOSS_MSE, "mse_backward_cpu", true};
static const loss_def_t k_bce = {LOSS_BCE, "binary_cross_entropy", false},
                        k_bce_bw = {LOSS_BCE, "binary_cross_entropy_backward", true};
static const loss_def_t k_sl1 = {LOSS_SMOOTH_L1, "smooth_l1_cpu", false},
                        k_sl1_bw = {LOSS_SMOOTH_L1, "smooth_l1_backward_cpu_out", true};
static const loss_def_t k_hub = {LOSS_HUBER, "huber_cpu", false},
                        k_hub_bw = {LOSS_HUBER, "huber_backward_cpu_out", true};

/* ---- reflection and replication padding ------------------------------------------- */

enum { PAD_REFLECT = 0, PAD_REPLICATE = 1 };
typedef struct pad_def_s { int mode; int k; const char* kernel; } pad_def_t;

/* Writes "D: 3, H: 4, W: 4" (sep ", ") or "D: 3 H: 4 W: 4" (sep " ") for the k padded
 * dims of shape (outermost first). */
static void fmt_dhw(char* buf, size_t cap, int k, const int64_t* dims, const char* sep) {
  static const char names[3] = {'D', 'H', 'W'};
  size_t at = 0;
  buf[0] = 0;
  for (int i = 0; i < k && at < cap; ++i)
    at += (size_t)snprintf(buf + at, cap - at, "%s%c: %lld", i ? sep : "", names[3 - k + i], (long long)dims[i]);
}

/* ATen's checks for {reflection,replication}_pad{1,2,3}d (check_valid_input<k> and the
 * per-mode size rules); fills out[] with the padded shape of x. */
static tpu_status_t pad_edge_shape(tpu_build_t* b, const pad_def_t* d, const tpu_view_t* x, const int64_t* pad,
                                   int np, int64_t* out) {
  int k = d->k;
  if (np != 2 * k) {
    if (d->mode == PAD_REFLECT)
      return tpu__err(b, TPU_INVALID_ARGUMENT, "padding size is expected to be %d, but got: %d", 2 * k, np);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "padding size is expected to be %d", 2 * k);
  }
  char s[256];
  tpu__fmt_shape(s, sizeof s, x->ndim, x->sizes);
  bool batch = x->ndim == k + 2, ok = batch || x->ndim == k + 1;
  for (int i = batch ? 1 : 0; ok && i < x->ndim; ++i) ok = x->sizes[i] != 0;
  if (!ok)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected %dD or %dD (batch mode) tensor with possibly 0 batch size and other non-zero "
                    "dimensions for input, but got: %s", k + 1, k + 2, s);
  memcpy(out, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
  int64_t ins[3], outs[3];
  bool any_pos = false, all_pos = true, any_neg = false;
  for (int i = 0; i < k; ++i) { /* i = 0 is the last dim (W), padded by pad[0], pad[1] */
    int dim = x->ndim - 1 - i;
    int64_t lo = pad[2 * i], hi = pad[2 * i + 1], in = x->sizes[dim];
    if (d->mode == PAD_REFLECT && !(lo < in && hi < in))
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Argument #%d: Padding size should be less than the corresponding input dimension, but "
                      "got: padding (%lld, %lld) at dimension %d of input %s", 4 + 2 * i, (long long)lo,
                      (long long)hi, dim, s);
    out[dim] = in + lo + hi;
    ins[k - 1 - i] = in;
    outs[k - 1 - i] = out[dim];
    any_pos |= out[dim] >= 1;
    all_pos &= out[dim] >= 1;
    any_neg |= out[dim] < 0;
  }
  char si[128], so[128];
  if (k == 1 && !all_pos)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "input (W: %lld) is too small. Calculated output W: %lld",
                    (long long)ins[0], (long long)outs[0]);
  if (d->mode == PAD_REPLICATE && !all_pos) {
    fmt_dhw(so, sizeof so, k, outs, " ");
    fmt_dhw(si, sizeof si, k, ins, ", ");
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Calculated output %s must be >= 1 in every dimension (input %s)", so, si);
  }
  if (!any_pos || any_neg) {
    fmt_dhw(so, sizeof so, k, outs, " ");
    fmt_dhw(si, sizeof si, k, ins, ", ");
    return tpu__err(b, TPU_INVALID_ARGUMENT, "input (%s) is too small. Calculated output %s", si, so);
  }
  return NULL;
}

/* {reflection,replication}_pad{1,2,3}d(self, padding): one kernel, the mode in ia[0]. */
static tpu_status_t build_pad_edge(tpu_build_t* b) {
  const pad_def_t* d = b->data;
  const tpu_view_t* x;
  const int64_t* pad;
  int np;
  int64_t shape[TPU_MAX_DIMS];
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &pad, &np));
  TPU_RETURN_IF_ERROR(pad_edge_shape(b, d, x, pad, np, shape));
  if (x->dtype == TPU_DTYPE_BOOL) return tpu__err_not_implemented_for(b, d->kernel, x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(n, pad, np));
  n->kind = TPU_KIND_PAD_EDGE;
  n->ia[0] = d->mode;
  n->ia[1] = d->k;
  tpu__node_add_output(n, x->dtype, x->ndim, shape);
  return NULL;
}

/* {reflection,replication}_pad{1,2,3}d_backward(grad_output, self, padding): sums each
 * output gradient into the input element it was read from. self supplies only the shape. */
static tpu_status_t build_pad_edge_backward(tpu_build_t* b) {
  const pad_def_t* d = b->data;
  const tpu_view_t *go, *x;
  const int64_t* pad;
  int np;
  int64_t shape[TPU_MAX_DIMS];
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 2, &pad, &np));
  TPU_RETURN_IF_ERROR(pad_edge_shape(b, d, x, pad, np, shape));
  if (go->dtype != x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", tpu__dtype_c10_name(go->dtype),
                    tpu__dtype_c10_name(x->dtype));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, d->kernel, x->dtype);
  static const char* const dim_names[3] = {"width", "height", "depth"};
  const char* who = d->mode == PAD_REFLECT ? "grad_output" : "gradOutput";
  if (go->ndim != x->ndim) {
    char s1[256], s2[256];
    tpu__fmt_shape(s1, sizeof s1, go->ndim, go->sizes);
    tpu__fmt_shape(s2, sizeof s2, x->ndim, x->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s of shape %s does not match input of shape %s", who, s1, s2);
  }
  for (int i = 0; i < d->k; ++i) {
    int dim = x->ndim - 1 - i;
    if (go->sizes[dim] != shape[dim])
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s %s unexpected. Expected: %lld, Got: %lld", who, dim_names[i],
                      (long long)shape[dim], (long long)go->sizes[dim]);
  }
  for (int dim = 0; dim < x->ndim - d->k; ++dim)
    if (go->sizes[dim] != x->sizes[dim])
      return tpu__err(b, TPU_INVALID_ARGUMENT, "%s size %lld at dimension %d does not match the input's %lld", who,
                      (long long)go->sizes[dim], dim, (long long)x->sizes[dim]);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, go));
  TPU_RETURN_IF_ERROR(tpu__node_set_ilist(n, pad, np));
  n->kind = TPU_KIND_PAD_EDGE_BACKWARD;
  n->ia[0] = d->mode;
  n->ia[1] = d->k;
  tpu__node_add_output(n, x->dtype, x->ndim, x->sizes);
  return NULL;
}

#define PAD_DEFS(X)                                                                            \
  X(reflection_pad1d, PAD_REFLECT, 1) X(reflection_pad2d, PAD_REFLECT, 2)                      \
  X(reflection_pad3d, PAD_REFLECT, 3) X(replication_pad1d, PAD_REPLICATE, 1)                   \
  X(replication_pad2d, PAD_REPLICATE, 2) X(replication_pad3d, PAD_REPLICATE, 3)
#define PAD_DEF(name, mode, k)                                       \
  static const pad_def_t k_##name = {mode, k, #name};                \
  static const pad_def_t k_##name##_bw = {mode, k, #name "_backward"};
PAD_DEFS(PAD_DEF)
#undef PAD_DEF

/* ---- im2col / col2im -------------------------------------------------------------- */

/* Reads an int[2] argument. */
static tpu_status_t pair_arg(tpu_build_t* b, int i, const char* what, int64_t out[2]) {
  const int64_t* v;
  int n;
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, i, &v, &n));
  if (n != 2) return tpu__err(b, TPU_INVALID_ARGUMENT, "It is expected %s equals to 2, but got size %d", what, n);
  out[0] = v[0];
  out[1] = v[1];
  return NULL;
}

/* Floor division (ATen's div_rtn). */
static int64_t div_rtn(int64_t a, int64_t c) {
  int64_t q = a / c;
  return (a % c != 0 && ((a < 0) != (c < 0))) ? q - 1 : q;
}

/* Window parameters from schema arguments first..first+3 (kernel_size, dilation,
 * padding, stride): w[0..7] = kh, kw, dh, dw, ph, pw, sh, sw. */
static tpu_status_t window_args(tpu_build_t* b, int first, int64_t w[8]) {
  static const char* const names[4] = {"kernel_size", "dilation", "padding", "stride"};
  for (int i = 0; i < 4; ++i) TPU_RETURN_IF_ERROR(pair_arg(b, first + i, names[i], w + 2 * i));
  if (w[0] <= 0 || w[1] <= 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "kernel size should be greater than zero, but got kernel_height: %lld "
                    "kernel_width: %lld", (long long)w[0], (long long)w[1]);
  if (w[2] <= 0 || w[3] <= 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "dilation should be greater than zero, but got dilation_height: %lld "
                    "dilation_width: %lld", (long long)w[2], (long long)w[3]);
  if (w[4] < 0 || w[5] < 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "padding should be non-negative, but got pad_height: %lld pad_width: %lld",
                    (long long)w[4], (long long)w[5]);
  if (w[6] <= 0 || w[7] <= 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "stride should be greater than zero, but got stride_height: %lld "
                    "stride_width: %lld", (long long)w[6], (long long)w[7]);
  if (w[0] > INT32_MAX || w[1] > INT32_MAX)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Given kernel_width = %lld and kernel_height = %lld the product of "
                    "kernel_width and kernel_height overflowed.", (long long)w[1], (long long)w[0]);
  return NULL;
}

/* Sliding blocks along one spatial dim of size `in` (ATen's formula). */
static int64_t n_blocks(int64_t in, int64_t k, int64_t dil, int64_t pad, int64_t stride) {
  return div_rtn(in + 2 * pad - (dil * (k - 1) + 1), stride) + 1;
}

static void set_window_attrs(tpu_node_t* n, const int64_t w[8], int64_t batch, int64_t c, int64_t h, int64_t wd,
                             int64_t oh, int64_t ow) {
  for (int i = 0; i < 8; ++i) n->ia[i] = w[i];
  n->ia[8] = batch; n->ia[9] = c; n->ia[10] = h; n->ia[11] = wd; n->ia[12] = oh; n->ia[13] = ow;
}

/* im2col(self, kernel_size, dilation, padding, stride): (N?, C, H, W) ->
 * (N?, C * kh * kw, L), L the number of sliding blocks; padding reads zeros. */
static tpu_status_t build_im2col(tpu_build_t* b) {
  const tpu_view_t* x;
  int64_t w[8];
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(window_args(b, 1, w));
  char s[256];
  tpu__fmt_shape(s, sizeof s, x->ndim, x->sizes);
  bool valid = x->ndim >= 3 && x->sizes[1] != 0 && x->sizes[2] != 0;
  if (!((x->ndim == 3 && x->sizes[0] != 0 && valid) || (x->ndim == 4 && valid && x->sizes[3] != 0)))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and "
                    "other non-zero dimensions for input, but got: %s", s);
  bool batched = x->ndim == 4;
  int64_t nb = batched ? x->sizes[0] : 1, c = x->sizes[batched], h = x->sizes[batched + 1],
          wd = x->sizes[batched + 2];
  int64_t oh = n_blocks(h, w[0], w[2], w[4], w[6]), ow = n_blocks(wd, w[1], w[3], w[5], w[7]);
  if (oh < 1 || ow < 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Given input with spatial size (%lld, %lld), kernel_size=(%lld, %lld), "
                    "dilation=(%lld, %lld), padding=(%lld, %lld), calculated shape of the array of sliding blocks "
                    "as (%lld, %lld), but its components must be at least one.", (long long)h, (long long)wd,
                    (long long)w[0], (long long)w[1], (long long)w[2], (long long)w[3], (long long)w[4],
                    (long long)w[5], (long long)oh, (long long)ow);
  if (!tpu_dtype_is_floating(x->dtype) && x->dtype != TPU_DTYPE_BOOL)
    return tpu__err_not_implemented_for(b, "im2col_out_cpu", x->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_IM2COL;
  set_window_attrs(n, w, nb, c, h, wd, oh, ow);
  int64_t shape[3] = {nb, c * w[0] * w[1], oh * ow};
  tpu__node_add_output(n, x->dtype, batched ? 3 : 2, batched ? shape : shape + 1);
  return NULL;
}

/* col2im(self, output_size, kernel_size, dilation, padding, stride): (N?, C * kh * kw, L)
 * -> (N?, C, H, W), summing the blocks that overlap. */
static tpu_status_t build_col2im(tpu_build_t* b) {
  const tpu_view_t* x;
  int64_t osz[2] = {0, 0}, w[8] = {0};
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(pair_arg(b, 1, "output_size", osz));
  TPU_RETURN_IF_ERROR(window_args(b, 2, w));
  char s[256];
  tpu__fmt_shape(s, sizeof s, x->ndim, x->sizes);
  if (!((x->ndim == 2 && x->sizes[0] != 0 && x->sizes[1] != 0) ||
        (x->ndim == 3 && x->sizes[1] != 0 && x->sizes[2] != 0)))
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch "
                    "size and non-zero dimensions for input, but got: %s", s);
  bool batched = x->ndim == 3;
  int64_t planes = x->sizes[batched], length = x->sizes[batched + 1], kk = w[0] * w[1];
  if (planes % kk != 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected size of input's dimension 1 to be divisible by the product of "
                    "kernel_size, but got input.size(1)=%lld and kernel_size=(%lld, %lld).", (long long)planes,
                    (long long)w[0], (long long)w[1]);
  int64_t oh = n_blocks(osz[0], w[0], w[2], w[4], w[6]), ow = n_blocks(osz[1], w[1], w[3], w[5], w[7]);
  char win[320];
  snprintf(win, sizeof win, "Given output_size=(%lld, %lld), kernel_size=(%lld, %lld), dilation=(%lld, %lld), "
           "padding=(%lld, %lld), stride=(%lld, %lld)", (long long)osz[0], (long long)osz[1], (long long)w[0],
           (long long)w[1], (long long)w[2], (long long)w[3], (long long)w[4], (long long)w[5], (long long)w[6],
           (long long)w[7]);
  if (length != oh * ow)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s, expected size of input's dimension 2 to match the calculated number "
                    "of sliding blocks %lld * %lld = %lld, but got input.size(2)=%lld.", win, (long long)oh,
                    (long long)ow, (long long)(oh * ow), (long long)length);
  if (oh < 1 || ow < 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "%s, calculated shape of the array of sliding blocks as (%lld, %lld), "
                    "which is too small (non-positive)", win, (long long)oh, (long long)ow);
  if (osz[0] < 1 || osz[1] < 1)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected output spatial size to be positive, but got: "
                    "output_size=(%lld, %lld).", (long long)osz[0], (long long)osz[1]);
  if (!tpu_dtype_is_floating(x->dtype) && x->dtype != TPU_DTYPE_BOOL)
    return tpu__err_not_implemented_for(b, "col2im_out_cpu", x->dtype);
  int64_t nb = batched ? x->sizes[0] : 1, c = planes / kk;
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_COL2IM;
  set_window_attrs(n, w, nb, c, osz[0], osz[1], oh, ow);
  int64_t shape[4] = {nb, c, osz[0], osz[1]};
  tpu__node_add_output(n, x->dtype, batched ? 4 : 3, batched ? shape : shape + 1);
  return NULL;
}

/* ---- the transformer inference fast path -------------------------------------------
 * nn.MultiheadAttention / nn.TransformerEncoderLayer in eval go through ATen's
 * _native_multi_head_attention and _transformer_encoder_layer_fwd (registered for tpu by
 * the adapter as they are), which call the two kernels below. */

/* "The expanded size of the tensor ..." as Tensor::expand words it. */
static tpu_status_t expand_error(tpu_build_t* b, int nd, const int64_t* target, int nm, const int64_t* m) {
  char a[256], c[256];
  int bad = 0;
  for (int i = 0; i < nd; ++i) {
    int mi = i - (nd - nm);
    if (mi >= 0 && m[mi] != 1 && m[mi] != target[i]) { bad = i; break; }
  }
  tpu__fmt_shape(a, sizeof a, nd, target);
  tpu__fmt_shape(c, sizeof c, nm, m);
  return tpu__err(b, TPU_INVALID_ARGUMENT,
                  "The expanded size of the tensor (%lld) must match the existing size (%lld) at "
                  "non-singleton dimension %d.  Target sizes: %s.  Tensor sizes: %s",
                  (long long)target[bad], (long long)m[bad - (nd - nm)], bad, a, c);
}

/* _masked_softmax(self, mask, dim=None, mask_type=None) [.out]: softmax over dim of the
 * positions where mask is false; masked positions give 0. mask_type 0 is an [L, L]
 * attention mask and 1 a [B, L] key padding mask of a [B, heads, L, L] input (both only
 * for a 2-d mask and a 4-d input; every other call is type 2: mask shaped like the
 * input). Checks, their order and messages as ATen's CPU kernel; as there, a row with
 * every position masked (or whose unmasked values make the sum NaN) is NaN throughout.
 * Where CPU would read past the mask (type 0/1 over the last dim of a non-square input)
 * the call is refused with the shape message instead.
 * Node MASKED_SOFTMAX: in[0] self, in[1] the mask as a bool view broadcast to self's
 * shape (stride 0 on the broadcast dims); ia[0] the dim (0 for a 0-dim self). */
static tpu_status_t build_masked_softmax(tpu_build_t* b) {
  const tpu_view_t *x, *m;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &m));
  bool has_dim = !tpu__arg_is_none(b, 2), has_type = !tpu__arg_is_none(b, 3);
  int64_t dim = 0, type = 0;
  if (has_dim) TPU_RETURN_IF_ERROR(tpu__arg_int(b, 2, &dim));
  if (has_type) TPU_RETURN_IF_ERROR(tpu__arg_int(b, 3, &type));
  if (m->dtype != TPU_DTYPE_BOOL) return tpu__err(b, TPU_INVALID_ARGUMENT, "Mask should be a boolean tensor");
  if (m->ndim != 2 || x->ndim != 4) { has_type = true; type = 2; }
  /* the mask as a view broadcast to x: [B, 1, 1, L] for type 1, [1, 1, L, L] for type 0 */
  tpu_view_t mv = *m;
  const bool last = has_dim && dim == x->ndim - 1; /* CPU compares the dim as given */
  if (has_type && type == 2) {
    if (!same_shape(x->ndim, x->sizes, m->ndim, m->sizes))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "For mask_type == 2 mask shape should match input shape");
  } else if (has_type && (type == 0 || type == 1)) {
    const int64_t* xs = x->sizes;
    const int64_t* ms = m->sizes;
    bool ok = type == 1 ? xs[0] == ms[0] && xs[2] == ms[1] : xs[2] == ms[0] && xs[2] == ms[1];
    if (ok && last) ok = xs[3] == ms[1];
    if (!ok)
      return tpu__err(b, TPU_INVALID_ARGUMENT, type == 1 ? "For mask_type == 1 mask shape should be (B, L)"
                                                         : "For mask_type == 0 mask shape should be (L, L)");
    int64_t v4[4] = {type == 1 ? ms[0] : 1, 1, type == 1 ? 1 : ms[0], ms[1]};
    if (v4[0] != 1 && v4[0] != xs[0]) return expand_error(b, 4, xs, 4, v4);
    if ((v4[2] != 1 && v4[2] != xs[2]) || (v4[3] != 1 && v4[3] != xs[3])) return expand_error(b, 4, xs, 4, v4);
    mv.ndim = 4;
    for (int d = 0; d < 4; ++d) { mv.sizes[d] = xs[d]; mv.strides[d] = 0; }
    if (type == 1) { mv.strides[0] = m->strides[0]; mv.strides[3] = m->strides[1]; }
    else { mv.strides[2] = m->strides[0]; mv.strides[3] = m->strides[1]; }
    if (xs[0] == 1) mv.strides[0] = 0;
  } else if (!has_type) {
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Mask Type should be defined");
  } else {
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Mask Type should be 0 (src_mask) or 1 (src_key_padding_mask), or 2 (default_mask)");
  }
  int wd = 0;
  TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, has_dim ? dim : x->ndim - 1, x->ndim, &wd));
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, "masked_softmax", x->dtype);
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, &mv));
  b->node->kind = TPU_KIND_MASKED_SOFTMAX;
  b->node->compute = tpu__compute_dtype(x->dtype);
  b->node->ia[0] = x->ndim ? wd : 0;
  tpu__node_add_output(b->node, x->dtype, x->ndim, x->sizes);
  return tpu__out_dtypes_exact(b);
}

/* What c10's TORCH_CHECK without a message appends to "Expected <cond> to be true". */
#define TPU__CHECK_TAIL \
  "(Could this error message be improved?  If so, please report an enhancement request to PyTorch.)"

/* _transform_bias_rescale_qkv(qkv, qkv_bias, num_heads) [.out]: qkv [B, T, 3D] plus the
 * bias [3D] split into q, k, v, each [B, heads, T, D / heads], q scaled by
 * 1 / sqrt(D / heads). Rounded as ATen's CPU kernel (found by comparing bits): in
 * float64 for float64, else in float32 (sum, scale 1 / sqrtf, product), rounded to the
 * dtype once at the end. (CPU returns three slices of one buffer; here they are three
 * tensors, which no caller can tell apart.)
 * A bias of another dtype or size, which CPU reads out of bounds, is refused.
 * Node QKV_TRANSFORM: in[0] qkv, in[1] bias (any shape of 3D elements, read in
 * row-major order as CPU reads its memory); ia[0] heads; da[0] the scale. */
static tpu_status_t build_transform_qkv(tpu_build_t* b) {
  const tpu_view_t *qkv, *bias;
  int64_t heads;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &qkv));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 1, &bias));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, 2, &heads));
  int unused;
  if (qkv->ndim < 3) TPU_RETURN_IF_ERROR(tpu__wrap_dim(b, 2, qkv->ndim, &unused)); /* CPU's qkv.size(2) */
  if (qkv->ndim != 3) return tpu__err(b, TPU_INVALID_ARGUMENT, "expected a 3-d qkv, got %d-d", qkv->ndim);
  const int64_t B = qkv->sizes[0], T = qkv->sizes[1], D3 = qkv->sizes[2], D = D3 / 3;
  if (heads <= 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "num_heads must be positive, got %lld", (long long)heads);
  if (D3 % 3 != 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected _3D %% 3 == 0 to be true, but got false.  " TPU__CHECK_TAIL);
  if (D % heads != 0)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected D %% num_head == 0 to be true, but got false.  " TPU__CHECK_TAIL);
  if (!tpu_dtype_is_floating(qkv->dtype))
    return tpu__err_not_implemented_for(b, "transform_bias_rescale_qkv", qkv->dtype);
  if (bias->dtype != qkv->dtype || tpu_view_numel(bias) != D3) {
    char s[256];
    tpu__fmt_shape(s, sizeof s, bias->ndim, bias->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected qkv_bias of %lld elements of dtype %s (qkv's), got %s of shape %s",
                    (long long)D3, tpu__dtype_c10_name(qkv->dtype), tpu__dtype_c10_name(bias->dtype), s);
  }
  const int64_t dh = D / heads;
  double scale = qkv->dtype == TPU_DTYPE_F64 ? 1.0 / sqrt((double)dh) : (double)(1.0f / sqrtf((float)dh));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, qkv));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(b->node, bias));
  b->node->kind = TPU_KIND_QKV_TRANSFORM;
  b->node->compute = tpu__compute_dtype(qkv->dtype);
  b->node->ia[0] = heads;
  b->node->da[0] = scale;
  int64_t shape[4] = {B, heads, T, dh};
  for (int i = 0; i < 3; ++i) tpu__node_add_output(b->node, qkv->dtype, 4, shape);
  return tpu__out_dtypes_exact(b);
}

/* _scaled_dot_product_fused_attention_overrideable declares two outputs (output,
 * logsumexp); the adapter fills the schema's remaining returns, which carry nothing for a
 * dropout-free kernel. */
const tpu_aten_entry_t tpu__aten_nn[] = {
    {"native_layer_norm", build_layer_norm, NULL},
    {"native_layer_norm.out", build_layer_norm, NULL},
    {"native_layer_norm_backward", build_layer_norm_backward, NULL},
    {"native_layer_norm_backward.out", build_layer_norm_backward, NULL},
    {"embedding", build_embedding, NULL},
    {"embedding.out", build_embedding, NULL},
    {"embedding_dense_backward", build_embedding_backward, NULL},
    {"embedding_dense_backward.out", build_embedding_backward, NULL},
    {"_embedding_bag", build_embedding_bag, NULL},
    {"_embedding_bag.out", build_embedding_bag, NULL},
    {"_embedding_bag_forward_only", build_embedding_bag, &bag_forward_only},
    {"_embedding_bag_forward_only.out", build_embedding_bag, &bag_forward_only},
    {"_embedding_bag_backward", build_embedding_bag_backward, NULL},
    {"_embedding_bag_dense_backward", build_embedding_bag_backward, &bag_dense},
    {"_embedding_bag_dense_backward.out", build_embedding_bag_backward, &bag_dense},
    {"_embedding_bag_per_sample_weights_backward", build_embedding_bag_psw_backward, NULL},
    {"_embedding_bag_per_sample_weights_backward.out", build_embedding_bag_psw_backward, NULL},
    {"nll_loss_forward", build_nll, &k_nll1d},
    {"nll_loss_forward.output", build_nll, &k_nll1d},
    {"nll_loss_backward", build_nll_backward, &k_nll1d},
    {"nll_loss_backward.grad_input", build_nll_backward, &k_nll1d},
    {"nll_loss2d_forward", build_nll, &k_nll2d},
    {"nll_loss2d_forward.output", build_nll, &k_nll2d},
    {"nll_loss2d_backward", build_nll_backward, &k_nll2d},
    {"nll_loss2d_backward.grad_input", build_nll_backward, &k_nll2d},
    {"_scaled_dot_product_fused_attention_overrideable", build_sdpa, NULL},
    {"_scaled_dot_product_fused_attention_overrideable_backward", build_sdpa_backward, NULL},
    {"mse_loss", build_point_loss, &k_mse},
    {"mse_loss.out", build_point_loss, &k_mse},
    {"mse_loss_backward", build_point_loss, &k_mse_bw},
    {"mse_loss_backward.grad_input", build_point_loss, &k_mse_bw},
    {"binary_cross_entropy", build_point_loss, &k_bce},
    {"binary_cross_entropy.out", build_point_loss, &k_bce},
    {"binary_cross_entropy_backward", build_point_loss, &k_bce_bw},
    {"binary_cross_entropy_backward.grad_input", build_point_loss, &k_bce_bw},
    {"smooth_l1_loss", build_point_loss, &k_sl1},
    {"smooth_l1_loss.out", build_point_loss, &k_sl1},
    {"smooth_l1_loss_backward", build_point_loss, &k_sl1_bw},
    {"smooth_l1_loss_backward.grad_input", build_point_loss, &k_sl1_bw},
    {"huber_loss", build_point_loss, &k_hub},
    {"huber_loss.out", build_point_loss, &k_hub},
    {"huber_loss_backward", build_point_loss, &k_hub_bw},
    {"huber_loss_backward.out", build_point_loss, &k_hub_bw},
#define PAD_ENTRIES(name, mode, k)                                                  \
    {#name, build_pad_edge, &k_##name}, {#name ".out", build_pad_edge, &k_##name}, \
    {#name "_backward", build_pad_edge_backward, &k_##name##_bw},                  \
    {#name "_backward.grad_input", build_pad_edge_backward, &k_##name##_bw},
    PAD_DEFS(PAD_ENTRIES)
#undef PAD_ENTRIES
    {"im2col", build_im2col, NULL},
    {"im2col.out", build_im2col, NULL},
    {"col2im", build_col2im, NULL},
    {"col2im.out", build_col2im, NULL},
    {"_masked_softmax", build_masked_softmax, NULL},
    {"_masked_softmax.out", build_masked_softmax, NULL},
    {"_transform_bias_rescale_qkv", build_transform_qkv, NULL},
    {"_transform_bias_rescale_qkv.out", build_transform_qkv, NULL},
    {NULL, NULL, NULL},
};
