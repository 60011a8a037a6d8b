/* Kernels of the norm family. Every one accumulates in float64 and rounds once on store (at
 * least as accurate as ATen's float32 opmath for f32/bf16/f16 inputs). Operands are packed
 * into dense float64 scratch, except batch norm's activations, which are read (and written)
 * in place when they are dense float32 and otherwise packed the same way.
 *
 * Node layouts (set by aten/norm.c):
 *   BATCH_NORM            in: x, w?, b?, running_mean?, running_var?
 *                         ia[0] training, da[0] momentum, da[1] eps
 *   BATCH_NORM_BACKWARD   in: grad, x, w?, running_mean?, running_var?, save_mean?, save_invstd?
 *                         ia[0] training, da[1] eps
 *   WEIGHT_NORM           in: v, g                      ia[0] dim     out: w, norms
 *   WEIGHT_NORM_BACKWARD  in: grad_w, v, g, norms       ia[0] dim     out: grad_v, grad_g
 *   GROUP_NORM            in: x, w?, b?                 ia[0..3] N, C, HxW, group; da[0] eps
 *                         out: y, mean (N, group), rstd (N, group)
 *   GROUP_NORM_BACKWARD   in: dy, x, mean, rstd, w?     ia[0..3] N, C, HxW, group
 *                         out: dx?, dw?, db? (absent when output_mask says so) */
#include <math.h>

#include "host/host.h"
#include "host/vmath.h"

typedef struct { int64_t n, c, inner; } bn_shape_t;

static bn_shape_t shape_of(const tpu_operand_t* x) {
  bn_shape_t s = {x->sizes[0], x->sizes[1], 1};
  for (int d = 2; d < x->ndim; ++d) s.inner *= x->sizes[d];
  return s;
}

static bool present(const tpu_operand_t* op) { return op->value != NULL; }

/* Packs an optional per-channel vector to double; fills `dflt` when absent. */
static double* channel_vec(const tpu_operand_t* op, int64_t c, double dflt) {
  double* v = tpu__malloc(sizeof(double) * (size_t)(c ? c : 1));
  if (!v) return NULL;
  if (present(op) && tpu__operand_numel(op) == c) tpu__pack(op, NULL, TPU_DTYPE_F64, v);
  else for (int64_t i = 0; i < c; ++i) v[i] = dflt;
  return v;
}

/* Batch norm's [N, C, inner] activations, dense: float32 in place when every activation
 * operand of the node is dense float32, else float64 (a packed copy / scratch that is
 * unpacked). */
typedef struct { char* p; bool f32; void* owned; } bn_data_t;

static bool bn_in(const tpu_operand_t* op, bool f32, bn_data_t* d) {
  d->f32 = f32;
  d->p = (char*)tpu__dense_in(op, f32 ? TPU_DTYPE_F32 : TPU_DTYPE_F64, &d->owned);
  return d->p != NULL;
}

static bool bn_out(const tpu_node_t* n, tpu_operand_t* op, bool f32, bn_data_t* d) {
  d->f32 = f32;
  d->p = tpu__dense_out(n, op, f32 ? TPU_DTYPE_F32 : TPU_DTYPE_F64, false, &d->owned);
  return d->p != NULL;
}

static void bn_out_done(tpu_operand_t* op, bn_data_t* d) {
  tpu__dense_out_done(op, d->owned, d->f32 ? TPU_DTYPE_F32 : TPU_DTYPE_F64);
}

/* Runs of one channel in one image, in float64, eight lanes wide (a scalar `s += x` is a
 * chain of dependent adds):
 *   bn_sum    sum of x, or of (x - m)^2 (dev)
 *   bn_gsums  sums of g and of g * (x - m)
 *   bn_lin    y = a * g + b * (x - m) + c (x NULL: y = a * g + c) */
