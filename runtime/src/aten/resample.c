/* ATen resampling: upsampling (nearest, nearest-exact, linear, bilinear, bicubic,
 * trilinear, and the antialiased bilinear/bicubic) and 2-d grid sampling, forward and
 * backward. Builders check arguments the way ATen's meta functions do (same exception
 * type, nearly the same text) and fill one node per call; the host kernels
 * (host/resample.c) reproduce ATen's source-index arithmetic.
 *
 * Node attributes of UPSAMPLE / UPSAMPLE_BACKWARD: ia[0] mode (UP_* below, shared with
 * host/resample.c), ia[1] spatial dims (1..3), ia[2] align_corners; da[k] the scale of
 * spatial dim k as given (0 for None; the kernels use it only when > 0, as ATen does).
 * GRID_SAMPLER_2D(_BACKWARD): ia[0] interpolation, ia[1] padding, ia[2] align_corners,
 * ia[3] (backward) whether grad_input is wanted. */
#include <math.h>
#include <stdio.h>

#include "aten/aten.h"

enum { UP_NEAREST = 0, UP_NEAREST_EXACT = 1, UP_LINEAR = 2, UP_CUBIC = 3, UP_AA_LINEAR = 4, UP_AA_CUBIC = 5 };

typedef struct up_def_s {
  int mode;
  int sdim;      /* spatial dims */
  bool backward;
  bool vec;      /* .vec / .vec_out: (input, output_size?, [align_corners,] scale_factors?) */
} up_def_t;

static bool has_align(int mode) { return mode >= UP_LINEAR; }

static const char* dim_names(int sdim, int k) {
  static const char* n[3][3] = {{"W", "", ""}, {"H", "W", ""}, {"D", "H", "W"}};
  return n[sdim - 1][k];
}

/* upsample_{1,2,3}d_common_check: output_size has sdim entries, the input sdim+2, and all
 * spatial sizes are positive. in: the full input size; out: the output's spatial sizes. */
static tpu_status_t common_check(tpu_build_t* b, int sdim, int in_nd, const int64_t* in, int out_len,
                                 const int64_t* out) {
  if (out_len != sdim)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "It is expected output_size equals to %d, but got size %d", sdim, out_len);
  if (in_nd != sdim + 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "It is expected input_size equals to %d, but got size %d", sdim + 2, in_nd);
  bool ok = true;
  for (int k = 0; k < sdim; ++k) ok = ok && in[2 + k] > 0 && out[k] > 0;
  if (ok) return NULL;
  char a[160] = "", c[160] = "";
  size_t la = 0, lc = 0;
  for (int k = 0; k < sdim; ++k) {
    la += (size_t)snprintf(a + la, sizeof a - la, "%s%s: %lld", k ? ", " : "", dim_names(sdim, k), (long long)in[2 + k]);
    lc += (size_t)snprintf(c + lc, sizeof c - lc, "%s%s: %lld", k ? ", " : "", dim_names(sdim, k), (long long)out[k]);
  }
  if (sdim == 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Input and output sizes should be greater than 0, but got input (%s) output (%s)", a, c);
  return tpu__err(b, TPU_INVALID_ARGUMENT,
                  "Input and output sizes should be greater than 0, but got input (%s) and output (%s)", a, c);
}

/* The compute_output_size rule of the .vec overloads: exactly one of output_size and
 * scale_factors; sizes from the factors are floor(in * factor). Fills out and scales. */
static tpu_status_t vec_sizes(tpu_build_t* b, const up_def_t* d, const tpu_view_t* x, int oi, int si,
                              int64_t* out, int* out_len, double* scales) {
  bool has_out = !tpu__arg_is_none(b, oi), has_sc = !tpu__arg_is_none(b, si);
  if (has_out == has_sc)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Must specify exactly one of output_size and scale_factors");
  int spatial = x->ndim - 2;
  if (has_out) {
    const int64_t* os;
    int len;
    TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, oi, &os, &len));
    if (len != spatial)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Expected static_cast<int64_t>(output_size->size()) == spatial_dimensions to be true, but got false.");
    for (int k = 0; k < len && k < 3; ++k) out[k] = os[k];
    *out_len = len;
    return NULL;
  }
  const tpu_arg_t* a = tpu__arg(b, si);
  if (a->kind != TPU_ARG_DOUBLELIST)
    return tpu__err(b, TPU_TYPE_ERROR, "argument %d must be float[], not another kind", si);
  if (a->list_len != spatial)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "Expected static_cast<int64_t>(scale_factors->size()) == spatial_dimensions to be true, but got false.");
  for (int k = 0; k < spatial && k < 3; ++k) {
    double o = (double)x->sizes[2 + k] * a->dlist[k];
    if (!(o >= -9.2e18 && o <= 9.2e18))
      return tpu__err(b, TPU_INVALID_ARGUMENT, "value cannot be converted to type int64_t without overflow");
    out[k] = (int64_t)o;
    scales[k] = a->dlist[k];
  }
  *out_len = spatial;
  (void)d;
  return NULL;
}

