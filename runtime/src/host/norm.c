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

/* Batch norm's [N, C, inner] activations, dense: float32 in place when the tensor is
 * dense float32, else float64 (a packed copy / scratch that is unpacked). */
typedef struct { char* p; bool f32; void* owned; } bn_data_t;

static bool bn_in(const tpu_operand_t* op, bn_data_t* d) {
  d->f32 = op->dtype == TPU_DTYPE_F32;
  d->p = (char*)tpu__dense_in(op, d->f32 ? TPU_DTYPE_F32 : TPU_DTYPE_F64, &d->owned);
  return d->p != NULL;
}

static bool bn_out(const tpu_node_t* n, tpu_operand_t* op, bn_data_t* d) {
  d->f32 = op->dtype == TPU_DTYPE_F32;
  d->p = tpu__dense_out(n, op, d->f32 ? TPU_DTYPE_F32 : TPU_DTYPE_F64, false, &d->owned);
  return d->p != NULL;
}

static void bn_out_done(tpu_operand_t* op, bn_data_t* d) {
  tpu__dense_out_done(op, d->owned, d->f32 ? TPU_DTYPE_F32 : TPU_DTYPE_F64);
}

static inline double bn_ld(const bn_data_t* d, int64_t i) {
  return d->f32 ? (double)((const float*)d->p)[i] : ((const double*)d->p)[i];
}

static inline void bn_st(const bn_data_t* d, int64_t i, double v) {
  if (d->f32) ((float*)d->p)[i] = (float)v;
  else ((double*)d->p)[i] = v;
}

/* Per-channel mean and sum of squared deviations. */
static void channel_moments(const bn_data_t* xd, bn_shape_t s, int64_t ch, double* mu, double* ssd) {
  double sum = 0, sq = 0;
  for (int64_t b = 0; b < s.n; ++b) {
    int64_t o = (b * s.c + ch) * s.inner;
    for (int64_t i = 0; i < s.inner; ++i) sum += bn_ld(xd, o + i);
  }
  double m = sum / (double)(s.n * s.inner);
  for (int64_t b = 0; b < s.n; ++b) {
    int64_t o = (b * s.c + ch) * s.inner;
    for (int64_t i = 0; i < s.inner; ++i) sq += (bn_ld(xd, o + i) - m) * (bn_ld(xd, o + i) - m);
  }
  *mu = m;
  *ssd = sq;
}

static tpu_status_t bn_forward(tpu_node_t* n) {
  const tpu_operand_t* x = &n->in[0];
  bn_shape_t s = shape_of(x);
  bool training = n->ia[0];
  double momentum = n->da[0], eps = n->da[1];
  int64_t count = s.n * s.inner;
  size_t cb = sizeof(double) * (size_t)(s.c ? s.c : 1);
  bn_data_t xd = {0}, yd = {0};
  bool have = bn_in(x, &xd) && bn_out(n, &n->out[0], &yd);
  double* w = channel_vec(&n->in[1], s.c, 1.0);
  double* bias = channel_vec(&n->in[2], s.c, 0.0);
  double* rmean = channel_vec(&n->in[3], s.c, 0.0);
  double* rvar = channel_vec(&n->in[4], s.c, 1.0);
  double* mean = tpu__malloc(cb);
  double* invstd = tpu__malloc(cb);
  tpu_status_t st = NULL;
  if (!have || !w || !bias || !rmean || !rvar || !mean || !invstd) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t ch = 0; ch < s.c; ++ch) {
    if (training) {
      double ssd;
      channel_moments(&xd, s, ch, &mean[ch], &ssd);
      invstd[ch] = 1.0 / sqrt(ssd / (double)count + eps);
      /* running statistics take the unbiased variance */
      rmean[ch] = (1 - momentum) * rmean[ch] + momentum * mean[ch];
      rvar[ch] = (1 - momentum) * rvar[ch] + momentum * ssd / (double)(count > 1 ? count - 1 : 1);
    } else {
      mean[ch] = rmean[ch];
      invstd[ch] = 1.0 / sqrt(rvar[ch] + eps);
    }
  }
  for (int64_t b = 0; b < s.n; ++b)
    for (int64_t ch = 0; ch < s.c; ++ch) {
      int64_t o = (b * s.c + ch) * s.inner;
      double scale = invstd[ch] * w[ch], shift = bias[ch] - mean[ch] * scale;
      for (int64_t i = 0; i < s.inner; ++i) bn_st(&yd, o + i, bn_ld(&xd, o + i) * scale + shift);
    }
  bn_out_done(&n->out[0], &yd);
  if (training) {
    tpu__unpack(&n->out[1], mean, TPU_DTYPE_F64);
    tpu__unpack(&n->out[2], invstd, TPU_DTYPE_F64);
    /* ATen's batch norm updates the running statistics in place. */
    if (present(&n->in[3])) tpu__unpack(&n->in[3], rmean, TPU_DTYPE_F64);
    if (present(&n->in[4])) tpu__unpack(&n->in[4], rvar, TPU_DTYPE_F64);
  }