#define BN_RUNS(T, SFX)                                                                        \
  TPU_ISA_CLONES static double bn_sum_##SFX(const T* x, int64_t n, bool dev, double m) {      \
    if (!dev) return tpu__v8_sum_##SFX(x, n);                                                  \
    v8d a0 = V8D_ZERO, a1 = V8D_ZERO;                                                          \
    int64_t i = 0;                                                                             \
    for (; i + 16 <= n; i += 16) {                                                             \
      v8d u = v8_subs(ld8_##SFX(x + i), m), v = v8_subs(ld8_##SFX(x + i + 8), m);               \
      a0 = v8_add(a0, v8_mul(u, u));                                                           \
      a1 = v8_add(a1, v8_mul(v, v));                                                           \
    }                                                                                          \
    double s = v8_total(v8_add(a0, a1));                                                       \
    for (; i < n; ++i) s += ((double)x[i] - m) * ((double)x[i] - m);                           \
    return s;                                                                                  \
  }                                                                                            \
  TPU_ISA_CLONES static void bn_gsums_##SFX(const T* g, const T* x, int64_t n, double m, double* sg, \
                                            double* sgx) {                                    \
    v8d a = V8D_ZERO, b = V8D_ZERO;                                                            \
    int64_t i = 0;                                                                             \
    for (; i + 8 <= n; i += 8) {                                                               \
      v8d gv = ld8_##SFX(g + i);                                                               \
      a = v8_add(a, gv);                                                                       \
      b = v8_add(b, v8_mul(gv, v8_subs(ld8_##SFX(x + i), m)));                                 \
    }                                                                                          \
    double s1 = v8_total(a), s2 = v8_total(b);                                                 \
    for (; i < n; ++i) { s1 += g[i]; s2 += (double)g[i] * ((double)x[i] - m); }                \
    *sg += s1; *sgx += s2;                                                                     \
  }                                                                                            \
  TPU_ISA_CLONES static void bn_lin_##SFX(const T* g, const T* x, T* y, int64_t n, double a, double b, \
                                          double m, double c) {                               \
    int64_t i = 0;                                                                             \
    if (x) {                                                                                   \
      for (; i + 8 <= n; i += 8)                                                               \
        st8_##SFX(y + i, v8_adds(v8_add(v8_muls(ld8_##SFX(g + i), a), v8_muls(v8_subs(ld8_##SFX(x + i), m), b)), c)); \
      for (; i < n; ++i) y[i] = (T)((double)g[i] * a + ((double)x[i] - m) * b + c);            \
    } else {                                                                                   \
      for (; i + 8 <= n; i += 8) st8_##SFX(y + i, v8_adds(v8_muls(ld8_##SFX(g + i), a), c));   \
      for (; i < n; ++i) y[i] = (T)((double)g[i] * a + c);                                     \
    }                                                                                          \
  }
BN_RUNS(float, f32)
BN_RUNS(double, f64)

static double bn_sum(const bn_data_t* d, int64_t o, int64_t n, bool dev, double m) {
  return d->f32 ? bn_sum_f32((const float*)d->p + o, n, dev, m) : bn_sum_f64((const double*)d->p + o, n, dev, m);
}
static void bn_gsums(const bn_data_t* g, const bn_data_t* x, int64_t o, int64_t n, double m, double* sg, double* sgx) {
  if (g->f32) bn_gsums_f32((const float*)g->p + o, (const float*)x->p + o, n, m, sg, sgx);
  else bn_gsums_f64((const double*)g->p + o, (const double*)x->p + o, n, m, sg, sgx);
}
static void bn_lin(const bn_data_t* g, const bn_data_t* x, const bn_data_t* y, int64_t o, int64_t n, double a,
                   double b, double m, double c) {
  if (g->f32) bn_lin_f32((const float*)g->p + o, x ? (const float*)x->p + o : NULL, (float*)y->p + o, n, a, b, m, c);
  else bn_lin_f64((const double*)g->p + o, x ? (const double*)x->p + o : NULL, (double*)y->p + o, n, a, b, m, c);
}

/* One batch norm node's data; channels are independent, so kernels run over the pool in
 * ranges of channels. */
typedef struct bn_job_s {
  bn_shape_t s;
  bool training;
  double momentum, eps;
  bn_data_t x, y, g; /* forward: x -> y; backward: g, x -> y (grad_input, when wanted) */
  double *w, *bias, *rmean, *rvar, *mean, *invstd, *gw, *gb;
} bn_job_t;

static tpu_status_t bn_run_channels(const bn_job_t* j, tpu_parallel_fn fn) {
  int64_t per = j->s.n * j->s.inner;
  return j->s.c > 1 && per * j->s.c >= TPU_PARALLEL_MIN_WORK
             ? tpu__parallel_for(j->s.c, TPU_PARALLEL_MIN_WORK / (per ? per : 1) + 1, fn, (void*)j)
             : fn((void*)j, 0, j->s.c, 0);
}

static tpu_status_t bn_fwd_channels(void* arg, int64_t cb, int64_t ce, int tid) {
  const bn_job_t* j = arg;
  bn_shape_t s = j->s;
  int64_t count = s.n * s.inner;
  for (int64_t ch = cb; ch < ce; ++ch) {
    if (j->training) {
      /* two passes: the mean, then squared deviations from it */
      double sum = 0, ssd = 0;
      for (int64_t b = 0; b < s.n; ++b) sum += bn_sum(&j->x, (b * s.c + ch) * s.inner, s.inner, false, 0);
      double m = sum / (double)count;
      for (int64_t b = 0; b < s.n; ++b) ssd += bn_sum(&j->x, (b * s.c + ch) * s.inner, s.inner, true, m);
      j->mean[ch] = m;
      j->invstd[ch] = 1.0 / sqrt(ssd / (double)count + j->eps);
      /* running statistics take the unbiased variance */
      j->rmean[ch] = (1 - j->momentum) * j->rmean[ch] + j->momentum * m;
      j->rvar[ch] = (1 - j->momentum) * j->rvar[ch] + j->momentum * ssd / (double)(count > 1 ? count - 1 : 1);
    } else {
      j->mean[ch] = j->rmean[ch];
      j->invstd[ch] = 1.0 / sqrt(j->rvar[ch] + j->eps);
    }
    double scale = j->invstd[ch] * j->w[ch], shift = j->bias[ch] - j->mean[ch] * scale;
    for (int64_t b = 0; b < s.n; ++b) bn_lin(&j->x, NULL, &j->y, (b * s.c + ch) * s.inner, s.inner, scale, 0, 0, shift);
  }
  return NULL;
}

static tpu_status_t bn_forward(tpu_node_t* n) {
  const tpu_operand_t* x = &n->in[0];
  bn_job_t j = {.s = shape_of(x), .training = n->ia[0], .momentum = n->da[0], .eps = n->da[1]};
  int64_t c = j.s.c;
  size_t cb = sizeof(double) * (size_t)(c ? c : 1);
  bool f32 = x->dtype == TPU_DTYPE_F32 && n->out[0].dtype == TPU_DTYPE_F32;
  bool have = bn_in(x, f32, &j.x) && bn_out(n, &n->out[0], f32, &j.y);
  j.w = channel_vec(&n->in[1], c, 1.0);
  j.bias = channel_vec(&n->in[2], c, 0.0);
  j.rmean = channel_vec(&n->in[3], c, 0.0);
  j.rvar = channel_vec(&n->in[4], c, 1.0);
  j.mean = tpu__malloc(cb);
  j.invstd = tpu__malloc(cb);
  tpu_status_t st = NULL;
  if (!have || !j.w || !j.bias || !j.rmean || !j.rvar || !j.mean || !j.invstd) { st = TPU_HOST_NOMEM(); goto done; }
  if ((st = bn_run_channels(&j, bn_fwd_channels))) goto done;
  bn_out_done(&n->out[0], &j.y);
  if (j.training) {
    tpu__unpack(&n->out[1], j.mean, TPU_DTYPE_F64);
    tpu__unpack(&n->out[2], j.invstd, TPU_DTYPE_F64);
    /* ATen's batch norm updates the running statistics in place. */
    if (present(&n->in[3])) tpu__unpack(&n->in[3], j.rmean, TPU_DTYPE_F64);
    if (present(&n->in[4])) tpu__unpack(&n->in[4], j.rvar, TPU_DTYPE_F64);
  }
done:
  tpu__free(j.x.owned); tpu__free(j.y.owned); tpu__free(j.w); tpu__free(j.bias); tpu__free(j.rmean);
  tpu__free(j.rvar); tpu__free(j.mean); tpu__free(j.invstd);
  return st;
}

/* grad_bias = sum g, grad_weight = sum g * xhat; grad_input (training) =
 * w * invstd * (g - mean(g) - xhat * mean(g * xhat)), (eval) w * invstd * g. */
static tpu_status_t bn_bwd_channels(void* arg, int64_t cb, int64_t ce, int tid) {
  const bn_job_t* j = arg;
  bn_shape_t s = j->s;
  double count = (double)(s.n * s.inner);
  for (int64_t ch = cb; ch < ce; ++ch) {
    double sg = 0, sgx = 0, m = j->mean[ch], iv = j->invstd[ch];
    for (int64_t b = 0; b < s.n; ++b) bn_gsums(&j->g, &j->x, (b * s.c + ch) * s.inner, s.inner, m, &sg, &sgx);
    j->gb[ch] = sg;
    j->gw[ch] = sgx * iv;
    if (!j->y.p) continue;
    double k = iv * j->w[ch];
    for (int64_t b = 0; b < s.n; ++b) {
      int64_t o = (b * s.c + ch) * s.inner;
      if (j->training) bn_lin(&j->g, &j->x, &j->y, o, s.inner, k, -k * iv * iv * sgx / count, m, -k * sg / count);
      else bn_lin(&j->g, NULL, &j->y, o, s.inner, k, 0, 0, 0);
    }
  }
  return NULL;
}

/* Inputs: grad, input, weight?, running_mean?, running_var?, save_mean?, save_invstd?. */
static tpu_status_t bn_backward(tpu_node_t* n) {
  const tpu_operand_t* x = &n->in[1];
  bn_job_t j = {.s = shape_of(x), .training = n->ia[0], .eps = n->da[1]};
  int64_t c = j.s.c;
  bool want_gi = !tpu__output_absent(&n->out[0]);
  bool f32 = x->dtype == TPU_DTYPE_F32 && n->in[0].dtype == TPU_DTYPE_F32 &&
             (!want_gi || n->out[0].dtype == TPU_DTYPE_F32);
  bool have = bn_in(&n->in[0], f32, &j.g) && bn_in(x, f32, &j.x) && (!want_gi || bn_out(n, &n->out[0], f32, &j.y));
  j.w = channel_vec(&n->in[2], c, 1.0);
  j.mean = channel_vec(j.training ? &n->in[5] : &n->in[3], c, 0.0);
  j.invstd = channel_vec(j.training ? &n->in[6] : &n->in[4], c, 1.0);
  j.gw = tpu__calloc((size_t)(c ? c : 1), sizeof(double));
  j.gb = tpu__calloc((size_t)(c ? c : 1), sizeof(double));
  tpu_status_t st = NULL;
  if (!have || !j.w || !j.mean || !j.invstd || !j.gw || !j.gb) { st = TPU_HOST_NOMEM(); goto done; }
  if (!j.training)
    for (int64_t ch = 0; ch < c; ++ch) j.invstd[ch] = 1.0 / sqrt(j.invstd[ch] + j.eps); /* it held var */
  if ((st = bn_run_channels(&j, bn_bwd_channels))) goto done;
  if (want_gi) bn_out_done(&n->out[0], &j.y);
  if (!tpu__output_absent(&n->out[1])) tpu__unpack(&n->out[1], j.gw, TPU_DTYPE_F64);
  if (!tpu__output_absent(&n->out[2])) tpu__unpack(&n->out[2], j.gb, TPU_DTYPE_F64);
done:
  tpu__free(j.g.owned); tpu__free(j.x.owned); tpu__free(j.y.owned); tpu__free(j.w); tpu__free(j.mean);
  tpu__free(j.invstd); tpu__free(j.gw); tpu__free(j.gb);
  return st;
}

/* ---- weight norm ------------------------------------------------------------------- */

/* v seen as [outer, d, inner] around the kept dim: the norm of slice j runs over outer
 * and inner. */
typedef struct { int64_t outer, d, inner; } wn_shape_t;

static wn_shape_t wn_shape_of(const tpu_operand_t* v, int dim) {
  wn_shape_t s = {1, v->sizes[dim], 1};
  for (int i = 0; i < dim; ++i) s.outer *= v->sizes[i];
  for (int i = dim + 1; i < v->ndim; ++i) s.inner *= v->sizes[i];
  return s;
}

static size_t cnt1(int64_t n) { return n > 0 ? (size_t)n : 1; }

/* w = v * (g / ||v||); an empty v gives zero norms, as on CPU. */
static tpu_status_t wn_forward(tpu_node_t* n) {
  const tpu_operand_t* v = &n->in[0];
  wn_shape_t s = wn_shape_of(v, (int)n->ia[0]);
  double* vd = tpu__pack_alloc(v, TPU_DTYPE_F64);
  double* scale = tpu__pack_alloc(&n->in[1], TPU_DTYPE_F64);
  double* norm = tpu__calloc(cnt1(s.d), sizeof(double));
  tpu_status_t st = NULL;
  if (!vd || !scale || !norm) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j = 0; j < s.d; ++j) {
      const double* p = vd + (o * s.d + j) * s.inner;
      double acc = 0;
      for (int64_t i = 0; i < s.inner; ++i) acc += p[i] * p[i];
      norm[j] += acc;
    }
  for (int64_t j = 0; j < s.d; ++j) {
    norm[j] = sqrt(norm[j]);
    scale[j] /= norm[j];
  }
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j = 0; j < s.d; ++j) {
      double* p = vd + (o * s.d + j) * s.inner;
      for (int64_t i = 0; i < s.inner; ++i) p[i] *= scale[j];
    }
  tpu__unpack(&n->out[0], vd, TPU_DTYPE_F64);
  tpu__unpack(&n->out[1], norm, TPU_DTYPE_F64);
done:
  tpu__free(vd); tpu__free(scale); tpu__free(norm);
  return st;
}