static bool dtype_ok(const up_def_t* d, tpu_dtype_t t) {
  bool aa = d->mode >= UP_AA_LINEAR;
  if (aa) return t == TPU_DTYPE_F32 || t == TPU_DTYPE_F64;
  if (tpu_dtype_is_floating(t)) return true;
  /* nearest forward copies elements: uint8 too, as on CPU */
  return !d->backward && d->mode <= UP_NEAREST_EXACT && t == TPU_DTYPE_U8;
}

static void set_attrs(tpu_node_t* n, const up_def_t* d, bool ac, const double* scales) {
  n->ia[0] = d->mode;
  n->ia[1] = d->sdim;
  n->ia[2] = ac;
  for (int k = 0; k < d->sdim; ++k) n->da[k] = scales[k];
}

/* upsample_*(self, output_size, [align_corners,] scales...) and the .vec forms. */
static tpu_status_t build_upsample(tpu_build_t* b) {
  const up_def_t* d = b->data;
  const tpu_view_t* x;
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &x));
  int64_t out[3] = {0, 0, 0};
  int out_len = 0;
  double scales[3] = {0, 0, 0};
  bool ac = false;
  int ai = 1;
  if (d->vec) {
    if (has_align(d->mode)) TPU_RETURN_IF_ERROR(tpu__arg_bool(b, 2, &ac));
    TPU_RETURN_IF_ERROR(vec_sizes(b, d, x, 1, has_align(d->mode) ? 3 : 2, out, &out_len, scales));
  } else {
    const int64_t* os;
    TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, ai++, &os, &out_len));
    for (int k = 0; k < out_len && k < 3; ++k) out[k] = os[k];
    if (has_align(d->mode)) TPU_RETURN_IF_ERROR(tpu__arg_bool(b, ai++, &ac));
    for (int k = 0; k < d->sdim; ++k) TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, ai + k, 0.0, &scales[k]));
  }
  TPU_RETURN_IF_ERROR(common_check(b, d->sdim, x->ndim, x->sizes, out_len, out));
  /* empty batch is allowed, empty channels are not */
  if (x->sizes[1] == 0) {
    char s[256];
    tpu__fmt_shape(s, sizeof s, x->ndim, x->sizes);
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Non-empty %dD data tensor expected but got a tensor with sizes %s",
                    d->sdim + 2, s);
  }
  if (!dtype_ok(d, x->dtype)) return tpu__err_not_implemented_for(b, b->name, x->dtype); /* the CPU fallback runs it */
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  n->kind = TPU_KIND_UPSAMPLE;
  n->compute = tpu__compute_dtype(x->dtype);
  set_attrs(n, d, ac, scales);
  int64_t shape[5] = {x->sizes[0], x->sizes[1], 0, 0, 0};
  for (int k = 0; k < d->sdim; ++k) shape[2 + k] = out[k];
  tpu__node_add_output(n, x->dtype, d->sdim + 2, shape);
  return NULL;
}

/* upsample_*_backward(grad_output, output_size, input_size, [align_corners,] scales...) */
static tpu_status_t build_upsample_backward(tpu_build_t* b) {
  const up_def_t* d = b->data;
  const tpu_view_t* go;
  const int64_t *os, *is;
  int olen, ilen;
  bool ac = false;
  double scales[3] = {0, 0, 0};
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 1, &os, &olen));
  TPU_RETURN_IF_ERROR(tpu__arg_intlist(b, 2, &is, &ilen));
  int ai = 3;
  if (has_align(d->mode)) TPU_RETURN_IF_ERROR(tpu__arg_bool(b, ai++, &ac));
  for (int k = 0; k < d->sdim; ++k) TPU_RETURN_IF_ERROR(tpu__arg_double_opt(b, ai + k, 0.0, &scales[k]));
  int64_t in[5] = {0, 0, 0, 0, 0};
  for (int k = 0; k < ilen && k < 5; ++k) in[k] = is[k];
  TPU_RETURN_IF_ERROR(common_check(b, d->sdim, ilen, in, olen, os));
  int nd = d->sdim + 2;
  if (go->ndim != nd)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "Expected grad_output to be a tensor of dimension %d but got: dimension %d",
                    nd, go->ndim);
  for (int k = 0; k < nd; ++k) {
    int64_t want = k < 2 ? in[k] : os[k - 2];
    if (go->sizes[k] != want)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "Expected grad_output to have the same shape as output; output.size(%d) = %lld but got "
                      "grad_output.size(%d) = %lld", k, (long long)want, k, (long long)go->sizes[k]);
  }
  for (int k = 0; k < 2; ++k)
    if (in[k] < 0) return tpu__err(b, TPU_INVALID_ARGUMENT, "input_size must be non-negative");
  if (!dtype_ok(d, go->dtype)) return tpu__err_not_implemented_for(b, b->name, go->dtype);
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, go));
  n->kind = TPU_KIND_UPSAMPLE_BACKWARD;
  n->compute = tpu__compute_dtype(go->dtype);
  set_attrs(n, d, ac, scales);
  tpu__node_add_output(n, go->dtype, nd, in);
  return NULL;
}