done:
  tpu__free(xd.owned); tpu__free(yd.owned); tpu__free(w); tpu__free(bias); tpu__free(rmean);
  tpu__free(rvar); tpu__free(mean); tpu__free(invstd);
  return st;
}

/* Inputs: grad, input, weight?, running_mean?, running_var?, save_mean?, save_invstd?. */
static tpu_status_t bn_backward(tpu_node_t* n) {
  const tpu_operand_t* x = &n->in[1];
  bn_shape_t s = shape_of(x);
  bool train = n->ia[0];
  double eps = n->da[1];
  int64_t count = s.n * s.inner;
  bool want_gi = !tpu__output_absent(&n->out[0]);
  bn_data_t g = {0}, xd = {0}, gi = {0};
  bool have = bn_in(&n->in[0], &g) && bn_in(x, &xd) && (!want_gi || bn_out(n, &n->out[0], &gi));
  double* w = channel_vec(&n->in[2], s.c, 1.0);
  double* mean = channel_vec(train ? &n->in[5] : &n->in[3], s.c, 0.0);
  double* inv = channel_vec(train ? &n->in[6] : &n->in[4], s.c, 1.0);
  double* gw = tpu__calloc((size_t)(s.c ? s.c : 1), sizeof(double));
  double* gb = tpu__calloc((size_t)(s.c ? s.c : 1), sizeof(double));
  tpu_status_t st = NULL;
  if (!have || !w || !mean || !inv || !gw || !gb) { st = TPU_HOST_NOMEM(); goto done; }
  if (!train)
    for (int64_t ch = 0; ch < s.c; ++ch) inv[ch] = 1.0 / sqrt(inv[ch] + eps); /* inv held var */
  for (int64_t ch = 0; ch < s.c; ++ch) {
    /* local sums: through gb/gw (which may alias gp, xp as far as the compiler knows)
     * every addition was a store and a reload */
    double sb = 0, sw = 0, m = mean[ch], iv = inv[ch];
    for (int64_t b = 0; b < s.n; ++b) {
      int64_t o = (b * s.c + ch) * s.inner;
      for (int64_t i = 0; i < s.inner; ++i) {
        double gv = bn_ld(&g, o + i);
        sb += gv;
        sw += gv * (bn_ld(&xd, o + i) - m) * iv;
      }
    }
    gb[ch] = sb;
    gw[ch] = sw;
  }
  if (want_gi) {
    for (int64_t b = 0; b < s.n; ++b)
      for (int64_t ch = 0; ch < s.c; ++ch) {
        int64_t o = (b * s.c + ch) * s.inner;
        double k = inv[ch] * w[ch];
        if (train) {
          double mg = gb[ch] / (double)count, mgx = gw[ch] / (double)count;
          for (int64_t i = 0; i < s.inner; ++i) {
            double xhat = (bn_ld(&xd, o + i) - mean[ch]) * inv[ch];
            bn_st(&gi, o + i, k * (bn_ld(&g, o + i) - mg - xhat * mgx));
          }
        } else {
          for (int64_t i = 0; i < s.inner; ++i) bn_st(&gi, o + i, k * bn_ld(&g, o + i));
        }
      }
    bn_out_done(&n->out[0], &gi);
  }
  if (!tpu__output_absent(&n->out[1])) tpu__unpack(&n->out[1], gw, TPU_DTYPE_F64);
  if (!tpu__output_absent(&n->out[2])) tpu__unpack(&n->out[2], gb, TPU_DTYPE_F64);
done:
  tpu__free(g.owned); tpu__free(xd.owned); tpu__free(gi.owned); tpu__free(w); tpu__free(mean);
  tpu__free(inv); tpu__free(gw); tpu__free(gb);
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