/* With s_j = sum(grad_w * v) over slice j: grad_g = s / norm and
 * grad_v = (g / norm) * grad_w - (g * s / norm^3) * v, ATen's formulas. */
static tpu_status_t wn_backward(tpu_node_t* n) {
  const tpu_operand_t* v = &n->in[1];
  wn_shape_t s = wn_shape_of(v, (int)n->ia[0]);
  double* gw = tpu__pack_alloc(&n->in[0], TPU_DTYPE_F64);
  double* vd = tpu__pack_alloc(v, TPU_DTYPE_F64);
  double* g = tpu__pack_alloc(&n->in[2], TPU_DTYPE_F64);
  double* norm = tpu__pack_alloc(&n->in[3], TPU_DTYPE_F64);
  double* sum = tpu__calloc(cnt1(s.d), sizeof(double));
  tpu_status_t st = NULL;
  if (!gw || !vd || !g || !norm || !sum) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j = 0; j < s.d; ++j) {
      const double* gp = gw + (o * s.d + j) * s.inner;
      const double* vp = vd + (o * s.d + j) * s.inner;
      double acc = 0;
      for (int64_t i = 0; i < s.inner; ++i) acc += gp[i] * vp[i];
      sum[j] += acc;
    }
  /* sum becomes grad_g, g becomes a = g / norm, norm becomes b = a * grad_g / norm */
  for (int64_t j = 0; j < s.d; ++j) {
    sum[j] /= norm[j];
    g[j] /= norm[j];
    norm[j] = g[j] * sum[j] / norm[j];
  }
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j = 0; j < s.d; ++j) {
      double* gp = gw + (o * s.d + j) * s.inner;
      const double* vp = vd + (o * s.d + j) * s.inner;
      for (int64_t i = 0; i < s.inner; ++i) gp[i] = g[j] * gp[i] - norm[j] * vp[i];
    }
  tpu__unpack(&n->out[0], gw, TPU_DTYPE_F64);
  tpu__unpack(&n->out[1], sum, TPU_DTYPE_F64);