/* ---- grid sampling ------------------------------------------------------------------ */

/* check_grid_sampler_common + check_grid_sampler_2d, and the mode ranges. */
static tpu_status_t grid_check(tpu_build_t* b, const tpu_view_t* x, const tpu_view_t* g, int64_t interp,
                               int64_t pad) {
  char s1[256], s2[256];
  tpu__fmt_shape(s1, sizeof s1, x->ndim, x->sizes);
  tpu__fmt_shape(s2, sizeof s2, g->ndim, g->sizes);
  if (x->ndim < 1 || g->ndim < 1 || x->sizes[0] != g->sizes[0])
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "grid_sampler(): expected grid and input to have same batch size, but got input with sizes "
                    "%s and grid with sizes %s", s1, s2);
  if (g->sizes[g->ndim - 1] != x->ndim - 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "grid_sampler(): expected grid to have size %d in last dimension, but got grid with sizes %s",
                    x->ndim - 2, s2);
  for (int i = 2; i < x->ndim; ++i)
    if (x->sizes[i] <= 0)
      return tpu__err(b, TPU_INVALID_ARGUMENT,
                      "grid_sampler(): expected input to have non-empty spatial dimensions, but input has sizes "
                      "%s with dimension %d being empty", s1, i);
  if (x->ndim != 4 || g->ndim != 4)
    return tpu__err(b, TPU_INVALID_ARGUMENT,
                    "grid_sampler(): expected 4D input and grid with same number of dimensions, but got input "
                    "with sizes %s and grid with sizes %s", s1, s2);
  if (interp < 0 || interp > 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "grid_sampler(): unknown interpolation mode %lld", (long long)interp);
  if (pad < 0 || pad > 2)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "grid_sampler(): unknown padding mode %lld", (long long)pad);
  if (!tpu_dtype_is_floating(x->dtype)) return tpu__err_not_implemented_for(b, "grid_sampler_2d", x->dtype);
  if (g->dtype != x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", tpu__dtype_c10_name(x->dtype),
                    tpu__dtype_c10_name(g->dtype));
  return NULL;
}

/* (input, grid, interpolation_mode, padding_mode, align_corners) from argument `first` on,
 * checked. */
static tpu_status_t grid_args(tpu_build_t* b, int first, const tpu_view_t** x, const tpu_view_t** g,
                              int64_t* interp, int64_t* pad, bool* ac) {
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, first, x));
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, first + 1, g));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, first + 2, interp));
  TPU_RETURN_IF_ERROR(tpu__arg_int(b, first + 3, pad));
  TPU_RETURN_IF_ERROR(tpu__arg_bool(b, first + 4, ac));
  return grid_check(b, *x, *g, *interp, *pad);
}

/* grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners) */
static tpu_status_t build_grid_sampler(tpu_build_t* b) {
  const tpu_view_t *x, *g;
  int64_t interp, pad;
  bool ac;
  TPU_RETURN_IF_ERROR(grid_args(b, 0, &x, &g, &interp, &pad, &ac));
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  n->kind = TPU_KIND_GRID_SAMPLER_2D;
  n->compute = tpu__compute_dtype(x->dtype);
  n->ia[0] = interp;
  n->ia[1] = pad;
  n->ia[2] = ac;
  int64_t shape[4] = {x->sizes[0], x->sizes[1], g->sizes[1], g->sizes[2]};
  tpu__node_add_output(n, x->dtype, 4, shape);
  return NULL;
}

/* grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode,
 * align_corners, output_mask) -> (grad_input, grad_grid). grad_input is absent (an
 * undefined tensor) when output_mask[0] is false; grad_grid is always computed, as on CPU. */