done:
  tpu__free(gw); tpu__free(vd); tpu__free(g); tpu__free(norm); tpu__free(sum);
  return st;
}

/* ---- group norm ---------------------------------------------------------------------- */

/* Dense (N, C, HxW) data: row r = n * group + k is the contiguous block of the
 * C / group channels of group k in sample n. */
typedef struct gn_s {
  double* x;       /* forward: x, overwritten with y; backward: x */
  double* dy;      /* backward: dy, overwritten with dx */
  const double *w, *b;
  double *mean, *rstd;
  double *ds, *db; /* backward: per (n, c) sums of dy * x and dy */
  int64_t c, hw, groups, d;
  double eps;
  bool want_dx;
} gn_t;

static tpu_status_t gn_fwd_rows(void* arg, int64_t r0, int64_t r1, int tid) {
  gn_t* G = arg;
  int64_t m = G->d * G->hw;
  for (int64_t r = r0; r < r1; ++r) {
    double* p = G->x + r * m;
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < m; ++i) sum += p[i];
    double mean = sum / (double)m;
    for (int64_t i = 0; i < m; ++i) sq += (p[i] - mean) * (p[i] - mean);
    double var = sq / (double)m;
    double rstd = 1.0 / sqrt((var > 0 ? var : 0) + G->eps);
    G->mean[r] = mean;
    G->rstd[r] = rstd;
    int64_t c0 = (r % G->groups) * G->d;
    for (int64_t c = 0; c < G->d; ++c) {
      double scale = rstd * (G->w ? G->w[c0 + c] : 1.0);
      double shift = (G->b ? G->b[c0 + c] : 0.0) - mean * scale;
      double* q = p + c * G->hw;
      for (int64_t i = 0; i < G->hw; ++i) q[i] = q[i] * scale + shift;
    }
  }
  return NULL;
}

static tpu_status_t gn_forward(tpu_node_t* n) {
  const tpu_operand_t* x = &n->in[0];
  int64_t N = n->ia[0], C = n->ia[1], HW = n->ia[2], groups = n->ia[3], rows = N * groups;
  gn_t G = {0};
  G.c = C; G.hw = HW; G.groups = groups; G.d = C / groups; G.eps = n->da[0];
  void* buf[5] = {0};
  G.mean = buf[0] = tpu__malloc(sizeof(double) * cnt1(rows));
  G.rstd = buf[1] = tpu__malloc(sizeof(double) * cnt1(rows));
  bool has_w = present(&n->in[1]), has_b = present(&n->in[2]);
  G.w = has_w ? (buf[2] = tpu__pack_alloc(&n->in[1], TPU_DTYPE_F64)) : NULL;
  G.b = has_b ? (buf[3] = tpu__pack_alloc(&n->in[2], TPU_DTYPE_F64)) : NULL;
  G.x = buf[4] = tpu__pack_alloc(x, TPU_DTYPE_F64);
  tpu_status_t st = NULL;
  if (!G.mean || !G.rstd || (has_w && !G.w) || (has_b && !G.b) || !G.x) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t total = tpu__operand_numel(x);
  if (total == 0) {
    /* ATen: zero means and NaN rstd for an empty input */
    for (int64_t r = 0; r < rows; ++r) { G.mean[r] = 0; G.rstd[r] = NAN; }
  } else {
    st = rows > 1 && total >= TPU_PARALLEL_MIN_WORK
             ? tpu__parallel_for(rows, TPU_PARALLEL_MIN_WORK / cnt1(total / rows) + 1, gn_fwd_rows, &G)
             : gn_fwd_rows(&G, 0, rows, 0);
    if (st) goto done;
    tpu__unpack(&n->out[0], G.x, TPU_DTYPE_F64);
  }
  tpu__unpack(&n->out[1], G.mean, TPU_DTYPE_F64);
  tpu__unpack(&n->out[2], G.rstd, TPU_DTYPE_F64);
done:
  for (int i = 0; i < 5; ++i) tpu__free(buf[i]);
  return st;
}