static tpu_status_t build_grid_sampler_backward(tpu_build_t* b) {
  const tpu_view_t *go, *x, *g;
  int64_t interp, pad;
  bool ac, mask[2];
  TPU_RETURN_IF_ERROR(tpu__arg_tensor(b, 0, &go));
  TPU_RETURN_IF_ERROR(grid_args(b, 1, &x, &g, &interp, &pad, &ac));
  TPU_RETURN_IF_ERROR(tpu__arg_bool_mask(b, 6, 2, mask));
  int64_t want[4] = {x->sizes[0], x->sizes[1], g->sizes[1], g->sizes[2]};
  bool same = go->ndim == 4;
  for (int i = 0; same && i < 4; ++i) same = go->sizes[i] == want[i];
  if (!same) {
    char s1[256], s2[256];
    tpu__fmt_shape(s1, sizeof s1, 4, want);
    tpu__fmt_shape(s2, sizeof s2, go->ndim, go->sizes);
    return tpu__err(b, TPU_VALUE_ERROR,
                    "grid_sampler(): expected grad_output to have sizes %s but got grad_output with sizes %s", s1, s2);
  }
  if (go->dtype != x->dtype)
    return tpu__err(b, TPU_INVALID_ARGUMENT, "expected scalar type %s but found %s", tpu__dtype_c10_name(x->dtype),
                    tpu__dtype_c10_name(go->dtype));
  tpu_node_t* n = b->node;
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, go));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, x));
  TPU_RETURN_IF_ERROR(tpu__node_add_input(n, g));
  n->kind = TPU_KIND_GRID_SAMPLER_2D_BACKWARD;
  n->compute = tpu__compute_dtype(x->dtype);
  n->ia[0] = interp;
  n->ia[1] = pad;
  n->ia[2] = ac;
  n->ia[3] = mask[0];
  if (mask[0]) tpu__node_add_output(n, x->dtype, 4, x->sizes);
  else tpu__node_add_output(n, x->dtype, -1, NULL);
  tpu__node_add_output(n, g->dtype, 4, g->sizes);
  return NULL;
}

/* One definition per (mode, dims, direction, overload family). */
#define UPDEF(id, mode, sdim) \
  static const up_def_t k_##id = {mode, sdim, false, false}; \
  static const up_def_t k_##id##_vec = {mode, sdim, false, true}; \
  static const up_def_t k_##id##_bw = {mode, sdim, true, false};
UPDEF(near1, UP_NEAREST, 1)
UPDEF(near2, UP_NEAREST, 2)
UPDEF(near3, UP_NEAREST, 3)
UPDEF(nex1, UP_NEAREST_EXACT, 1)
UPDEF(nex2, UP_NEAREST_EXACT, 2)
UPDEF(nex3, UP_NEAREST_EXACT, 3)
UPDEF(lin1, UP_LINEAR, 1)
UPDEF(lin2, UP_LINEAR, 2)
UPDEF(lin3, UP_LINEAR, 3)
UPDEF(cub2, UP_CUBIC, 2)
UPDEF(aal2, UP_AA_LINEAR, 2)
UPDEF(aac2, UP_AA_CUBIC, 2)
#undef UPDEF

/* name -> forward (functional, out, vec) and backward (functional, grad_input). The .vec
 * overloads are CompositeImplicitAutograd in recent PyTorch (the adapter skips those);
 * .vec_out exists for nearest2d and bilinear2d only, and reaches the backend. */
#define UPFAM(name, id)                                          \
  {name, build_upsample, &k_##id},                               \
  {name ".out", build_upsample, &k_##id},                        \
  {name ".vec", build_upsample, &k_##id##_vec},                  \
  {name "_backward", build_upsample_backward, &k_##id##_bw},     \
  {name "_backward.grad_input", build_upsample_backward, &k_##id##_bw},

const tpu_aten_entry_t tpu__aten_resample[] = {
    UPFAM("upsample_nearest1d", near1)
    UPFAM("upsample_nearest2d", near2)
    {"upsample_nearest2d.vec_out", build_upsample, &k_near2_vec},
    UPFAM("upsample_nearest3d", near3)
    UPFAM("_upsample_nearest_exact1d", nex1)
    UPFAM("_upsample_nearest_exact2d", nex2)
    UPFAM("_upsample_nearest_exact3d", nex3)
    UPFAM("upsample_linear1d", lin1)
    UPFAM("upsample_bilinear2d", lin2)
    {"upsample_bilinear2d.vec_out", build_upsample, &k_lin2_vec},
    UPFAM("upsample_trilinear3d", lin3)
    UPFAM("upsample_bicubic2d", cub2)
    UPFAM("_upsample_bilinear2d_aa", aal2)
    UPFAM("_upsample_bicubic2d_aa", aac2)
    {"grid_sampler_2d", build_grid_sampler, NULL},
    {"grid_sampler_2d.out", build_grid_sampler, NULL},
    {"grid_sampler_2d_backward", build_grid_sampler_backward, NULL},
    {"grid_sampler_2d_backward.out", build_grid_sampler_backward, NULL},
    {NULL, NULL, NULL},
};
#undef UPFAM