/* Per row (n, group k) with M = d * HxW elements, xhat = (x - mean) * rstd and per-channel
 * sums ds_c = sum(dy * x), db_c = sum(dy):
 *   dx = rstd * w_c * dy - rstd * db_k / M - (x - mean) * rstd^3 * (ds_k - mean * db_k) / M
 * where ds_k = sum_c w_c ds_c and db_k = sum_c w_c db_c (the layer-norm formula over the
 * group, with the per-channel weight inside). */
static tpu_status_t gn_bwd_rows(void* arg, int64_t r0, int64_t r1, int tid) {
  gn_t* G = arg;
  int64_t m = G->d * G->hw;
  for (int64_t r = r0; r < r1; ++r) {
    int64_t nn = r / G->groups, c0 = (r % G->groups) * G->d;
    double* dy = G->dy + r * m;
    const double* x = G->x + r * m;
    double dsk = 0, dbk = 0;
    for (int64_t c = 0; c < G->d; ++c) {
      const double* dp = dy + c * G->hw;
      const double* xp = x + c * G->hw;
      double s = 0, t = 0;
      for (int64_t i = 0; i < G->hw; ++i) {
        s += dp[i] * xp[i];
        t += dp[i];
      }
      G->ds[nn * G->c + c0 + c] = s;
      G->db[nn * G->c + c0 + c] = t;
      double wc = G->w ? G->w[c0 + c] : 1.0;
      dsk += s * wc;
      dbk += t * wc;
    }
    if (!G->want_dx) continue;
    double mean = G->mean[r], rstd = G->rstd[r];
    double k2 = rstd * rstd * rstd * (dsk - mean * dbk) / (double)m;
    double k3 = rstd * dbk / (double)m;
    for (int64_t c = 0; c < G->d; ++c) {
      double k1 = rstd * (G->w ? G->w[c0 + c] : 1.0);
      double* dp = dy + c * G->hw;
      const double* xp = x + c * G->hw;
      for (int64_t i = 0; i < G->hw; ++i) dp[i] = k1 * dp[i] - k3 - (xp[i] - mean) * k2;
    }
  }
  return NULL;
}

static tpu_status_t gn_backward(tpu_node_t* n) {
  int64_t N = n->ia[0], C = n->ia[1], HW = n->ia[2], groups = n->ia[3], rows = N * groups;
  bool want_dx = !tpu__output_absent(&n->out[0]), want_dw = !tpu__output_absent(&n->out[1]),
       want_db = !tpu__output_absent(&n->out[2]);
  int64_t total = tpu__operand_numel(&n->in[1]);
  void* buf[9] = {0};
  gn_t G = {0};
  tpu_status_t st = NULL;
  double* dw = buf[0] = tpu__calloc(cnt1(C), sizeof(double));
  double* dbias = buf[1] = tpu__calloc(cnt1(C), sizeof(double));
  if (!dw || !dbias) { st = TPU_HOST_NOMEM(); goto done; }
  if (total == 0) {
    /* ATen: zero gradients for an empty input (dx is empty itself) */
    if (want_dw) tpu__unpack(&n->out[1], dw, TPU_DTYPE_F64);
    if (want_db) tpu__unpack(&n->out[2], dbias, TPU_DTYPE_F64);
    goto done;
  }
  G.c = C; G.hw = HW; G.groups = groups; G.d = C / groups; G.want_dx = want_dx;
  bool has_w = present(&n->in[4]);
  G.dy = buf[2] = tpu__pack_alloc(&n->in[0], TPU_DTYPE_F64);
  G.x = buf[3] = tpu__pack_alloc(&n->in[1], TPU_DTYPE_F64);
  G.mean = buf[4] = tpu__pack_alloc(&n->in[2], TPU_DTYPE_F64);
  G.rstd = buf[5] = tpu__pack_alloc(&n->in[3], TPU_DTYPE_F64);
  G.w = has_w ? (buf[6] = tpu__pack_alloc(&n->in[4], TPU_DTYPE_F64)) : NULL;
  G.ds = buf[7] = tpu__malloc(sizeof(double) * cnt1(N * C));
  G.db = buf[8] = tpu__malloc(sizeof(double) * cnt1(N * C));
  if (!G.dy || !G.x || !G.mean || !G.rstd || (has_w && !G.w) || !G.ds || !G.db) { st = TPU_HOST_NOMEM(); goto done; }
  st = rows > 1 && total >= TPU_PARALLEL_MIN_WORK
           ? tpu__parallel_for(rows, TPU_PARALLEL_MIN_WORK / cnt1(total / rows) + 1, gn_bwd_rows, &G)
           : gn_bwd_rows(&G, 0, rows, 0);
  if (st) goto done;
  /* parameter gradients: samples in order, so the result does not depend on threads */
  for (int64_t nn = 0; nn < N; ++nn)
    for (int64_t c = 0; c < C; ++c) {
      int64_t r = nn * groups + c / G.d;
      double ds = G.ds[nn * C + c], db = G.db[nn * C + c];
      dw[c] += (ds - db * G.mean[r]) * G.rstd[r];
      dbias[c] += db;
    }
  if (want_dx) tpu__unpack(&n->out[0], G.dy, TPU_DTYPE_F64);
  if (want_dw) tpu__unpack(&n->out[1], dw, TPU_DTYPE_F64);
  if (want_db) tpu__unpack(&n->out[2], dbias, TPU_DTYPE_F64);
done:
  for (int i = 0; i < 9; ++i) tpu__free(buf[i]);
  return st;
}

void tpu__host_register_norm(tpu_host_kernel_fn* table) {
  table[TPU_KIND_BATCH_NORM] = bn_forward;
  table[TPU_KIND_BATCH_NORM_BACKWARD] = bn_backward;
  table[TPU_KIND_WEIGHT_NORM] = wn_forward;
  table[TPU_KIND_WEIGHT_NORM_BACKWARD] = wn_backward;
  table[TPU_KIND_GROUP_NORM] = gn_forward;
  table[TPU_KIND_GROUP_NORM_BACKWARD] = gn_backward;
}
