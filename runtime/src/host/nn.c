/* Host kernels of the nn family.
 *
 * Node layouts of the padding and window kernels (set by aten/nn.c):
 *   PAD_EDGE           in: self     ia[0] mode (0 reflect, 1 replicate), ia[1] k padded
 *                                   dims; ilist: padding, last dim first (ATen's order)
 *   PAD_EDGE_BACKWARD  in: grad     same attributes; output: grad_input (self's shape)
 *   IM2COL / COL2IM    in: self     ia[0..7] kh, kw, dh, dw, ph, pw, sh, sw; ia[8] batch,
 *                                   ia[9] channels, ia[10..11] image H, W, ia[12..13]
 *                                   sliding blocks along H, W
 *
 * Normalizations and losses pack their operands into float64 scratch and accumulate in
 * float64, then round once on store: for f32/bf16/f16 this is at least as accurate as
 * ATen's float32 accumulation, at the cost of twice the scratch. Attention uses the
 * compute dtype (f32, or f64 for f64) because its cost is in GEMMs. The padding and
 * im2col forwards move elements as bytes; their backwards (pad backward, col2im) are
 * scatter-adds that round to the output dtype after every add, in ATen's order, because
 * ATen's CPU loops add in the tensor's own dtype. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include <cblas.h>

#include "host/host.h"
#include "host/vmath.h"

static int64_t prod(const int64_t* s, int from, int to) {
  int64_t n = 1;
  for (int i = from; i < to; ++i) n *= s[i];
  return n;
}

/* Element count for scratch sizing: never 0, so malloc(0) never reads as failure. */
static size_t cnt1(int64_t n) { return n > 0 ? (size_t)n : 1; }

static bool present(const tpu_operand_t* op) { return op->value || op->is_scalar; }

/* A view of op broadcast to shape (stride 0 along broadcast dims). */
static tpu_operand_t expand(const tpu_operand_t* op, int nd, const int64_t* shape) {
  tpu_operand_t e = *op;
  e.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    int sd = d - (nd - (op->is_scalar ? 0 : op->ndim));
    e.sizes[d] = shape[d];
    e.strides[d] = (!op->is_scalar && sd >= 0 && op->sizes[sd] != 1) ? op->strides[sd] : 0;
  }
  return e;
}

static void* pack_expanded(const tpu_operand_t* op, int nd, const int64_t* shape, tpu_dtype_t dt) {
  tpu_operand_t e = expand(op, nd, shape);
  return tpu__pack_alloc(&e, dt);
}

/* Frees up to 8 scratch buffers (NULL entries are fine). */
static void free_all(void** p, int n) {
  for (int i = 0; i < n; ++i) tpu__free(p[i]);
}

/* ---- layer norm ------------------------------------------------------------------- */

/* Row access to an operand seen as (m, k) rows: a contiguous operand is converted one row
 * at a time (scratch stays O(k)); any other layout is packed or unpacked whole. */
typedef struct rows_s {
  tpu_operand_t* op;
  double* full; /* whole tensor in f64 when op is not contiguous */
  int64_t k;
} rows_t;

static bool rows_open(rows_t* r, tpu_operand_t* op, int64_t m, int64_t k, bool input) {
  r->op = op;
  r->k = k;
  r->full = NULL;
  if (tpu__operand_is_contiguous(op)) return true;
  r->full = input ? tpu__pack_alloc(op, TPU_DTYPE_F64) : tpu__malloc(sizeof(double) * cnt1(m * k));
  return r->full != NULL;
}

static const double* rows_get(const rows_t* r, int64_t i, double* buf) {
  if (r->full) return r->full + i * r->k;
  if (r->op->dtype == TPU_DTYPE_F32) { /* the common case, as a loop that vectorizes */
    const float* src = (const float*)tpu__operand_ptr(r->op) + i * r->k;
    for (int64_t j = 0; j < r->k; ++j) buf[j] = src[j];
    return buf;
  }
  size_t esz = tpu_dtype_size(r->op->dtype);
  tpu__convert_run(buf, TPU_DTYPE_F64, 1, tpu__operand_ptr(r->op) + i * r->k * (int64_t)esz, r->op->dtype, 1, r->k);
  return buf;
}

static void rows_put(rows_t* r, int64_t i, const double* row) {
  if (r->full) { memcpy(r->full + i * r->k, row, sizeof(double) * (size_t)r->k); return; }
  if (r->op->dtype == TPU_DTYPE_F32) {
    float* dst = (float*)tpu__operand_ptr(r->op) + i * r->k;
    for (int64_t j = 0; j < r->k; ++j) dst[j] = (float)row[j];
    return;
  }
  size_t esz = tpu_dtype_size(r->op->dtype);
  tpu__convert_run(tpu__operand_ptr(r->op) + i * r->k * (int64_t)esz, r->op->dtype, 1, row, TPU_DTYPE_F64, 1, r->k);
}

static void rows_close(rows_t* r, bool output) {
  if (r->full && output) tpu__unpack(r->op, r->full, TPU_DTYPE_F64);
  tpu__free(r->full);
  r->full = NULL;
}

typedef struct ln_s {
  rows_t rx, ry, rdy, rdx;
  const double *w, *bb;
  const float *wf, *bf;    /* float copies for float32 rows */
  double *mu, *rs;
  const double *smu, *srs; /* saved statistics (backward) */
  double *dwp, *dbp;       /* backward: per-group partials of dw / db */
  int64_t m, k, group;
  double eps;
  bool want_dx;
  bool stream; /* float rows: normalized in a cached row, stored with tpu__stream_copy */
} ln_t;

/* Row sums with LANES independent partial sums, combined in a fixed order: the loop
 * vectorizes (a single running sum is a chain of dependent adds, 4 cycles each) and
 * the result is the same whichever instruction set runs it. */
#define LANES 8

/* (v8d, ld8_f32/f64 and v8_total, the lane vectors: host/vmath.h) */

/* (Tried for the GPT step's [512,128] rows, where the double kernel took ~2.5x PyTorch
 * CPU's float time: four independent vector accumulators per pass instead of one changed
 * nothing measurable, so the double arithmetic itself was the cost: dense float32 rows now
 * compute in float, ln_row_f32 below.) */

/* One row in double: statistics into *mu, *rs, the normalized row into y (rows of
 * float64 tensors, and rows of other dtypes or layouts converted to double). */
TPU_ISA_CLONES static void ln_row_f64(const ln_t* L, const double* x, double* y, double* mu, double* rs) {
  int64_t k = L->k;
  const double *w = L->w, *bb = L->bb;
  v8d acc = V8D_ZERO;
  double tail = 0;
  int64_t j = 0;
  for (; j + LANES <= k; j += LANES) acc = v8_add(acc, ld8_f64(x + j));
  for (; j < k; ++j) tail += x[j];
  double mean = (v8_total(acc) + tail) / (double)k;
  acc = V8D_ZERO;
  tail = 0;
  for (j = 0; j + LANES <= k; j += LANES) {
    v8d d = v8_subs(ld8_f64(x + j), mean);
    acc = v8_add(acc, v8_mul(d, d));
  }
  for (; j < k; ++j) tail += (x[j] - mean) * (x[j] - mean);
  double var = (v8_total(acc) + tail) / (double)k;
  double rstd = 1.0 / sqrt((var > 0 ? var : 0) + L->eps);
  *mu = mean;
  *rs = rstd;
  if (w && bb) for (j = 0; j < k; ++j) y[j] = (x[j] - mean) * rstd * w[j] + bb[j];
  else if (w) for (j = 0; j < k; ++j) y[j] = (x[j] - mean) * rstd * w[j];
  else if (bb) for (j = 0; j < k; ++j) y[j] = (x[j] - mean) * rstd + bb[j];
  else for (j = 0; j < k; ++j) y[j] = (x[j] - mean) * rstd;
}

/* Float32 rows (dense in and out) compute in float, as PyTorch's CPU kernel does (its
 * opmath for float is float), at about twice the double rows' speed: the statistics from
 * float sums over blocks of 128 elements in 16 lanes, the blocks added in double (a
 * row's sum keeps the accuracy of a 128-element float sum), the row normalized in float.
 * The order of every operation is fixed by the code, so the result does not depend on
 * the instruction set; the fused-group path (ln_row_end) uses this same function. The
 * variance pass prefetches the next row (`next`, one line per 16 elements): the mean pass
 * otherwise waited on memory for every row (half of the row's time in a profile). 16M
 * f32 in rows of 1024 on 2 AVX2 cores: 0.59-0.64 -> 0.48-0.52 ns per element. */
static inline double total16(v16f a) { return v8_total(v16_widen_sum(a)); }
#define LN_BLOCK 128

/* The sum of x[j], or with square of (x[j] - shift)^2, over [0, k). */
TPU_VINLINE double ln_sum_f32(const float* x, int64_t k, float shift, bool square, const float* next) {
  double s = 0;
  for (int64_t b = 0; b < k; b += LN_BLOCK) {
    int64_t e = b + LN_BLOCK < k ? b + LN_BLOCK : k, j = b;
    v16f acc = V16F_ZERO;
    if (square)
      for (; j + 16 <= e; j += 16) {
        v16f d = v16_subs(ld16_f32(x + j), shift);
        acc = v16_add(acc, v16_mul(d, d));
        if (next) __builtin_prefetch(next + j);
      }
    else
      for (; j + 16 <= e; j += 16) acc = v16_add(acc, ld16_f32(x + j));
    double t = total16(acc);
    for (; j < e; ++j) { float d = x[j] - shift; t += square ? d * d : x[j]; }
    s += t;
  }
  return s;
}

TPU_ISA_CLONES static void ln_row_f32(const ln_t* L, const float* x, float* y, double* mu, double* rs,
                                      const float* next) {
  int64_t k = L->k;
  float mean = (float)(ln_sum_f32(x, k, 0.0f, false, NULL) / (double)k);
  double var = ln_sum_f32(x, k, mean, true, next) / (double)k;
  float rstd = (float)(1.0 / sqrt((var > 0 ? var : 0) + L->eps));
  *mu = mean;
  *rs = rstd;
  const float *w = L->wf, *bb = L->bf;
  if (w && bb) for (int64_t j = 0; j < k; ++j) y[j] = (x[j] - mean) * rstd * w[j] + bb[j];
  else if (w) for (int64_t j = 0; j < k; ++j) y[j] = (x[j] - mean) * rstd * w[j];
  else if (bb) for (int64_t j = 0; j < k; ++j) y[j] = (x[j] - mean) * rstd + bb[j];
  else for (int64_t j = 0; j < k; ++j) y[j] = (x[j] - mean) * rstd;
}

/* Both row operands dense float32 in place (no conversion buffers). */
static bool rows_f32(const rows_t* r) { return !r->full && r->op->dtype == TPU_DTYPE_F32; }
/* Dense bf16 rows: widened to float32 row buffers and run through the float32 row
 * functions, in float as ATen's CPU kernel computes bf16 (its opmath is float); the
 * double rows took 4x the float ones' time. */
static bool rows_bf16(const rows_t* r) { return !r->full && r->op->dtype == TPU_DTYPE_BF16; }
static const float* row_bf16_in(const rows_t* r, int64_t i, float* buf) {
  tpu__convert_run(buf, TPU_DTYPE_F32, 1, (const uint16_t*)tpu__operand_ptr(r->op) + i * r->k, TPU_DTYPE_BF16, 1, r->k);
  return buf;
}
static void row_bf16_out(const rows_t* r, int64_t i, const float* row) {
  tpu__convert_run((uint16_t*)tpu__operand_ptr(r->op) + i * r->k, TPU_DTYPE_BF16, 1, row, TPU_DTYPE_F32, 1, r->k);
}

/* Each thread converts its rows through its own row buffers. */
static tpu_status_t ln_fwd_rows(void* arg, int64_t rb, int64_t re, int tid) {
  ln_t* L = arg;
  int64_t k = L->k;
  double* xrow = tpu__malloc(sizeof(double) * cnt1(k));
  double* yrow = tpu__malloc(sizeof(double) * cnt1(k));
  if (!xrow || !yrow) { tpu__free(xrow); tpu__free(yrow); return TPU_HOST_NOMEM(); }
  bool f32 = rows_f32(&L->rx) && rows_f32(&L->ry), b16 = rows_bf16(&L->rx) && rows_bf16(&L->ry);
  for (int64_t r = rb; r < re; ++r) {
    if (b16) { /* float rows in the double buffers */
      ln_row_f32(L, row_bf16_in(&L->rx, r, (float*)xrow), (float*)yrow, &L->mu[r], &L->rs[r], NULL);
      row_bf16_out(&L->ry, r, (float*)yrow);
      continue;
    }
    if (f32) {
      const float* x = (const float*)tpu__operand_ptr(L->rx.op) + r * k;
      float* y = (float*)tpu__operand_ptr(L->ry.op) + r * k;
      ln_row_f32(L, x, L->stream ? (float*)yrow : y, &L->mu[r], &L->rs[r], r + 1 < re ? x + k : NULL);
      if (L->stream) tpu__stream_copy(y, yrow, (size_t)k * sizeof(float));
      continue;
    }
    ln_row_f64(L, rows_get(&L->rx, r, xrow), yrow, &L->mu[r], &L->rs[r]);
    rows_put(&L->ry, r, yrow);
  }
  if (L->stream) tpu__stream_fence();
  tpu__free(xrow);
  tpu__free(yrow);
  return NULL;
}

/* Layer norm over the last dim of a float32 input with dense float32 outputs, as the end
 * of a fused group: the same row computation, the statistics rounded to float32 as the
 * kernel's unpack does. */
bool tpu__layer_norm_row_end_ok(const tpu_node_t* n) {
  const tpu_operand_t* x = &n->in[0];
  if (n->kind != TPU_KIND_LAYER_NORM || x->dtype != TPU_DTYPE_F32 || x->ndim < 1 || n->ia[0] != x->ndim - 1)
    return false;
  if (n->n_out != 3 || tpu__output_absent(&n->out[0])) return false;
  for (int i = 0; i < n->n_out; ++i)
    if (!tpu__output_absent(&n->out[i]) && (n->out[i].dtype != TPU_DTYPE_F32 || !tpu__operand_is_contiguous(&n->out[i])))
      return false;
  return true;
}

static void ln_row_end(const tpu_row_end_t* e, const float* x, int64_t r, double* scratch) {
  (void)scratch;
  const tpu_node_t* n = e->node;
  double mu, rs;
  ln_row_f32(e->state, x, (float*)tpu__operand_ptr(&n->out[0]) + r * e->k, &mu, &rs, NULL);
  if (!tpu__output_absent(&n->out[1])) ((float*)tpu__operand_ptr(&n->out[1]))[r] = (float)mu;
  if (!tpu__output_absent(&n->out[2])) ((float*)tpu__operand_ptr(&n->out[2]))[r] = (float)rs;
}

tpu_status_t tpu__layer_norm_row_end_open(const tpu_node_t* n, tpu_row_end_t* e) {
  int64_t k = n->in[0].sizes[n->in[0].ndim - 1];
  /* one allocation: the ln_t, then weight and bias in float (the row is float32) */
  ln_t* L = tpu__calloc(1, sizeof(ln_t) + sizeof(float) * cnt1(2 * k));
  if (!L) return TPU_HOST_NOMEM();
  float* wb = (float*)(L + 1);
  L->k = k;
  L->eps = n->da[0];
  for (int i = 1; i <= 2; ++i) {
    if (!present(&n->in[i])) continue;
    float* dst = wb + (i - 1) * k;
    tpu__pack(&n->in[i], NULL, TPU_DTYPE_F32, dst);
    if (i == 1) L->wf = dst; else L->bf = dst;
  }
  *e = (tpu_row_end_t){n, k, L, ln_row_end};
  return NULL;
}

#define LN_STREAM_ROW_MAX (256 << 10)

static tpu_status_t layer_norm_kernel(tpu_node_t* n) {
  tpu_operand_t* x = &n->in[0];
  int axis = (int)n->ia[0];
  ln_t L = {0};
  int64_t m = L.m = prod(x->sizes, 0, axis), k = L.k = prod(x->sizes, axis, x->ndim);
  L.eps = n->da[0];
  void* buf[6] = {0};
  L.w = present(&n->in[1]) ? (buf[0] = tpu__pack_alloc(&n->in[1], TPU_DTYPE_F64)) : NULL;
  L.bb = present(&n->in[2]) ? (buf[1] = tpu__pack_alloc(&n->in[2], TPU_DTYPE_F64)) : NULL;
  /* float32 and bf16 rows use float copies (ln_row_f32) */
  bool frows = x->dtype == TPU_DTYPE_F32 || x->dtype == TPU_DTYPE_BF16;
  L.wf = frows && present(&n->in[1]) ? (buf[4] = tpu__pack_alloc(&n->in[1], TPU_DTYPE_F32)) : NULL;
  L.bf = frows && present(&n->in[2]) ? (buf[5] = tpu__pack_alloc(&n->in[2], TPU_DTYPE_F32)) : NULL;
  L.mu = buf[2] = tpu__malloc(sizeof(double) * cnt1(m));
  L.rs = buf[3] = tpu__malloc(sizeof(double) * cnt1(m));
  bool ok = rows_open(&L.rx, x, m, k, true) && rows_open(&L.ry, &n->out[0], m, k, false);
  if (!ok || (present(&n->in[1]) && (!L.w || (frows && !L.wf))) || (present(&n->in[2]) && (!L.bb || (frows && !L.bf))) ||
      !L.mu || !L.rs) {
    rows_close(&L.rx, false);
    rows_close(&L.ry, false);
    free_all(buf, 6);
    return TPU_HOST_NOMEM();
  }
  /* a new float output past the cache, in rows whose buffer stays cached (host.h) */
  L.stream = rows_f32(&L.rx) && rows_f32(&L.ry) && n->out[0].value != x->value &&
             k * (int64_t)sizeof(float) <= LN_STREAM_ROW_MAX && m * k * (int64_t)sizeof(float) >= tpu__stream_min_bytes();
  tpu_status_t st = m > 1 && m * k >= TPU_PARALLEL_MIN_WORK
                        ? tpu__parallel_for(m, TPU_PARALLEL_MIN_WORK / cnt1(k) + 1, ln_fwd_rows, &L)
                        : ln_fwd_rows(&L, 0, m, 0);
  rows_close(&L.rx, false);
  rows_close(&L.ry, !st);
  if (!st) {
    tpu__unpack(&n->out[1], L.mu, TPU_DTYPE_F64);
    tpu__unpack(&n->out[2], L.rs, TPU_DTYPE_F64);
  }
  free_all(buf, 6);
  return st;
}

/* Row groups of the backward: dw/db partials are summed per group, then the groups in
 * order, so the result depends on m alone, never on the thread count. */
#define LN_GROUPS 16

/* One row of the backward in double: dw/db partials of its group, and dx when wanted. Two
 * passes over the row (xhat and g are recomputed in the second). */
TPU_ISA_CLONES static void ln_bwd_row_f64(const ln_t* L, const double* dy, const double* x, double* dx,
                                          double* restrict dw, double* restrict db, double mean, double rstd) {
  int64_t k = L->k;
  const double* w = L->w;
  for (int64_t j = 0; j < k; ++j) {
    dw[j] += dy[j] * ((x[j] - mean) * rstd);
    db[j] += dy[j];
  }
  if (!dx) return;
  v8d acc_g = V8D_ZERO, acc_gx = V8D_ZERO;
  double tg = 0, tgx = 0;
  int64_t j = 0;
  /* g = dy * w (dy without a weight) */
  for (; j + LANES <= k; j += LANES) {
    v8d g = w ? v8_mul(ld8_f64(dy + j), ld8_f64(w + j)) : ld8_f64(dy + j);
    acc_g = v8_add(acc_g, g);
    acc_gx = v8_add(acc_gx, v8_mul(g, v8_muls(v8_subs(ld8_f64(x + j), mean), rstd)));
  }
  for (; j < k; ++j) {
    double g = w ? dy[j] * w[j] : dy[j];
    tg += g;
    tgx += g * ((x[j] - mean) * rstd);
  }
  double sg = (v8_total(acc_g) + tg) / (double)k, sgx = (v8_total(acc_gx) + tgx) / (double)k;
  if (w)
    for (j = 0; j < k; ++j) dx[j] = rstd * (dy[j] * w[j] - sg - ((x[j] - mean) * rstd) * sgx);
  else
    for (j = 0; j < k; ++j) dx[j] = rstd * (dy[j] - sg - ((x[j] - mean) * rstd) * sgx);
}

/* Float32 rows: dw/db accumulate in double as in the double rows (a group sums many rows);
 * dx is computed in float with ln_sum_f32's blocked sums, as ln_row_f32 does the forward. */
TPU_ISA_CLONES static void ln_bwd_row_f32(const ln_t* L, const float* dy, const float* x, float* dx,
                                          double* restrict dw, double* restrict db, double mean_d,
                                          double rstd_d) {
  int64_t k = L->k;
  const float mean = (float)mean_d, rstd = (float)rstd_d; /* saved as float32 statistics */
  for (int64_t j = 0; j < k; ++j) {
    dw[j] += (double)dy[j] * (double)((x[j] - mean) * rstd);
    db[j] += (double)dy[j];
  }
  if (!dx) return;
  const float* w = L->wf;
  /* sums of g = dy * w and of g * xhat, in blocks as ln_sum_f32 */
  double sg = 0, sgx = 0;
  for (int64_t b = 0; b < k; b += LN_BLOCK) {
    int64_t e = b + LN_BLOCK < k ? b + LN_BLOCK : k, j = b;
    v16f ag = V16F_ZERO, agx = V16F_ZERO;
    for (; j + 16 <= e; j += 16) {
      v16f g = w ? v16_mul(ld16_f32(dy + j), ld16_f32(w + j)) : ld16_f32(dy + j);
      ag = v16_add(ag, g);
      agx = v16_add(agx, v16_mul(g, v16_muls(v16_subs(ld16_f32(x + j), mean), rstd)));
    }
    double tg = total16(ag), tgx = total16(agx);
    for (; j < e; ++j) {
      float g = w ? dy[j] * w[j] : dy[j];
      tg += g;
      tgx += g * ((x[j] - mean) * rstd);
    }
    sg += tg;
    sgx += tgx;
  }
  const float mg = (float)(sg / (double)k), mgx = (float)(sgx / (double)k);
  if (w)
    for (int64_t j = 0; j < k; ++j) dx[j] = rstd * (dy[j] * w[j] - mg - ((x[j] - mean) * rstd) * mgx);
  else
    for (int64_t j = 0; j < k; ++j) dx[j] = rstd * (dy[j] - mg - ((x[j] - mean) * rstd) * mgx);
}

static tpu_status_t ln_bwd_groups(void* arg, int64_t gb, int64_t ge, int tid) {
  ln_t* L = arg;
  int64_t k = L->k;
  bool f32 = rows_f32(&L->rdy) && rows_f32(&L->rx) && (!L->want_dx || rows_f32(&L->rdx));
  bool b16 = !f32 && rows_bf16(&L->rdy) && rows_bf16(&L->rx) && (!L->want_dx || rows_bf16(&L->rdx));
  double* dyrow = f32 ? NULL : tpu__malloc(sizeof(double) * cnt1(k));
  double* xrow = f32 ? NULL : tpu__malloc(sizeof(double) * cnt1(k));
  double* dxrow = f32 ? NULL : tpu__malloc(sizeof(double) * cnt1(k));
  if (!f32 && (!dyrow || !xrow || !dxrow)) {
    tpu__free(dyrow); tpu__free(xrow); tpu__free(dxrow);
    return TPU_HOST_NOMEM();
  }
  for (int64_t g = gb; g < ge; ++g) {
    double* dw = L->dwp + g * k;
    double* db = L->dbp + g * k;
    int64_t r1 = (g + 1) * L->group < L->m ? (g + 1) * L->group : L->m;
    for (int64_t r = g * L->group; r < r1; ++r) {
      double mean = L->smu[r], rstd = L->srs[r];
      if (b16) { /* float rows in the double buffers */
        ln_bwd_row_f32(L, row_bf16_in(&L->rdy, r, (float*)dyrow), row_bf16_in(&L->rx, r, (float*)xrow),
                       L->want_dx ? (float*)dxrow : NULL, dw, db, mean, rstd);
        if (L->want_dx) row_bf16_out(&L->rdx, r, (float*)dxrow);
        continue;
      }
      if (f32) {
        ln_bwd_row_f32(L, (const float*)tpu__operand_ptr(L->rdy.op) + r * k,
                       (const float*)tpu__operand_ptr(L->rx.op) + r * k,
                       L->want_dx ? (float*)tpu__operand_ptr(L->rdx.op) + r * k : NULL, dw, db, mean, rstd);
        continue;
      }
      ln_bwd_row_f64(L, rows_get(&L->rdy, r, dyrow), rows_get(&L->rx, r, xrow), L->want_dx ? dxrow : NULL,
                     dw, db, mean, rstd);
      if (L->want_dx) rows_put(&L->rdx, r, dxrow);
    }
  }
  tpu__free(dyrow); tpu__free(xrow); tpu__free(dxrow);
  return NULL;
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, from the saved
 * mean/rstd (not recomputed), as ATen's backward does. */
static tpu_status_t layer_norm_backward_kernel(tpu_node_t* n) {
  tpu_operand_t* x = &n->in[1];
  int axis = (int)n->ia[0];
  bool want_dx = !tpu__output_absent(&n->out[0]), want_dw = !tpu__output_absent(&n->out[1]),
       want_db = !tpu__output_absent(&n->out[2]);
  ln_t L = {0};
  int64_t m = L.m = prod(x->sizes, 0, axis), k = L.k = prod(x->sizes, axis, x->ndim);
  L.want_dx = want_dx;
  int64_t groups = m < LN_GROUPS ? (m > 0 ? m : 1) : LN_GROUPS;
  L.group = (m + groups - 1) / groups;
  if (L.group < 1) L.group = 1;
  bool has_w = present(&n->in[4]);
  void* buf[6] = {0};
  L.smu = buf[0] = tpu__pack_alloc(&n->in[2], TPU_DTYPE_F64);
  L.srs = buf[1] = tpu__pack_alloc(&n->in[3], TPU_DTYPE_F64);
  L.w = has_w ? (buf[2] = tpu__pack_alloc(&n->in[4], TPU_DTYPE_F64)) : NULL;
  /* float32 and bf16 rows use a float copy (ln_bwd_row_f32) */
  bool frows = x->dtype == TPU_DTYPE_F32 || x->dtype == TPU_DTYPE_BF16;
  L.wf = frows && has_w ? (buf[5] = tpu__pack_alloc(&n->in[4], TPU_DTYPE_F32)) : NULL;
  L.dwp = buf[3] = tpu__calloc(cnt1(groups * k), sizeof(double));
  L.dbp = buf[4] = tpu__calloc(cnt1(groups * k), sizeof(double));
  bool ok = rows_open(&L.rdy, &n->in[0], m, k, true) && rows_open(&L.rx, x, m, k, true) &&
            (!want_dx || rows_open(&L.rdx, &n->out[0], m, k, false));
  if (!ok || !L.smu || !L.srs || (has_w && (!L.w || (frows && !L.wf))) || !L.dwp || !L.dbp) {
    rows_close(&L.rdy, false);
    rows_close(&L.rx, false);
    rows_close(&L.rdx, false);
    free_all(buf, 6);
    return TPU_HOST_NOMEM();
  }
  tpu_status_t st = m * k >= TPU_PARALLEL_MIN_WORK ? tpu__parallel_for(groups, 1, ln_bwd_groups, &L)
                                                   : ln_bwd_groups(&L, 0, groups, 0);
  /* groups in order into group 0 */
  for (int64_t g = 1; g < groups && !st; ++g)
    for (int64_t j = 0; j < k; ++j) {
      L.dwp[j] += L.dwp[g * k + j];
      L.dbp[j] += L.dbp[g * k + j];
    }
  rows_close(&L.rdy, false);
  rows_close(&L.rx, false);
  if (want_dx) rows_close(&L.rdx, !st);
  if (want_dw && !st) tpu__unpack(&n->out[1], L.dwp, TPU_DTYPE_F64);
  if (want_db && !st) tpu__unpack(&n->out[2], L.dbp, TPU_DTYPE_F64);
  free_all(buf, 6);
  return st;
}

/* ---- embedding -------------------------------------------------------------------- */

static tpu_status_t index_error(const tpu_node_t* n) {
  return tpu_status_make(TPU_INDEX_ERROR, "%s: index out of range in self", tpu__node_describe(n));
}

typedef struct emb_s {
  const tpu_node_t* n;
  const tpu_operand_t* w;
  const int64_t* idx;
  char* dense;
  int64_t d, rows;
} emb_t;

/* Out-of-range indices fail their chunk; the pool reports the first chunk's error. */
static tpu_status_t emb_rows(void* arg, int64_t b, int64_t e, int tid) {
  emb_t* E = arg;
  const tpu_operand_t* w = E->w;
  size_t esz = tpu_dtype_size(w->dtype);
  const char* base = tpu__operand_ptr(w);
  for (int64_t i = b; i < e; ++i) {
    int64_t r = E->idx[i];
    if (r < 0 || r >= E->rows) return index_error(E->n);
    tpu__convert_run(E->dense + (size_t)(i * E->d) * esz, w->dtype, 1, base + r * w->strides[0] * (int64_t)esz,
                     w->dtype, w->strides[1], E->d);
  }
  return NULL;
}

/* Gathers rows straight from the (strided) weight, so the table itself is never packed. */
static tpu_status_t embedding_kernel(tpu_node_t* n) {
  const tpu_operand_t* w = &n->in[0];
  int64_t ni = tpu__operand_numel(&n->in[1]), rows = w->sizes[0], d = w->sizes[1];
  size_t esz = tpu_dtype_size(w->dtype);
  int64_t* idx = tpu__pack_alloc(&n->in[1], TPU_DTYPE_I64);
  uint64_t nbytes;
  if (!tpu__mul_ok((uint64_t)(ni * d), esz, &nbytes)) nbytes = UINT64_MAX;
  char* dense = nbytes == UINT64_MAX ? NULL : tpu__malloc(nbytes ? nbytes : 1);
  if (!idx || !dense) {
    tpu__free(idx);
    tpu__free(dense);
    return TPU_HOST_NOMEM();
  }
  emb_t E = {n, w, idx, dense, d, rows};
  tpu_status_t st = ni * d >= TPU_PARALLEL_MIN_WORK ? tpu__parallel_for(ni, TPU_PARALLEL_MIN_WORK / cnt1(d) + 1, emb_rows, &E)
                                                    : emb_rows(&E, 0, ni, 0);
  if (!st) tpu__unpack(&n->out[0], dense, w->dtype);
  tpu__free(idx);
  tpu__free(dense);
  return st;
}

/* Sums grad rows into their weight rows; padding_idx rows get nothing and, with
 * scale_grad_by_freq, each contribution is divided by its index's frequency. Integer
 * grads accumulate in int64, all others in float64. */
static tpu_status_t embedding_backward_kernel(tpu_node_t* n) {
  int64_t nw = n->ia[0], pad = n->ia[1];
  bool scale = n->ia[2];
  int64_t ni = tpu__operand_numel(&n->in[1]);
  int64_t d = n->out[0].sizes[1];
  bool integral = n->compute == TPU_DTYPE_I64;
  tpu_dtype_t acc_dt = integral ? TPU_DTYPE_I64 : TPU_DTYPE_F64;
  void* buf[4] = {0};
  int64_t* idx = buf[0] = tpu__pack_alloc(&n->in[1], TPU_DTYPE_I64);
  void* g = buf[1] = tpu__pack_alloc(&n->in[0], acc_dt);
  void* acc = buf[2] = tpu__calloc(cnt1(nw * d), 8);
  int64_t* cnt = scale ? (buf[3] = tpu__calloc(cnt1(nw), sizeof(int64_t))) : NULL;
  if (!idx || !g || !acc || (scale && !cnt)) {
    free_all(buf, 4);
    return TPU_HOST_NOMEM();
  }
  for (int64_t i = 0; i < ni; ++i) {
    if (idx[i] < 0 || idx[i] >= nw) {
      free_all(buf, 4);
      return index_error(n);
    }
    if (cnt) ++cnt[idx[i]];
  }
  for (int64_t i = 0; i < ni; ++i) {
    int64_t r = idx[i];
    if (r == pad) continue;
    if (integral) {
      int64_t* a = (int64_t*)acc + r * d;
      const int64_t* gr = (const int64_t*)g + i * d;
      for (int64_t j = 0; j < d; ++j) a[j] += cnt ? gr[j] / cnt[r] : gr[j];
    } else {
      double* a = (double*)acc + r * d;
      const double* gr = (const double*)g + i * d;
      double f = cnt ? 1.0 / (double)cnt[r] : 1.0;
      for (int64_t j = 0; j < d; ++j) a[j] += gr[j] * f;
    }
  }
  tpu__unpack(&n->out[0], acc, acc_dt);
  free_all(buf, 4);
  return NULL;
}

/* ---- embedding_bag ------------------------------------------------------------------
 * EMBEDDING_BAG  in: weight, indices, offsets, per_sample_weights or absent; ia[0] mode
 *                (0 sum, 1 mean, 2 max), ia[1] padding_idx (< 0: none), ia[2]
 *                include_last_offset. Outputs as CPU's: the bags (B, D); offset2bag (each
 *                index's bag, or empty where CPU's sum fast path skips it); bag_size
 *                (non-padding indices per bag in mean/max, 0 in sum); max_indices (the
 *                weight row of each max in max mode, bag_size in mean, 0 in sum).
 * Bag b covers indices [offsets[b], offsets[b+1]) (the last bag ends at the number of
 * indices, or at the last offset with include_last_offset). Sums accumulate in float64
 * and round once. Max takes a bag's first non-padding row and then every strictly
 * greater value (CPU's rule: a NaN wins only as a bag's first value); empty bags are 0.
 * EMBEDDING_BAG_BACKWARD  in: grad (B, D), indices, offset2bag, bag_size, max_indices,
 *                per_sample_weights or absent, offsets or absent (to rebuild an empty
 *                offset2bag); ia[0] num_weights, ia[1] scale_grad_by_freq, ia[2] mode,
 *                ia[3] padding_idx. Output (num_weights, D).
 * EMBEDDING_BAG_PSW_BACKWARD  in: grad, weight, indices, offsets, offset2bag; ia[0]
 *                padding_idx. Output: one dot product per index. */

/* RuntimeError, as CPU's TORCH_CHECKs in these kernels raise (the queue names the op). */
static tpu_status_t bag_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static tpu_status_t bag_error(const char* fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tpu_status_make(TPU_INVALID_ARGUMENT, "%s", msg);
}

/* Each index's bag from offsets as CPU's make_offset2bag builds it: bag[i] = (offsets at
 * or before i) - 1, counting the first nused offsets. Offsets outside [0, n] fail. */
static tpu_status_t bags_from_offsets(const int64_t* off, int64_t nused, int64_t n, int64_t* bag) {
  for (int64_t i = 0; i < n; ++i) bag[i] = 0;
  for (int64_t j = 0; j < nused; ++j) {
    if (off[j] < 0 || off[j] > n)
      return bag_error("offsets[%lld] = %lld is outside the indices", (long long)j, (long long)off[j]);
    if (off[j] < n) ++bag[off[j]];
  }
  int64_t run = -1;
  for (int64_t i = 0; i < n; ++i) bag[i] = run += bag[i];
  return NULL;
}

typedef struct bag_s {
  const tpu_node_t* n;
  const tpu_operand_t* w;
  const int64_t *idx, *off;
  const double* psw;
  double* out;       /* (B, D) */
  int64_t* bsize;    /* (B) */
  int64_t* maxi;     /* (B, D) in max mode */
  double* rows;      /* per-thread row scratch, D each */
  int64_t n_idx, B, D, mode, pad;
} bag_t;

static tpu_status_t bag_rows(void* arg, int64_t b0, int64_t b1, int tid) {
  bag_t* c = arg;
  const tpu_operand_t* w = c->w;
  size_t esz = tpu_dtype_size(w->dtype);
  const char* base = tpu__operand_ptr(w);
  int64_t D = c->D;
  double* row = c->rows + (size_t)tid * (size_t)cnt1(D);
  for (int64_t b = b0; b < b1; ++b) {
    int64_t s = c->off[b], e = b + 1 < c->B ? c->off[b + 1] : (c->n->ia[2] ? c->off[c->B] : c->n_idx);
    double* o = c->out + b * D;
    int64_t* mi = c->maxi ? c->maxi + b * D : NULL;
    int64_t cnt = 0;
    for (int64_t i = s; i < e; ++i) {
      int64_t r = c->idx[i];
      if (r == c->pad) continue;
      tpu__convert_run(row, TPU_DTYPE_F64, 1, base + r * w->strides[0] * (int64_t)esz, w->dtype, w->strides[1], D);
      if (c->mode == 2) {
        for (int64_t j = 0; j < D; ++j)
          if (cnt == 0 || row[j] > o[j]) { o[j] = row[j]; mi[j] = r; }
      } else {
        double f = c->psw ? c->psw[i] : 1.0;
        for (int64_t j = 0; j < D; ++j) o[j] += f * row[j];
      }
      ++cnt;
    }
    if (c->mode == 1 && cnt)
      for (int64_t j = 0; j < D; ++j) o[j] /= (double)cnt;
    if (c->mode != 0) c->bsize[b] = cnt;
  }
  return NULL;
}

static tpu_status_t embedding_bag_kernel(tpu_node_t* n) {
  const tpu_operand_t* w = &n->in[0];
  int64_t mode = n->ia[0], pad = n->ia[1];
  bool ilo = n->ia[2];
  int64_t n_idx = tpu__operand_numel(&n->in[1]), nof = tpu__operand_numel(&n->in[2]);
  int64_t rows = w->sizes[0], D = w->sizes[1], B = n->out[0].sizes[0];
  bool psw_in = present(&n->in[3]);
  void* buf[8] = {0};
  int64_t* idx = buf[0] = tpu__pack_alloc(&n->in[1], TPU_DTYPE_I64);
  int64_t* off = buf[1] = tpu__pack_alloc(&n->in[2], TPU_DTYPE_I64);
  double* psw = psw_in ? (buf[2] = tpu__pack_alloc(&n->in[3], TPU_DTYPE_F64)) : NULL;
  double* out = buf[3] = tpu__calloc(cnt1(B * D), sizeof(double));
  int64_t* bsize = buf[4] = tpu__calloc(cnt1(tpu__operand_numel(&n->out[2])), sizeof(int64_t));
  int64_t* maxi = buf[5] = tpu__calloc(cnt1(tpu__operand_numel(&n->out[3])), sizeof(int64_t));
  int64_t* o2b = buf[6] = tpu__malloc(sizeof(int64_t) * cnt1(n_idx));
  int nt = tpu__num_threads();
  double* rows_buf = buf[7] = tpu__malloc(sizeof(double) * cnt1(D) * (size_t)nt);
  tpu_status_t st = NULL;
  if (!idx || !off || (psw_in && !psw) || !out || !bsize || !maxi || !o2b || !rows_buf) {
    st = TPU_HOST_NOMEM();
    goto done;
  }
  /* CPU's checks, in its order, then the ones CPU leaves to undefined behaviour */
  if (nof > 0 && off[0] != 0) {
    st = bag_error("offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                      "position 0. However, got %lld", (long long)off[0]);
    goto done;
  }
  if (nof > 0 && off[nof - 1] > n_idx) {
    st = bag_error("offsets[-1] can not be greater than input's length %lld but got offsets[-1] of %lld",
                   (long long)n_idx, (long long)off[nof - 1]);
    goto done;
  }
  for (int64_t j = 1; j < nof; ++j)
    if (off[j] < off[j - 1]) {
      st = bag_error("offsets must be non-decreasing, but offsets[%lld] = %lld is smaller than the one before it",
                     (long long)j, (long long)off[j]);
      goto done;
    }
  for (int64_t i = 0; i < n_idx; ++i)
    if (idx[i] < 0 || idx[i] >= rows) {
      st = mode == 2 ? bag_error("embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be "
                                    "%lld", (long long)idx[i])
                     : bag_error("Index %lld of input takes value %lld which is not in the valid range [0, %lld)",
                                 (long long)i, (long long)idx[i], (long long)rows);
      goto done;
    }
  bag_t c = {n, w, idx, off, psw, out, bsize, mode == 2 ? maxi : NULL, rows_buf, n_idx, B, D, mode, pad};
  int64_t per_bag = B ? (n_idx / B + 1) * cnt1(D) : 1;
  st = tpu__parallel_for(B, TPU_PARALLEL_MIN_WORK / per_bag + 1, bag_rows, &c);
  if (st) goto done;
  if (mode == 1) memcpy(maxi, bsize, sizeof(int64_t) * (size_t)B);
  tpu__unpack(&n->out[0], out, TPU_DTYPE_F64);
  if (tpu__operand_numel(&n->out[1]) == n_idx) {
    st = bags_from_offsets(off, ilo ? nof - 1 : nof, n_idx, o2b);
    if (st) goto done;
    tpu__unpack(&n->out[1], o2b, TPU_DTYPE_I64);
  }
  tpu__unpack(&n->out[2], bsize, TPU_DTYPE_I64);
  tpu__unpack(&n->out[3], maxi, TPU_DTYPE_I64);
done:
  free_all(buf, 8);
  return st;
}

/* Each index's bag: offset2bag when it is filled, else rebuilt from offsets (all of
 * them, as CPU's backwards do). bag must hold n entries. */
static tpu_status_t bag_of_indices(const tpu_operand_t* o2b, const tpu_operand_t* off, int64_t n_idx, int64_t B,
                                   int64_t* bag) {
  tpu_status_t st = NULL;
  if (tpu__operand_numel(o2b) == n_idx) {
    tpu__pack(o2b, NULL, TPU_DTYPE_I64, bag);
  } else {
    if (!present(off)) return bag_error("offset2bag is empty and no offsets were given");
    int64_t* o = tpu__pack_alloc(off, TPU_DTYPE_I64);
    if (!o) return TPU_HOST_NOMEM();
    st = bags_from_offsets(o, tpu__operand_numel(off), n_idx, bag);
    tpu__free(o);
    if (st) return st;
  }
  for (int64_t i = 0; i < n_idx; ++i)
    if (bag[i] < 0 || bag[i] >= B)
      return bag_error("offset2bag[%lld] = %lld is not a bag of grad", (long long)i, (long long)bag[i]);
  return NULL;
}

typedef struct bag_bwd_s {
  const int64_t *idx, *bag, *bsize, *maxi, *cnt;
  const double *g, *psw;
  double* gw;
  int64_t n_idx, B, D, mode, pad;
  tpu_dtype_t narrow; /* bf16/f16 output: CPU's arithmetic in that dtype; else F64 */
} bag_bwd_t;

/* v rounded through a bf16/f16 dtype (CPU's Half/BFloat16 arithmetic: each operation in
 * float, the result rounded); other dtypes: v. */
static double bag_round(double v, tpu_dtype_t dt) {
  if (dt == TPU_DTYPE_BF16) return tpu__bf16_to_f32(tpu__f32_to_bf16((float)v));
  if (dt == TPU_DTYPE_F16) return (float)(_Float16)(float)v;
  return v;
}

/* Columns [j0, j1) of the weight gradient: every thread walks all indices in order over
 * its own columns, so the sums do not depend on the split. float32/float64 accumulate in
 * float64 and round once; bf16/f16 follow CPU, which adds in the tensor's dtype (each
 * index's scale cast to it, then y += scale * grad row, each step rounded) in the same
 * order (per weight row, its indices in order; max mode bag by bag). */
static tpu_status_t bag_bwd_cols(void* arg, int64_t j0, int64_t j1, int tid) {
  (void)tid;
  const bag_bwd_t* c = arg;
  int64_t D = c->D;
  tpu_dtype_t nr = c->narrow;
  if (c->mode == 2) {
    for (int64_t b = 0; b < c->B; ++b) {
      if (c->bsize[b] == 0) continue;
      for (int64_t j = j0; j < j1; ++j) {
        double* y = &c->gw[c->maxi[b * D + j] * D + j];
        *y = bag_round(*y + c->g[b * D + j], nr);
      }
    }
    return NULL;
  }
  for (int64_t i = 0; i < c->n_idx; ++i) {
    int64_t r = c->idx[i], b = c->bag[i];
    if (r == c->pad) continue;
    double f = 1.0;
    if (c->cnt) f /= (double)c->cnt[r];
    if (c->mode == 1 && c->bsize[b] != 0) f /= (double)c->bsize[b]; /* as CPU: 0 leaves the scale */
    if (c->psw) f *= c->psw[i];
    if (nr == TPU_DTYPE_F64) {
      for (int64_t j = j0; j < j1; ++j) c->gw[r * D + j] += c->g[b * D + j] * f;
    } else {
      float fs = (float)bag_round(f, nr);
      for (int64_t j = j0; j < j1; ++j) {
        double* y = &c->gw[r * D + j];
        *y = bag_round((float)*y + (float)bag_round(fs * (float)c->g[b * D + j], nr), nr);
      }
    }
  }
  return NULL;
}

static tpu_status_t embedding_bag_backward_kernel(tpu_node_t* n) {
  int64_t nw = n->ia[0], mode = n->ia[2], pad = n->ia[3];
  bool scale = n->ia[1];
  int64_t B = n->in[0].sizes[0], D = n->in[0].sizes[1], n_idx = tpu__operand_numel(&n->in[1]);
  bool psw_in = present(&n->in[5]);
  void* buf[8] = {0};
  double* g = buf[0] = tpu__pack_alloc(&n->in[0], TPU_DTYPE_F64);
  int64_t* idx = buf[1] = tpu__pack_alloc(&n->in[1], TPU_DTYPE_I64);
  int64_t* bag = buf[2] = tpu__malloc(sizeof(int64_t) * cnt1(n_idx));
  int64_t* bsize = buf[3] = tpu__pack_alloc(&n->in[3], TPU_DTYPE_I64);
  int64_t* maxi = buf[4] = mode == 2 ? tpu__pack_alloc(&n->in[4], TPU_DTYPE_I64) : NULL;
  double* psw = psw_in ? (buf[5] = tpu__pack_alloc(&n->in[5], TPU_DTYPE_F64)) : NULL;
  double* gw = buf[6] = tpu__calloc(cnt1(nw * D), sizeof(double));
  int64_t* cnt = scale ? (buf[7] = tpu__calloc(cnt1(nw), sizeof(int64_t))) : NULL;
  tpu_status_t st = NULL;
  if (!g || !idx || !bag || !bsize || (mode == 2 && !maxi) || (psw_in && !psw) || !gw || (scale && !cnt)) {
    st = TPU_HOST_NOMEM();
    goto done;
  }
  for (int64_t i = 0; i < n_idx; ++i)
    if (idx[i] < 0 || idx[i] >= nw) {
      st = bag_error("index %lld is out of range for %lld embeddings", (long long)idx[i], (long long)nw);
      goto done;
    }
  if (mode == 2) {
    for (int64_t k = 0; k < B * D; ++k)
      if (bsize[k / cnt1(D)] != 0 && (maxi[k] < 0 || maxi[k] >= nw)) {
        st = bag_error("max_indices value %lld is out of range for %lld embeddings", (long long)maxi[k],
                       (long long)nw);
        goto done;
      }
  } else {
    st = bag_of_indices(&n->in[2], &n->in[6], n_idx, B, bag);
    if (st) goto done;
  }
  if (cnt)
    for (int64_t i = 0; i < n_idx; ++i) ++cnt[idx[i]];
  tpu_dtype_t od = n->out[0].dtype;
  tpu_dtype_t narrow = od == TPU_DTYPE_BF16 || od == TPU_DTYPE_F16 ? od : TPU_DTYPE_F64;
  bag_bwd_t c = {idx, bag, bsize, maxi, cnt, g, psw, gw, n_idx, B, D, mode, pad, narrow};
  int64_t work = (mode == 2 ? B : n_idx) + 1;
  st = tpu__parallel_for(D, TPU_PARALLEL_MIN_WORK / work + 1, bag_bwd_cols, &c);
  if (!st) tpu__unpack(&n->out[0], gw, TPU_DTYPE_F64);
done:
  free_all(buf, 8);
  return st;
}

typedef struct bag_psw_s {
  const tpu_operand_t* w;
  const int64_t *idx, *bag;
  const double* g;
  double* out;
  double* rows;
  int64_t D, pad;
} bag_psw_t;

static tpu_status_t bag_psw_rows(void* arg, int64_t i0, int64_t i1, int tid) {
  const bag_psw_t* c = arg;
  const tpu_operand_t* w = c->w;
  size_t esz = tpu_dtype_size(w->dtype);
  const char* base = tpu__operand_ptr(w);
  double* row = c->rows + (size_t)tid * (size_t)cnt1(c->D);
  for (int64_t i = i0; i < i1; ++i) {
    int64_t r = c->idx[i];
    if (r == c->pad) { c->out[i] = 0; continue; }
    tpu__convert_run(row, TPU_DTYPE_F64, 1, base + r * w->strides[0] * (int64_t)esz, w->dtype, w->strides[1], c->D);
    const double* gr = c->g + c->bag[i] * c->D;
    double s = 0;
    for (int64_t j = 0; j < c->D; ++j) s += gr[j] * row[j];
    c->out[i] = s;
  }
  return NULL;
}

static tpu_status_t embedding_bag_psw_backward_kernel(tpu_node_t* n) {
  const tpu_operand_t* w = &n->in[1];
  int64_t B = n->in[0].sizes[0], D = n->in[0].sizes[1], n_idx = tpu__operand_numel(&n->in[2]);
  int64_t rows = w->sizes[0];
  void* buf[5] = {0};
  double* g = buf[0] = tpu__pack_alloc(&n->in[0], TPU_DTYPE_F64);
  int64_t* idx = buf[1] = tpu__pack_alloc(&n->in[2], TPU_DTYPE_I64);
  int64_t* bag = buf[2] = tpu__malloc(sizeof(int64_t) * cnt1(n_idx));
  double* out = buf[3] = tpu__malloc(sizeof(double) * cnt1(n_idx));
  double* rows_buf = buf[4] = tpu__malloc(sizeof(double) * cnt1(D) * (size_t)tpu__num_threads());
  tpu_status_t st = NULL;
  if (!g || !idx || !bag || !out || !rows_buf) {
    st = TPU_HOST_NOMEM();
    goto done;
  }
  for (int64_t i = 0; i < n_idx; ++i)
    if (idx[i] < 0 || idx[i] >= rows) {
      st = bag_error("index %lld is out of range for %lld embeddings", (long long)idx[i], (long long)rows);
      goto done;
    }
  st = bag_of_indices(&n->in[4], &n->in[3], n_idx, B, bag);
  if (st) goto done;
  bag_psw_t c = {w, idx, bag, g, out, rows_buf, D, n->ia[0]};
  st = tpu__parallel_for(n_idx, TPU_PARALLEL_MIN_WORK / cnt1(D) + 1, bag_psw_rows, &c);
  if (!st) tpu__unpack(&n->out[0], out, TPU_DTYPE_F64);
done:
  free_all(buf, 5);
  return st;
}

/* ---- nll loss --------------------------------------------------------------------- */

static tpu_status_t target_error(const tpu_node_t* n, int64_t t) {
  return tpu_status_make(TPU_INDEX_ERROR, "%s: Target %lld is out of bounds.", tpu__node_describe(n), (long long)t);
}

/* self is (N, C, P): P = 1 for nll_loss, H*W for nll_loss2d. */
static tpu_status_t nll_kernel(tpu_node_t* n) {
  int64_t red = n->ia[0], ignore = n->ia[1], N = n->ia[2], C = n->ia[3], P = n->ia[4];
  bool has_w = present(&n->in[2]);
  void* buf[4] = {0};
  double* x = buf[0] = tpu__pack_alloc(&n->in[0], TPU_DTYPE_F64);
  int64_t* t = buf[1] = tpu__pack_alloc(&n->in[1], TPU_DTYPE_I64);
  double* w = has_w ? (buf[2] = tpu__pack_alloc(&n->in[2], TPU_DTYPE_F64)) : NULL;
  double* out = buf[3] = tpu__malloc(sizeof(double) * cnt1(N * P));
  if (!x || !t || (has_w && !w) || !out) {
    free_all(buf, 4);
    return TPU_HOST_NOMEM();
  }
  double sum = 0, tw = 0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t p = 0; p < P; ++p) {
      int64_t c = t[i * P + p];
      double l = 0;
      if (c != ignore) {
        if (c < 0 || c >= C) {
          free_all(buf, 4);
          return target_error(n, c);
        }
        double wc = w ? w[c] : 1.0;
        l = -wc * x[(i * C + c) * P + p];
        tw += wc;
        sum += l;
      }
      out[i * P + p] = l;
    }
  double total = 0;
  if (red == 0) {
    tpu__unpack(&n->out[0], out, TPU_DTYPE_F64);
  } else {
    double r = red == 1 ? sum / tw : sum;
    tpu__unpack(&n->out[0], &r, TPU_DTYPE_F64);
    total = tw;
  }
  tpu__unpack(&n->out[1], &total, TPU_DTYPE_F64);
  free_all(buf, 4);
  return NULL;
}

static tpu_status_t nll_backward_kernel(tpu_node_t* n) {
  int64_t red = n->ia[0], ignore = n->ia[1], N = n->ia[2], C = n->ia[3], P = n->ia[4];
  bool has_w = present(&n->in[2]);
  void* buf[5] = {0};
  double* go = buf[0] = tpu__pack_alloc(&n->in[0], TPU_DTYPE_F64);
  int64_t* t = buf[1] = tpu__pack_alloc(&n->in[1], TPU_DTYPE_I64);
  double* w = has_w ? (buf[2] = tpu__pack_alloc(&n->in[2], TPU_DTYPE_F64)) : NULL;
  double* tw = buf[3] = tpu__pack_alloc(&n->in[3], TPU_DTYPE_F64);
  double* gi = buf[4] = tpu__calloc(cnt1(N * C * P), sizeof(double));
  if (!go || !t || (has_w && !w) || !tw || !gi) {
    free_all(buf, 5);
    return TPU_HOST_NOMEM();
  }
  bool per_elem = red == 0 && tpu__operand_numel(&n->in[0]) == N * P && n->out[0].ndim > 1;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t p = 0; p < P; ++p) {
      int64_t c = t[i * P + p];
      if (c == ignore) continue;
      if (c < 0 || c >= C) {
        free_all(buf, 5);
        return target_error(n, c);
      }
      double g = per_elem ? go[i * P + p] : go[0];
      if (red == 1) g /= tw[0];
      gi[(i * C + c) * P + p] = -(w ? w[c] : 1.0) * g;
    }
  tpu__unpack(&n->out[0], gi, TPU_DTYPE_F64);
  free_all(buf, 5);
  return NULL;
}

/* ---- fused attention -------------------------------------------------------------- */

typedef struct sdpa_dims_s {
  int64_t B, H, Hk, L, S, E, Ev;
} sdpa_dims_t;

static sdpa_dims_t sdpa_dims(const tpu_node_t* n, int qi) {
  const tpu_operand_t *q = &n->in[qi], *k = &n->in[qi + 1], *v = &n->in[qi + 2];
  sdpa_dims_t d = {q->sizes[0], q->sizes[1], k->sizes[1], q->sizes[2], k->sizes[2], q->sizes[3], v->sizes[3]};
  return d;
}

/* The (b, h) slice of the bias broadcast to (B, H, L, S), as an L x S operand. */
static tpu_operand_t bias_slice(const tpu_operand_t* bias, const sdpa_dims_t* d, int64_t b, int64_t h) {
  int64_t full[4] = {d->B, d->H, d->L, d->S};
  tpu_operand_t e = expand(bias, 4, full);
  e.offset += b * e.strides[0] + h * e.strides[1];
  e.ndim = 2;
  e.sizes[0] = d->L; e.sizes[1] = d->S;
  e.strides[0] = e.strides[2]; e.strides[1] = e.strides[3];
  return e;
}

static int ld(int64_t x) { return x > 0 ? (int)x : 1; }

/* host/attn_avx512f32.c for f32 heads (bias f32, bool or none), unless
 * TORCHTPU_ATTN_KERNEL=0 keeps every head on the generic path (read once; for
 * side-by-side runs, bench/attention.py). */
static bool attn_kernel_enabled(void) {
  static int enabled = -1;
  if (enabled < 0) {
    const char* e = getenv("TORCHTPU_ATTN_KERNEL");
    enabled = !(e && *e == '0') && tpu__gemm_f32_supported();
  }
  return enabled;
}

/* One template per compute dtype: T is the element type, CDT its dtype, EXP/LOG the
 * libm functions of T's precision (EXP vectorizes for float).
 *
 * q, k, v, grad_out and out are read in place when they are in the compute dtype with a
 * unit stride in the last dim (the transposed views of a fused qkv projection are), as
 * (b, h) slices of rows with a row stride; otherwise they are packed. Outputs are written
 * in place when dense in the compute dtype. Row sums and maxima use LANES partial
 * results in a fixed order, so they vectorize and do not depend on the instruction set. */
#define CAUSAL_ROWS 32

#define SDPA_DEFINE(T, SFX, CDT, EXP, LOG, FAST)                                               \
  /* A 4-d operand as (b, h) slices of rows: element (b, h, i, e) at p[b*sb + h*sh + i*ld + e]. */ \
  typedef struct hm_##SFX##_s { T* p; int64_t sb, sh, ld; void* owned; } hm_##SFX;           \
  static inline T* hm_at_##SFX(const hm_##SFX* m, int64_t b, int64_t h) {                     \
    return m->p + b * m->sb + h * m->sh;                                                       \
  }                                                                                            \
  static bool hm_open_##SFX(const tpu_operand_t* op, hm_##SFX* m) {                            \
    const int64_t* z = op->sizes;                                                              \
    m->owned = NULL;                                                                           \
    if (op->dtype == CDT && (op->strides[3] == 1 || z[3] == 1) &&                              \
        (op->strides[2] >= z[3] || z[2] == 1) && op->strides[0] >= 0 && op->strides[1] >= 0) { \
      m->p = (T*)tpu__operand_ptr(op);                                                         \
      m->sb = op->strides[0]; m->sh = op->strides[1];                                          \
      m->ld = z[2] == 1 ? (z[3] > 0 ? z[3] : 1) : op->strides[2];                              \
      return true;                                                                             \
    }                                                                                          \
    m->owned = m->p = tpu__pack_alloc(op, CDT);                                                \
    m->sb = z[1] * z[2] * z[3]; m->sh = z[2] * z[3]; m->ld = z[3] > 0 ? z[3] : 1;             \
    return m->p != NULL;                                                                       \
  }                                                                                            \
  /* An output: in place when dense in CDT (zeroed when it accumulates), else scratch.       */ \
  static bool hm_out_##SFX(const tpu_operand_t* op, hm_##SFX* m, bool zero) {                 \
    const int64_t* z = op->sizes;                                                              \
    size_t cnt = (size_t)(z[0] * z[1] * z[2] * z[3]);                                          \
    m->sb = z[1] * z[2] * z[3]; m->sh = z[2] * z[3]; m->ld = z[3] > 0 ? z[3] : 1;             \
    if (op->dtype == CDT && tpu__operand_is_contiguous(op)) {                                  \
      m->owned = NULL;                                                                         \
      m->p = (T*)tpu__operand_ptr(op);                                                         \
      if (zero) memset(m->p, 0, sizeof(T) * cnt);                                              \
      return true;                                                                             \
    }                                                                                          \
    m->owned = m->p = zero ? tpu__calloc(cnt + 1, sizeof(T)) : tpu__malloc(sizeof(T) * (cnt + 1)); \
    return m->p != NULL;                                                                       \
  }                                                                                            \
  static void hm_close_##SFX(tpu_operand_t* op, hm_##SFX* m, bool store) {                     \
    if (m->owned && store) tpu__unpack(op, m->owned, CDT);                                     \
    tpu__free(m->owned);                                                                       \
    m->owned = NULL;                                                                           \
  }                                                                                            \
  static inline T dot_##SFX(const T* a, const T* b, int64_t n) {                       \
    T acc[LANES] = {0}, tail = 0;                                                              \
    int64_t j = 0;                                                                             \
    for (; j + LANES <= n; j += LANES)                                                         \
      for (int l = 0; l < LANES; ++l) acc[l] += a[j + l] * b[j + l];                           \
    for (; j < n; ++j) tail += a[j] * b[j];                                                    \
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail; \
  }                                                                                            \
  static inline T sum_##SFX(const T* a, int64_t n) {                                          \
    T acc[LANES] = {0}, tail = 0;                                                              \
    int64_t j = 0;                                                                             \
    for (; j + LANES <= n; j += LANES)                                                         \
      for (int l = 0; l < LANES; ++l) acc[l] += a[j + l];                                      \
    for (; j < n; ++j) tail += a[j];                                                           \
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail; \
  }                                                                                            \
  /* Row loops between the GEMMs of one head: split across the pool above the work          \
   * threshold (when the heads themselves do not already run in a region). */               \
  /* A row's rowsum(dO * O); where o is NULL, rowsum(dP * P) (equal in exact arithmetic):  \
   * an O rounded to bf16/f16 would put its rounding into every dq and dk element. */       \
  static inline T row_term_##SFX(const T* go, const T* o, int64_t Ev, const T* p, const T* dp, \
                                 int64_t S) {                                                  \
    return o ? dot_##SFX(go, o, Ev) : dot_##SFX(p, dp, S);                                     \
  }                                                                                            \
  typedef struct sm_ctx_##SFX##_s {                                                            \
    T* sc; T* lse; int64_t S; T* dp; const T* gop; const T* op; int64_t ldgo, ldo, Ev;         \
  } sm_ctx_##SFX;                                                                              \
  static void attn_rows_##SFX(int64_t L, int64_t S, tpu_parallel_fn fn, sm_ctx_##SFX* C) {     \
    if (L > 1 && L * S >= TPU_PARALLEL_MIN_WORK)                                               \
      tpu_status_free(tpu__parallel_for(L, TPU_PARALLEL_MIN_WORK / cnt1(S) + 1, fn, C));       \
    else                                                                                       \
      fn(C, 0, L, 0);                                                                          \
  }                                                                                            \
  TPU_ISA_CLONES static tpu_status_t sm_rows_##SFX(void* arg, int64_t ib, int64_t ie, int tid) { \
    sm_ctx_##SFX* C = arg;                                                                     \
    int64_t S = C->S;                                                                          \
    for (int64_t i = ib; i < ie; ++i) {                                                        \
      T* row = C->sc + i * S;                                                                  \
      T mx = -(T)INFINITY, acc[LANES];                                                         \
      int64_t j = 0;                                                                           \
      for (int l = 0; l < LANES; ++l) acc[l] = -(T)INFINITY;                                   \
      for (; j + LANES <= S; j += LANES)                                                       \
        for (int l = 0; l < LANES; ++l) acc[l] = row[j + l] > acc[l] ? row[j + l] : acc[l];   \
      for (int l = 0; l < LANES; ++l) mx = acc[l] > mx ? acc[l] : mx;                          \
      for (; j < S; ++j) mx = row[j] > mx ? row[j] : mx;                                       \
      if (mx == -(T)INFINITY) { /* fully masked row: zeros, as ATen's _safe_softmax */         \
        for (j = 0; j < S; ++j) row[j] = 0;                                                    \
        C->lse[i] = -(T)INFINITY;                                                              \
        continue;                                                                              \
      }                                                                                        \
      for (j = 0; j < S; ++j) row[j] = EXP(row[j] - mx);                                       \
      T s = sum_##SFX(row, S);                                                                 \
      T inv = (T)1 / s; /* ATen's softmax also scales by the reciprocal */                    \
      for (j = 0; j < S; ++j) row[j] *= inv;                                                   \
      C->lse[i] = mx + LOG(s);                                                                 \
    }                                                                                          \
    return NULL;                                                                               \
  }                                                                                            \
  TPU_ISA_CLONES static tpu_status_t p_rows_##SFX(void* arg, int64_t ib, int64_t ie, int tid) { \
    sm_ctx_##SFX* C = arg;                                                                     \
    int64_t S = C->S;                                                                          \
    for (int64_t i = ib; i < ie; ++i) {                                                        \
      T l = C->lse[i];                                                                         \
      T* row = C->sc + i * S;                                                                  \
      if (l == -(T)INFINITY) { for (int64_t j = 0; j < S; ++j) row[j] = 0; continue; }         \
      for (int64_t j = 0; j < S; ++j) row[j] = EXP(row[j] - l);                                \
    }                                                                                          \
    return NULL;                                                                               \
  }                                                                                            \
  TPU_ISA_CLONES static tpu_status_t ds_rows_##SFX(void* arg, int64_t ib, int64_t ie, int tid) { \
    sm_ctx_##SFX* C = arg;                                                                     \
    int64_t S = C->S;                                                                          \
    for (int64_t i = ib; i < ie; ++i) {                                                        \
      T* dp = C->dp + i * S;                                                                   \
      const T* p = C->sc + i * S;                                                              \
      T di = row_term_##SFX(C->gop + i * C->ldgo, C->op ? C->op + i * C->ldo : NULL, C->Ev, p, dp, S); \
      for (int64_t j = 0; j < S; ++j) dp[j] = p[j] * (dp[j] - di);                             \
    }                                                                                          \
    return NULL;                                                                               \
  }                                                                                            \
  static void gemm_##SFX(bool ta, bool tb, int64_t m, int64_t nn, int64_t k, T alpha,          \
                         const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,       \
                         int64_t ldc) {                                                        \
    if (m == 0 || nn == 0) return;                                                             \
    if (k == 0) {                                                                              \
      for (int64_t i = 0; i < m; ++i)                                                          \
        for (int64_t j = 0; j < nn; ++j) c[i * ldc + j] = beta == 0 ? 0 : beta * c[i * ldc + j]; \
      return;                                                                                  \
    }                                                                                          \
    tpu__gemm(CDT, ta, tb, m, nn, k, alpha, a, ld(lda), b, ld(ldb), beta, c, ld(ldc));        \
  }                                                                                            \
  typedef struct heads_##SFX##_s {                                                             \
    tpu_node_t* n; const sdpa_dims_t* d; const tpu_operand_t* bias; int64_t grp;               \
    hm_##SFX q, k, v, go, o, out, dq, dk, dv;                                                  \
    T* lse;                                                                                    \
    bool fast; /* host/attn_avx512f32.c's heads (FAST: the f32 template) */                   \
    int64_t range_rows; /* fast forward: query rows per work item */                           \
  } heads_##SFX;                                                                               \
  static tpu_attn_f32_t fast_head_##SFX(const heads_##SFX* X, int64_t b, int64_t h, int64_t hk) { \
    const sdpa_dims_t* d = X->d;                                                               \
    tpu_attn_f32_t a = {d->L, d->S, d->E, d->Ev, (float)X->n->da[0], X->n->ia[0] != 0,         \
                        (const float*)hm_at_##SFX(&X->q, b, h), (const float*)hm_at_##SFX(&X->k, b, hk), \
                        (const float*)hm_at_##SFX(&X->v, b, hk), X->q.ld, X->k.ld, X->v.ld};   \
    if (X->bias && present(X->bias)) { /* read in place: fast_ok took f32 and bool only */     \
      tpu_operand_t sl = bias_slice(X->bias, d, b, h);                                         \
      a.bias = tpu__operand_ptr(&sl);                                                          \
      a.bias_dtype = sl.dtype;                                                                 \
      a.bias_sr = sl.strides[0];                                                               \
      a.bias_sc = sl.strides[1];                                                               \
    }                                                                                          \
    return a;                                                                                  \
  }                                                                                            \
  static bool fast_ok_##SFX(const tpu_node_t* n, const tpu_operand_t* bias) {                  \
    bool bias_ok = !(bias && present(bias)) ||                                                 \
                   (!bias->is_scalar && (bias->dtype == TPU_DTYPE_F32 || bias->dtype == TPU_DTYPE_BOOL)); \
    return FAST && bias_ok && n->da[0] != 0 && attn_kernel_enabled();                          \
  }                                                                                            \
  /* scores = scale * q k^T + bias, causal cells and false mask cells set to -inf */           \
  static void scores_##SFX(const heads_##SFX* X, int64_t b, int64_t h, int64_t hk, T* sc, T* tmp) { \
    const tpu_node_t* n = X->n;                                                                \
    const sdpa_dims_t* d = X->d;                                                               \
    T scale = (T)n->da[0];                                                                     \
    gemm_##SFX(false, true, d->L, d->S, d->E, scale, hm_at_##SFX(&X->q, b, h), X->q.ld,        \
               hm_at_##SFX(&X->k, b, hk), X->k.ld, 0, sc, d->S);                               \
    const tpu_operand_t* bias = X->bias;                                                       \
    if (bias && present(bias)) {                                                               \
      tpu_operand_t sl = bias_slice(bias, d, b, h);                                            \
      tpu__pack(&sl, NULL, CDT, tmp);                                                          \
      bool is_bool = bias->dtype == TPU_DTYPE_BOOL;                                            \
      for (int64_t i = 0; i < d->L * d->S; ++i)                                                \
        sc[i] = is_bool ? (tmp[i] != 0 ? sc[i] : -(T)INFINITY) : sc[i] + tmp[i];               \
    }                                                                                          \
    if (n->ia[0])                                                                              \
      for (int64_t i = 0; i < d->L; ++i)                                                       \
        for (int64_t j = i + 1; j < d->S; ++j) sc[i * d->S + j] = -(T)INFINITY;                \
  }                                                                                            \
  /* A causal head without bias in blocks of CAUSAL_ROWS query rows: row i sees keys        \
   * [0, i + 1), so a block needs only the keys up to its last row and the masked upper    \
   * part of the score matrix is neither multiplied nor exponentiated (about half of both  \
   * GEMMs at L = S). Masked cells inside the block are -inf and give exact zeros, so a    \
   * row's softmax and output are those of the full matrix. */                             \
  static void causal_head_##SFX(const heads_##SFX* X, int64_t b, int64_t h, int64_t hk, int64_t bh, T* sc) { \
    const sdpa_dims_t* d = X->d;                                                               \
    T scale = (T)X->n->da[0];                                                                  \
    for (int64_t i0 = 0; i0 < d->L; i0 += CAUSAL_ROWS) {                                       \
      int64_t m = d->L - i0 < CAUSAL_ROWS ? d->L - i0 : CAUSAL_ROWS;                           \
      int64_t c = i0 + m < d->S ? i0 + m : d->S; /* keys the block's rows see */               \
      T* lse = X->lse + bh * d->L + i0;                                                        \
      if (c <= 0) { /* rows with no key at all (S = 0): zeros, as ATen */                      \
        for (int64_t i = 0; i < m; ++i) lse[i] = -(T)INFINITY;                                 \
        gemm_##SFX(false, false, m, d->Ev, 0, 1, sc, 1, hm_at_##SFX(&X->v, b, hk), X->v.ld, 0, \
                   hm_at_##SFX(&X->out, b, h) + i0 * X->out.ld, X->out.ld);                    \
        continue;                                                                              \
      }                                                                                        \
      gemm_##SFX(false, true, m, c, d->E, scale, hm_at_##SFX(&X->q, b, h) + i0 * X->q.ld, X->q.ld, \
                 hm_at_##SFX(&X->k, b, hk), X->k.ld, 0, sc, c);                                \
      for (int64_t i = 0; i < m; ++i)                                                          \
        for (int64_t j = i0 + i + 1; j < c; ++j) sc[i * c + j] = -(T)INFINITY;                 \
      sm_ctx_##SFX C = {sc, lse, c, NULL, NULL, NULL, 0, 0, 0};                                \
      attn_rows_##SFX(m, c, sm_rows_##SFX, &C);                                                \
      gemm_##SFX(false, false, m, d->Ev, c, 1, sc, c, hm_at_##SFX(&X->v, b, hk), X->v.ld, 0,   \
                 hm_at_##SFX(&X->out, b, h) + i0 * X->out.ld, X->out.ld);                      \
    }                                                                                          \
  }                                                                                            \
  /* Heads run in parallel, each with its own score buffers and single-threaded GEMMs; a  \
   * head's rows then run serially (a nested region), in the same order as before. */       \
  static tpu_status_t fwd_heads_##SFX(void* arg, int64_t hb, int64_t he, int tid) {           \
    heads_##SFX* X = arg;                                                                      \
    const sdpa_dims_t* d = X->d;                                                               \
    T* sc = tpu__malloc(sizeof(T) * (size_t)(2 * d->L * d->S + 1));                            \
    if (!sc) return TPU_HOST_NOMEM();                                                          \
    T* tmp = sc + d->L * d->S;                                                                 \
    bool causal_only = X->n->ia[0] && !(X->bias && present(X->bias));                         \
    for (int64_t bh = hb; bh < he; ++bh) {                                                     \
      int64_t b = bh / d->H, h = bh % d->H, hk = h / X->grp;                                   \
      if (causal_only) { causal_head_##SFX(X, b, h, hk, bh, sc); continue; }                   \
      scores_##SFX(X, b, h, hk, sc, tmp);                                                      \
      sm_ctx_##SFX C = {sc, X->lse + bh * d->L, d->S, NULL, NULL, NULL, 0, 0, 0};              \
      attn_rows_##SFX(d->L, d->S, sm_rows_##SFX, &C);                                          \
      gemm_##SFX(false, false, d->L, d->Ev, d->S, 1, sc, d->S, hm_at_##SFX(&X->v, b, hk), X->v.ld, 0, \
                 hm_at_##SFX(&X->out, b, h), X->out.ld);                                       \
    }                                                                                          \
    tpu__free(sc);                                                                             \
    return NULL;                                                                               \
  }                                                                                            \
  /* Heads in parallel when there are several and enough work; inside the region each     \
   * head's GEMMs are single calls (tpu__gemm does not split within a region). */           \
  static tpu_status_t run_heads_##SFX(tpu_parallel_fn fn, heads_##SFX* X, int64_t nheads,     \
                                      int64_t per_head) {                                      \
    if (nheads > 1 && nheads * per_head >= TPU_PARALLEL_MIN_WORK)                              \
      return tpu__parallel_for(nheads, 1, fn, X);                                              \
    return fn(X, 0, nheads, 0);                                                                \
  }                                                                                            \
  /* Fast forward: items are (head, range of query rows); a row's result does not depend       \
   * on its range, so ranges are cut by the thread count, to give each thread work. */         \
  static tpu_status_t fast_fwd_##SFX(void* arg, int64_t ib, int64_t ie, int tid) {             \
    heads_##SFX* X = arg;                                                                      \
    const sdpa_dims_t* d = X->d;                                                               \
    T* sc = tpu__malloc(sizeof(T) * tpu__attn_f32_scratch(d->S, d->E, d->Ev));                 \
    if (!sc) return TPU_HOST_NOMEM();                                                          \
    int64_t ranges = tpu__cdiv(d->L, X->range_rows);                                           \
    for (int64_t it = ib; it < ie; ++it) {                                                     \
      int64_t bh = it / ranges, r0 = it % ranges * X->range_rows;                              \
      int64_t b = bh / d->H, h = bh % d->H, r1 = r0 + X->range_rows < d->L ? r0 + X->range_rows : d->L; \
      tpu_attn_f32_t a = fast_head_##SFX(X, b, h, h / X->grp);                                 \
      tpu__attn_f32_fwd(&a, r0, r1, (float*)hm_at_##SFX(&X->out, b, h), X->out.ld,             \
                        (float*)(X->lse + bh * d->L), (float*)sc);                             \
    }                                                                                          \
    tpu__free(sc);                                                                             \
    return NULL;                                                                               \
  }                                                                                            \
  static tpu_status_t sdpa_fwd_##SFX(tpu_node_t* n) {                                          \
    sdpa_dims_t d = sdpa_dims(n, 0);                                                           \
    heads_##SFX X = {n, &d, &n->in[3], d.H / d.Hk};                                            \
    X.fast = fast_ok_##SFX(n, &n->in[3]);                                                      \
    int64_t heads = d.B * d.H, blocks = tpu__cdiv(d.L, TPU_ATTN_ROWS), threads = tpu__num_threads(); \
    int64_t per_head = heads >= 2 * threads ? 1 : tpu__cdiv(2 * threads, heads > 0 ? heads : 1); \
    per_head = per_head < blocks ? per_head : blocks > 0 ? blocks : 1;                         \
    X.range_rows = (blocks > 0 ? tpu__cdiv(blocks, per_head) : 1) * TPU_ATTN_ROWS;             \
    T* lse = X.lse = tpu__malloc(sizeof(T) * (size_t)(d.B * d.H * d.L + 1));                   \
    bool ok = lse && hm_open_##SFX(&n->in[0], &X.q) && hm_open_##SFX(&n->in[1], &X.k) &&       \
              hm_open_##SFX(&n->in[2], &X.v) && hm_out_##SFX(&n->out[0], &X.out, false);       \
    tpu_status_t st = !ok ? TPU_HOST_NOMEM()                                                   \
                      : X.fast ? run_heads_##SFX(fast_fwd_##SFX, &X, heads * tpu__cdiv(d.L, X.range_rows), \
                                                 X.range_rows * d.S * (d.E + d.Ev))            \
                      : run_heads_##SFX(fwd_heads_##SFX, &X, heads, d.L * d.S * (d.E + d.Ev)); \
    if (!st) tpu__unpack(&n->out[1], lse, CDT);                                                \
    hm_close_##SFX(&n->out[0], &X.out, !st);                                                   \
    hm_close_##SFX(NULL, &X.q, false);                                                         \
    hm_close_##SFX(NULL, &X.k, false);                                                         \
    hm_close_##SFX(NULL, &X.v, false);                                                         \
    tpu__free(lse);                                                                            \
    return st;                                                                                 \
  }                                                                                            \
  /* One head's backward: dv, dk of its KV head accumulate (heads of a GQA group in order);  \
   * db (a broadcast bias gradient) accumulates across heads. */                             \
  static void bwd_head_##SFX(heads_##SFX* X, int64_t bh, T* p, T* dp, T* tmp, T* db,           \
                             const int64_t* bstr) {                                            \
    const sdpa_dims_t* d = X->d;                                                               \
    int64_t b = bh / d->H, h = bh % d->H, hk = h / X->grp;                                     \
    T scale = (T)X->n->da[0];                                                                  \
    const T* qp = hm_at_##SFX(&X->q, b, h);                                                    \
    const T* kp = hm_at_##SFX(&X->k, b, hk);                                                   \
    const T* vp = hm_at_##SFX(&X->v, b, hk);                                                   \
    const T* gop = hm_at_##SFX(&X->go, b, h);                                                  \
    /* O narrower than the compute dtype: the row terms come from P and dP (sm_ctx) */      \
    const T* op = X->n->in[5].dtype == CDT ? hm_at_##SFX(&X->o, b, h) : NULL;                  \
    T* dvp = hm_at_##SFX(&X->dv, b, hk);                                                       \
    T* dkp = hm_at_##SFX(&X->dk, b, hk);                                                       \
    if (X->n->ia[0] && !db && !(X->bias && present(X->bias))) {                                \
      /* causal without bias: blocks of query rows over the keys they see (as the forward) */ \
      for (int64_t i0 = 0; i0 < d->L; i0 += CAUSAL_ROWS) {                                     \
        int64_t m = d->L - i0 < CAUSAL_ROWS ? d->L - i0 : CAUSAL_ROWS;                         \
        int64_t c = i0 + m < d->S ? i0 + m : d->S;                                             \
        const T* qb = qp + i0 * X->q.ld;                                                       \
        const T* gb = gop + i0 * X->go.ld;                                                     \
        gemm_##SFX(false, true, m, c, d->E, scale, qb, X->q.ld, kp, X->k.ld, 0, p, c);         \
        for (int64_t i = 0; i < m; ++i)                                                        \
          for (int64_t j = i0 + i + 1; j < c; ++j) p[i * c + j] = -(T)INFINITY;                \
        sm_ctx_##SFX C = {p, X->lse + bh * d->L + i0, c, dp, gb, op ? op + i0 * X->o.ld : NULL, X->go.ld, X->o.ld, d->Ev}; \
        attn_rows_##SFX(m, c, p_rows_##SFX, &C);                                               \
        gemm_##SFX(true, false, c, d->Ev, m, 1, p, c, gb, X->go.ld, 1, dvp, X->dv.ld);         \
        gemm_##SFX(false, true, m, c, d->Ev, 1, gb, X->go.ld, vp, X->v.ld, 0, dp, c);          \
        attn_rows_##SFX(m, c, ds_rows_##SFX, &C);                                              \
        gemm_##SFX(false, false, m, d->E, c, scale, dp, c, kp, X->k.ld, 0,                     \
                   hm_at_##SFX(&X->dq, b, h) + i0 * X->dq.ld, X->dq.ld);                       \
        gemm_##SFX(true, false, c, d->E, m, scale, dp, c, qb, X->q.ld, 1, dkp, X->dk.ld);      \
      }                                                                                        \
      return;                                                                                  \
    }                                                                                          \
    scores_##SFX(X, b, h, hk, p, tmp);                                                         \
    sm_ctx_##SFX C = {p, X->lse + bh * d->L, d->S, dp, gop, op, X->go.ld, X->o.ld, d->Ev};     \
    attn_rows_##SFX(d->L, d->S, p_rows_##SFX, &C);                                             \
    gemm_##SFX(true, false, d->S, d->Ev, d->L, 1, p, d->S, gop, X->go.ld, 1, dvp, X->dv.ld);   \
    gemm_##SFX(false, true, d->L, d->S, d->Ev, 1, gop, X->go.ld, vp, X->v.ld, 0, dp, d->S);    \
    if (db) {                                                                                  \
      for (int64_t i = 0; i < d->L; ++i) {                                                     \
        T di = row_term_##SFX(gop + i * X->go.ld, op ? op + i * X->o.ld : NULL, d->Ev,          \
                              p + i * d->S, dp + i * d->S, d->S);                              \
        for (int64_t j = 0; j < d->S; ++j) {                                                   \
          T ds = p[i * d->S + j] * (dp[i * d->S + j] - di);                                    \
          dp[i * d->S + j] = ds;                                                               \
          db[b * bstr[0] + h * bstr[1] + i * bstr[2] + j * bstr[3]] += ds;                     \
        }                                                                                      \
      }                                                                                        \
    } else {                                                                                   \
      attn_rows_##SFX(d->L, d->S, ds_rows_##SFX, &C);                                          \
    }                                                                                          \
    gemm_##SFX(false, false, d->L, d->E, d->S, scale, dp, d->S, kp, X->k.ld, 0,                \
               hm_at_##SFX(&X->dq, b, h), X->dq.ld);                                           \
    gemm_##SFX(true, false, d->S, d->E, d->L, scale, dp, d->S, qp, X->q.ld, 1, dkp, X->dk.ld); \
  }                                                                                            \
  /* Region over KV heads: each owns its dk/dv slice and runs its query heads in order. */   \
  static tpu_status_t bwd_kv_heads_##SFX(void* arg, int64_t kb, int64_t ke, int tid) {        \
    heads_##SFX* X = arg;                                                                      \
    const sdpa_dims_t* d = X->d;                                                               \
    size_t need = X->fast ? tpu__attn_f32_scratch(d->S, d->E, d->Ev) : (size_t)(3 * d->L * d->S + 1); \
    T* p = tpu__malloc(sizeof(T) * need);                                                      \
    if (!p) return TPU_HOST_NOMEM();                                                           \
    for (int64_t kv = kb; kv < ke; ++kv) {                                                     \
      int64_t b = kv / d->Hk, hk = kv % d->Hk;                                                 \
      for (int64_t g = 0; g < X->grp; ++g) {                                                   \
        int64_t h = hk * X->grp + g, bh = b * d->H + h;                                        \
        if (!X->fast) {                                                                        \
          bwd_head_##SFX(X, bh, p, p + d->L * d->S, p + 2 * d->L * d->S, NULL, NULL);          \
          continue;                                                                            \
        }                                                                                      \
        tpu_attn_f32_t a = fast_head_##SFX(X, b, h, hk);                                       \
        tpu__attn_f32_bwd(&a, (const float*)hm_at_##SFX(&X->go, b, h), X->go.ld,               \
                          (const float*)hm_at_##SFX(&X->o, b, h), X->o.ld, (const float*)(X->lse + bh * d->L), \
                          (float*)hm_at_##SFX(&X->dq, b, h), X->dq.ld, (float*)hm_at_##SFX(&X->dk, b, hk), \
                          X->dk.ld, (float*)hm_at_##SFX(&X->dv, b, hk), X->dv.ld, (float*)p);  \
      }                                                                                        \
    }                                                                                          \
    tpu__free(p);                                                                              \
    return NULL;                                                                               \
  }                                                                                            \
  /* P is rebuilt from the saved logsumexp; dS = P * (dO V^T - rowsum(dO * O)). Absent      \
   * gradients are still computed (dq, dk, dv come from one pass) into scratch.            */ \
  static tpu_status_t sdpa_bwd_##SFX(tpu_node_t* n) {                                          \
    sdpa_dims_t d = sdpa_dims(n, 1);                                                           \
    const tpu_operand_t* bias = &n->in[4];                                                     \
    bool gbias = n->ia[1];                                                                     \
    int64_t bshape[4] = {1, 1, 1, 1}, bstr[4] = {0, 0, 0, 0}, bnum = 1;                        \
    if (gbias) {                                                                               \
      int off = 4 - bias->ndim;                                                                \
      for (int i = 0; i < bias->ndim; ++i) bshape[off + i] = bias->sizes[i];                   \
      for (int i = 3; i >= 0; --i) { bstr[i] = bshape[i] == 1 ? 0 : bnum; bnum *= bshape[i]; } \
    }                                                                                          \
    heads_##SFX X = {n, &d, bias, d.H / d.Hk};                                                 \
    /* one KV head per thread at a time: with fewer than 4 the generic path splits more */     \
    X.fast = !gbias && fast_ok_##SFX(n, bias) && d.B * d.Hk >= 4;                              \
    /* absent gradients get scratch of their full shape, as the inputs' shapes give */        \
    tpu_operand_t grads[3];                                                                    \
    const tpu_operand_t* like[3] = {&n->in[1], &n->in[2], &n->in[3]};                          \
    for (int i = 0; i < 3; ++i) {                                                              \
      grads[i] = n->out[i];                                                                    \
      if (tpu__output_absent(&grads[i])) {                                                     \
        grads[i] = *like[i];                                                                   \
        grads[i].value = NULL;                                                                 \
        grads[i].dtype = TPU_DTYPE_INVALID;                                                    \
      }                                                                                        \
    }                                                                                          \
    void* buf[2] = {0};                                                                        \
    T* db = gbias ? (buf[0] = tpu__calloc((size_t)bnum, sizeof(T))) : NULL;                    \
    T* p = gbias ? (buf[1] = tpu__malloc(sizeof(T) * (size_t)(3 * d.L * d.S + 1))) : NULL;     \
    X.lse = tpu__pack_alloc(&n->in[6], CDT);                                                   \
    bool ok = X.lse && (!gbias || (db && p)) && hm_open_##SFX(&n->in[0], &X.go) &&             \
              hm_open_##SFX(&n->in[1], &X.q) && hm_open_##SFX(&n->in[2], &X.k) &&              \
              hm_open_##SFX(&n->in[3], &X.v) && hm_open_##SFX(&n->in[5], &X.o) &&              \
              hm_out_##SFX(&grads[0], &X.dq, false) && hm_out_##SFX(&grads[1], &X.dk, true) && \
              hm_out_##SFX(&grads[2], &X.dv, true);                                            \
    tpu_status_t st = ok ? NULL : TPU_HOST_NOMEM();                                            \
    if (!st && gbias) /* the bias gradient sums over heads: one head after another */          \
      for (int64_t bh = 0; bh < d.B * d.H; ++bh)                                               \
        bwd_head_##SFX(&X, bh, p, p + d.L * d.S, p + 2 * d.L * d.S, db, bstr);                 \
    else if (!st)                                                                              \
      st = run_heads_##SFX(bwd_kv_heads_##SFX, &X, d.B * d.Hk,                                 \
                           (d.H / d.Hk) * d.L * d.S * (2 * d.E + 2 * d.Ev));                   \
    hm_##SFX* outs[3] = {&X.dq, &X.dk, &X.dv};                                                 \
    for (int i = 0; i < 3; ++i)                                                                \
      hm_close_##SFX(&n->out[i], outs[i], !st && !tpu__output_absent(&n->out[i]));             \
    if (!st && db) tpu__unpack(&n->out[3], db, CDT);                                           \
    hm_##SFX* ins[5] = {&X.go, &X.q, &X.k, &X.v, &X.o};                                        \
    for (int i = 0; i < 5; ++i) hm_close_##SFX(NULL, ins[i], false);                           \
    tpu__free(X.lse);                                                                          \
    free_all(buf, 2);                                                                          \
    return st;                                                                                 \
  }


SDPA_DEFINE(float, f32, TPU_DTYPE_F32, tpu__vexpf, logf, true)
SDPA_DEFINE(double, f64, TPU_DTYPE_F64, exp, log, false)

static tpu_status_t sdpa_kernel(tpu_node_t* n) {
  return n->compute == TPU_DTYPE_F64 ? sdpa_fwd_f64(n) : sdpa_fwd_f32(n);
}
static tpu_status_t sdpa_backward_kernel(tpu_node_t* n) {
  return n->compute == TPU_DTYPE_F64 ? sdpa_bwd_f64(n) : sdpa_bwd_f32(n);
}

/* ---- pointwise losses ------------------------------------------------------------- */

enum { LOSS_MSE = 0, LOSS_BCE = 1, LOSS_SMOOTH_L1 = 2, LOSS_HUBER = 3 };

static void bcast_shape(const tpu_node_t* n, int64_t* shape, int* nd) {
  *nd = 0;
  for (int i = 0; i < n->n_in; ++i) {
    const tpu_operand_t* op = &n->in[i];
    if (!op->value) continue;
    int m = op->ndim > *nd ? op->ndim : *nd;
    int64_t out[TPU_MAX_DIMS];
    for (int k = 0; k < m; ++k) {
      int a = k - (m - *nd), c = k - (m - op->ndim);
      int64_t sa = a >= 0 ? shape[a] : 1, sc = c >= 0 ? op->sizes[c] : 1;
      out[k] = sa == 1 ? sc : sa;
    }
    memcpy(shape, out, sizeof(int64_t) * (size_t)m);
    *nd = m;
  }
}

/* forward inputs: self, target, [weight]; backward: grad, self, target, [weight]. */
static tpu_status_t point_loss_kernel(tpu_node_t* n) {
  bool bw = n->kind == TPU_KIND_POINT_LOSS_BACKWARD;
  int loss = (int)n->ia[0];
  int64_t red = n->ia[1];
  double prm = n->da[0];
  int64_t shape[TPU_MAX_DIMS];
  int nd;
  bcast_shape(n, shape, &nd);
  int64_t cnt = prod(shape, 0, nd);
  void* buf[5] = {0};
  bool oom = false;
  for (int i = 0; i < n->n_in; ++i) {
    if (!present(&n->in[i])) continue;
    buf[i] = pack_expanded(&n->in[i], nd, shape, TPU_DTYPE_F64);
    oom |= !buf[i];
  }
  double* r = buf[4] = tpu__malloc(sizeof(double) * cnt1(cnt));
  if (oom || !r) {
    free_all(buf, 5);
    return TPU_HOST_NOMEM();
  }
  int a0 = bw ? 1 : 0;
  const double *g = bw ? buf[0] : NULL, *x = buf[a0], *y = buf[a0 + 1];
  const double* w = loss == LOSS_BCE ? buf[a0 + 2] : NULL;
  if (loss == LOSS_BCE)
    for (int64_t i = 0; i < cnt; ++i)
      if (!(x[i] >= 0 && x[i] <= 1)) {
        free_all(buf, 5);
        return tpu_status_make(TPU_INVALID_ARGUMENT, "%s: all elements of input should be between 0 and 1",
                               tpu__node_describe(n));
      }
  /* backward: ATen scales by the element count of self for 'mean' */
  double norm = red == 1 ? 1.0 / (double)n->ia[2] : 1.0;
  double sum = 0;
  for (int64_t i = 0; i < cnt; ++i) {
    double dlt = x[i] - y[i], ad = fabs(dlt), v;
    if (!bw) {
      switch (loss) {
        case LOSS_MSE: v = dlt * dlt; break;
        case LOSS_BCE: {
          double lx = log(x[i]), l1x = log(1 - x[i]);
          v = -((y[i]) * (lx > -100 ? lx : -100) + (1 - y[i]) * (l1x > -100 ? l1x : -100));
          break;
        }
        case LOSS_SMOOTH_L1: v = ad < prm ? 0.5 * ad * ad / prm : ad - 0.5 * prm; break;
        default: v = ad < prm ? 0.5 * ad * ad : prm * (ad - 0.5 * prm); break;
      }
      if (w) v *= w[i];
      sum += v;
    } else {
      switch (loss) {
        case LOSS_MSE: v = 2 * dlt; break;
        case LOSS_BCE: {
          double den = (1 - x[i]) * x[i];
          v = dlt / (den > 1e-12 ? den : 1e-12);
          break;
        }
        case LOSS_SMOOTH_L1: v = dlt <= -prm ? -1 : dlt >= prm ? 1 : dlt / prm; break;
        default: v = dlt <= -prm ? -prm : dlt >= prm ? prm : dlt; break;
      }
      v *= g[i] * norm;
      if (w) v *= w[i];
    }
    r[i] = v;
  }
  if (bw || red == 0) {
    tpu__unpack(&n->out[0], r, TPU_DTYPE_F64);
  } else {
    double s = red == 1 ? sum / (double)cnt : sum;
    tpu__unpack(&n->out[0], &s, TPU_DTYPE_F64);
  }
  free_all(buf, 5);
  return NULL;
}


/* ---- reflection / replication padding ----------------------------------------------- */

enum { PAD_REFLECT = 0, PAD_REPLICATE = 1 };

/* v rounded to dtype t (and widened back), the way one `+=` in t rounds in ATen's CPU
 * loops: c10's reduced floats add in float32 and round, bool adds to "any". */
static inline double round_as(tpu_dtype_t t, double v) {
  switch (t) {
    case TPU_DTYPE_F32: return (float)v;
    case TPU_DTYPE_BF16: return tpu__bf16_to_f32(tpu__f32_to_bf16((float)v));
    case TPU_DTYPE_F16: return (double)(_Float16)(float)v;
    case TPU_DTYPE_BOOL: return v != 0;
    default: return v;
  }
}

/* The input index that output index j of a padded dim reads, with lo elements padded
 * before it (negative lo crops): reflect mirrors about the edge element, replicate
 * clamps. These are ATen's mappings; the builder guarantees reflect's |lo|, |hi| < size,
 * so one reflection lands inside. */
static int64_t edge_index(int mode, int64_t j, int64_t size, int64_t lo) {
  int64_t x = j - lo;
  if (mode == PAD_REFLECT) return x < 0 ? -x : x >= size ? 2 * (size - 1) - x : x;
  return x < 0 ? 0 : x >= size ? size - 1 : x;
}

/* A padded tensor as planes (the unpadded leading dims) of k padded dims, outermost
 * first; rows are the innermost padded dim's lines of the output. */
typedef struct edge_s {
  int k;
  int64_t planes, in[3], out[3], in_stride[3];
  int64_t in_plane, out_plane, rows_per_plane;
  int64_t* map[3];   /* per padded dim: the input index of each output index */
  const char* src;   /* forward: packed input (element size es) */
  char* dst;         /* forward: dense output */
  size_t es;
  const double* g;   /* backward: packed grad_output */
  double* acc;       /* backward: dense grad_input */
  tpu_dtype_t dt;    /* backward: grad_input's dtype, rounded to after every add */
} edge_t;

static bool edge_init(edge_t* E, const tpu_node_t* n, const tpu_operand_t* big, const tpu_operand_t* small) {
  int k = E->k = (int)n->ia[1], nd = small->ndim;
  E->planes = prod(small->sizes, 0, nd - k);
  E->in_plane = prod(small->sizes, nd - k, nd);
  E->out_plane = prod(big->sizes, nd - k, nd);
  E->rows_per_plane = prod(big->sizes, nd - k, nd - 1);
  int64_t st = 1;
  for (int j = k - 1; j >= 0; --j) {
    int dim = nd - k + j;
    E->in[j] = small->sizes[dim];
    E->out[j] = big->sizes[dim];
    E->in_stride[j] = st;
    st *= E->in[j];
    int64_t lo = n->ilist[2 * (k - 1 - j)];
    E->map[j] = tpu__malloc(sizeof(int64_t) * cnt1(E->out[j]));
    if (!E->map[j]) return false;
    for (int64_t o = 0; o < E->out[j]; ++o) E->map[j][o] = edge_index((int)n->ia[0], o, E->in[j], lo);
  }
  return true;
}

static void edge_free(edge_t* E) {
  for (int j = 0; j < 3; ++j) tpu__free(E->map[j]);
}

/* Offset (within the input) of the start of output row r, which lies in plane *plane. */
static int64_t edge_row_base(const edge_t* E, int64_t r, int64_t* plane) {
  int64_t rem = r, base = 0;
  for (int j = E->k - 2; j >= 0; --j) {
    base += E->map[j][rem % E->out[j]] * E->in_stride[j];
    rem /= E->out[j];
  }
  *plane = rem;
  return base + rem * E->in_plane;
}

#define EDGE_GATHER(T)                                                    \
  for (int64_t r = r0; r < r1; ++r) {                                     \
    int64_t plane, base = edge_row_base(E, r, &plane);                    \
    const T* s = (const T*)E->src + base;                                 \
    T* d = (T*)E->dst + r * w;                                            \
    for (int64_t x = 0; x < w; ++x) d[x] = s[map[x]];                     \
  }

static tpu_status_t edge_fwd_rows(void* arg, int64_t r0, int64_t r1, int tid) {
  const edge_t* E = arg;
  int64_t w = E->out[E->k - 1];
  const int64_t* map = E->map[E->k - 1];
  switch (E->es) {
    case 1: EDGE_GATHER(uint8_t) break;
    case 2: EDGE_GATHER(uint16_t) break;
    case 4: EDGE_GATHER(uint32_t) break;
    default: EDGE_GATHER(uint64_t) break;
  }
  return NULL;
}

/* Planes are disjoint in the input, so threads split by plane. */
static tpu_status_t edge_bwd_planes(void* arg, int64_t p0, int64_t p1, int tid) {
  const edge_t* E = arg;
  int64_t w = E->out[E->k - 1];
  const int64_t* map = E->map[E->k - 1];
  for (int64_t r = p0 * E->rows_per_plane; r < p1 * E->rows_per_plane; ++r) {
    int64_t plane, base = edge_row_base(E, r, &plane);
    double* a = E->acc + base;
    const double* g = E->g + r * w;
    for (int64_t x = 0; x < w; ++x) a[map[x]] = round_as(E->dt, a[map[x]] + g[x]);
  }
  return NULL;
}

static tpu_status_t pad_edge_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  edge_t E = {0};
  E.es = tpu_dtype_size(out->dtype);
  bool ok = edge_init(&E, n, out, &n->in[0]);
  char* src = ok ? tpu__pack_alloc(&n->in[0], out->dtype) : NULL;
  uint64_t nbytes;
  int64_t total = tpu__operand_numel(out);
  char* dst = src && tpu__mul_ok((uint64_t)total, E.es, &nbytes) ? tpu__malloc(nbytes) : NULL;
  tpu_status_t st = NULL;
  if (!dst) {
    st = TPU_HOST_NOMEM();
  } else {
    E.src = src;
    E.dst = dst;
    int64_t rows = E.planes * E.rows_per_plane, w = E.out[E.k - 1];
    st = rows > 1 && total >= TPU_PARALLEL_MIN_WORK
             ? tpu__parallel_for(rows, TPU_PARALLEL_MIN_WORK / cnt1(w) + 1, edge_fwd_rows, &E)
             : edge_fwd_rows(&E, 0, rows, 0);
    if (!st) tpu__unpack(out, dst, out->dtype);
  }
  edge_free(&E);
  tpu__free(src);
  tpu__free(dst);
  return st;
}

/* Adds each output gradient into its input element in output order, rounding to the
 * gradient's dtype after every add: the same sums, in the same order, as ATen's CPU loop
 * (which adds in the tensor's dtype), so bf16/f16 results match it bit for bit. */
static tpu_status_t pad_edge_backward_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  edge_t E = {0};
  E.dt = out->dtype;
  bool ok = edge_init(&E, n, &n->in[0], out);
  double* g = ok ? tpu__pack_alloc(&n->in[0], TPU_DTYPE_F64) : NULL;
  double* acc = g ? tpu__calloc(cnt1(tpu__operand_numel(out)), sizeof(double)) : NULL;
  tpu_status_t st = NULL;
  if (!acc) {
    st = TPU_HOST_NOMEM();
  } else {
    E.g = g;
    E.acc = acc;
    int64_t total = tpu__operand_numel(&n->in[0]);
    st = E.planes > 1 && total >= TPU_PARALLEL_MIN_WORK
             ? tpu__parallel_for(E.planes, TPU_PARALLEL_MIN_WORK / cnt1(E.out_plane) + 1, edge_bwd_planes, &E)
             : edge_bwd_planes(&E, 0, E.planes, 0);
    if (!st) tpu__unpack(out, acc, TPU_DTYPE_F64);
  }
  edge_free(&E);
  tpu__free(g);
  tpu__free(acc);
  return st;
}

/* ---- im2col / col2im ---------------------------------------------------------------- */

typedef struct win_s {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw, c, h, w, oh, ow;
  const char* src; /* im2col: packed image (element size es) */
  char* dst;       /* im2col: dense columns, zero-filled */
  size_t es;
  const double* col; /* col2im: packed columns */
  double* img;       /* col2im: dense image, zero-filled */
  tpu_dtype_t dt;    /* col2im: the image's dtype, rounded to after every add */
} win_t;

static win_t win_of(const tpu_node_t* n) {
  const int64_t* a = n->ia;
  win_t W = {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[9], a[10], a[11], a[12], a[13],
             NULL, NULL, 0, NULL, NULL, TPU_DTYPE_F64};
  return W;
}

/* Column row r = (sample * C + c) * kh * kw + ki * kw + kj holds, for each block, the image
 * element at offset (ki, kj) of that block, or zero in the padding. */
#define IM2COL_ROWS(T)                                                               \
  for (int64_t r = r0; r < r1; ++r) {                                                \
    int64_t kj = r % W->kw, ki = (r / W->kw) % W->kh, plane = r / (W->kw * W->kh);   \
    const T* s = (const T*)W->src + plane * W->h * W->w;                             \
    T* d = (T*)W->dst + r * W->oh * W->ow;                                           \
    for (int64_t bh = 0; bh < W->oh; ++bh) {                                         \
      int64_t ih = bh * W->sh - W->ph + ki * W->dh;                                  \
      if (ih < 0 || ih >= W->h) continue;                                            \
      for (int64_t bw = 0; bw < W->ow; ++bw) {                                       \
        int64_t iw = bw * W->sw - W->pw + kj * W->dw;                                \
        if (iw >= 0 && iw < W->w) d[bh * W->ow + bw] = s[ih * W->w + iw];            \
      }                                                                              \
    }                                                                                \
  }

static tpu_status_t im2col_rows(void* arg, int64_t r0, int64_t r1, int tid) {
  const win_t* W = arg;
  switch (W->es) {
    case 1: IM2COL_ROWS(uint8_t) break;
    case 2: IM2COL_ROWS(uint16_t) break;
    case 4: IM2COL_ROWS(uint32_t) break;
    default: IM2COL_ROWS(uint64_t) break;
  }
  return NULL;
}

/* Zero bits are zero in every dtype, so the padding is a memset. */
static tpu_status_t im2col_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  win_t W = win_of(n);
  W.es = tpu_dtype_size(out->dtype);
  int64_t total = tpu__operand_numel(out), rows = n->ia[8] * W.c * W.kh * W.kw;
  char* src = tpu__pack_alloc(&n->in[0], out->dtype);
  char* dst = src ? tpu__calloc(cnt1(total), W.es) : NULL;
  tpu_status_t st = NULL;
  if (!dst) {
    st = TPU_HOST_NOMEM();
  } else {
    W.src = src;
    W.dst = dst;
    st = rows > 1 && total >= TPU_PARALLEL_MIN_WORK
             ? tpu__parallel_for(rows, TPU_PARALLEL_MIN_WORK / cnt1(W.oh * W.ow) + 1, im2col_rows, &W)
             : im2col_rows(&W, 0, rows, 0);
    if (!st) tpu__unpack(out, dst, out->dtype);
  }
  tpu__free(src);
  tpu__free(dst);
  return st;
}

/* Image planes (sample, channel) are disjoint, so threads split by plane. */
static tpu_status_t col2im_planes(void* arg, int64_t p0, int64_t p1, int tid) {
  const win_t* W = arg;
  int64_t len = W->oh * W->ow;
  for (int64_t p = p0; p < p1; ++p) {
    double* img = W->img + p * W->h * W->w;
    for (int64_t ki = 0; ki < W->kh; ++ki)
      for (int64_t kj = 0; kj < W->kw; ++kj) {
        const double* col = W->col + ((p * W->kh + ki) * W->kw + kj) * len;
        for (int64_t bh = 0; bh < W->oh; ++bh) {
          int64_t ih = bh * W->sh - W->ph + ki * W->dh;
          if (ih < 0 || ih >= W->h) continue;
          for (int64_t bw = 0; bw < W->ow; ++bw) {
            int64_t iw = bw * W->sw - W->pw + kj * W->dw;
            if (iw >= 0 && iw < W->w) {
              double* p = img + ih * W->w + iw;
              *p = round_as(W->dt, *p + col[bh * W->ow + bw]);
            }
          }
        }
      }
  }
  return NULL;
}

/* Sums the blocks in ATen's order (kernel offset, then block), rounding to the image's
 * dtype after every add as ATen's CPU loop does. */
static tpu_status_t col2im_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  win_t W = win_of(n);
  W.dt = out->dtype;
  int64_t planes = n->ia[8] * W.c, total = tpu__operand_numel(&n->in[0]);
  double* col = tpu__pack_alloc(&n->in[0], TPU_DTYPE_F64);
  double* img = col ? tpu__calloc(cnt1(tpu__operand_numel(out)), sizeof(double)) : NULL;
  tpu_status_t st = NULL;
  if (!img) {
    st = TPU_HOST_NOMEM();
  } else {
    W.col = col;
    W.img = img;
    st = planes > 1 && total >= TPU_PARALLEL_MIN_WORK
             ? tpu__parallel_for(planes, TPU_PARALLEL_MIN_WORK / cnt1(total / planes) + 1, col2im_planes, &W)
             : col2im_planes(&W, 0, planes, 0);
    if (!st) tpu__unpack(out, img, TPU_DTYPE_F64);
  }
  tpu__free(col);
  tpu__free(img);
  return st;
}

/* ---- the transformer inference fast path (aten/nn.c) --------------------------------- */

/* Rows of MASKED_SOFTMAX: n values (float32 for f32/bf16/f16, double for f64) and their
 * n mask bytes. As ATen's CPU kernel: the max over unmasked values; e^(x - max) for
 * unmasked positions and 0 for masked ones (for bf16/f16 x - max and the exponential
 * rounded to the dtype); the sum in double (float for bf16/f16); each value times
 * 1 / sum. A row with nothing unmasked has scale 1 / 0 = inf and is NaN throughout, as
 * on CPU; an unmasked NaN, +inf or an all -inf row poisons the row the same way. */
#define MASKED_SOFTMAX_ROW(T, SFX, EXPT)                                                        \
  TPU_ISA_CLONES static void masked_softmax_row_##SFX(const T* x, const uint8_t* m, T* y, int64_t n,  \
                                                      tpu_dtype_t t) {                          \
    const bool narrow = t == TPU_DTYPE_BF16 || t == TPU_DTYPE_F16;                              \
    T mx = (T)-INFINITY;                                                                        \
    for (int64_t j = 0; j < n; ++j) {                                                           \
      T v = m[j] ? (T)-INFINITY : x[j];                                                         \
      mx = v > mx ? v : mx;                                                                     \
    }                                                                                           \
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] - mx;                                           \
    if (narrow) tpu__round_f32_run((float*)y, n, t);                                            \
    for (int64_t j = 0; j < n; ++j) y[j] = m[j] ? (T)0 : EXPT(y[j]);                            \
    if (narrow) tpu__round_f32_run((float*)y, n, t);                                            \
    double sum = 0;                                                                             \
    for (int64_t j = 0; j < n; ++j) sum += y[j];                                                \
    double scale = narrow ? (double)(1.0f / (float)sum) : 1.0 / sum;                            \
    for (int64_t j = 0; j < n; ++j) y[j] = (T)(y[j] * scale);                                   \
  }
MASKED_SOFTMAX_ROW(float, f32, tpu__vexpf)
MASKED_SOFTMAX_ROW(double, f64, exp)

typedef struct msm_s {
  const void* x;
  const uint8_t* m;
  void* y;
  int64_t n;
  tpu_dtype_t t;
} msm_t;

static tpu_status_t masked_softmax_rows(void* arg, int64_t jb, int64_t je, int tid) {
  (void)tid;
  const msm_t* S = arg;
  const int64_t n = S->n;
  for (int64_t r = jb; r < je; ++r) {
    if (S->t == TPU_DTYPE_F64)
      masked_softmax_row_f64((const double*)S->x + r * n, S->m + r * n, (double*)S->y + r * n, n, S->t);
    else
      masked_softmax_row_f32((const float*)S->x + r * n, S->m + r * n, (float*)S->y + r * n, n, S->t);
  }
  return NULL;
}

/* perm: the dims in order with d moved last (the layout of packed rows). */
static void perm_last(int nd, int d, int* perm) {
  int k = 0;
  for (int i = 0; i < nd; ++i) if (i != d) perm[k++] = i;
  if (nd) perm[k] = d;
}

static tpu_status_t masked_softmax_kernel(tpu_node_t* node) {
  tpu_operand_t* out = &node->out[0];
  const tpu_operand_t* xo = &node->in[0];
  const int64_t total = tpu__operand_numel(xo);
  if (total == 0) return NULL;
  const int nd = xo->ndim, d = (int)node->ia[0];
  const int64_t n = nd ? xo->sizes[d] : 1;
  const tpu_dtype_t rt = xo->dtype == TPU_DTYPE_F64 ? TPU_DTYPE_F64 : TPU_DTYPE_F32;
  const size_t es = tpu_dtype_size(rt);
  int perm[TPU_MAX_DIMS];
  perm_last(nd, d, perm);
  void* x = tpu__malloc(cnt1(total) * es);
  void* y = tpu__malloc(cnt1(total) * es);
  uint8_t* m = tpu__malloc(cnt1(total));
  tpu_status_t st = NULL;
  if (!x || !y || !m) {
    st = TPU_HOST_NOMEM();
  } else {
    tpu__pack(xo, nd ? perm : NULL, rt, x);
    tpu__pack(&node->in[1], nd ? perm : NULL, TPU_DTYPE_BOOL, m);
    msm_t S = {x, m, y, n, xo->dtype};
    const int64_t rows = total / n;
    st = rows > 1 && total >= TPU_PARALLEL_MIN_WORK
             ? tpu__parallel_for(rows, TPU_PARALLEL_MIN_WORK / n + 1, masked_softmax_rows, &S)
             : masked_softmax_rows(&S, 0, rows, 0);
    if (!st) {
      tpu_operand_t po = *out;
      for (int i = 0; i < nd; ++i) { po.sizes[i] = out->sizes[perm[i]]; po.strides[i] = out->strides[perm[i]]; }
      tpu__unpack(&po, y, rt);
    }
  }
  tpu__free(x);
  tpu__free(y);
  tpu__free(m);
  return st;
}

/* QKV_TRANSFORM: out s (q, k, v)[b, h, t, e] = qkv[b, t, s D + h dh + e] + bias[same],
 * q's times the scale, in float32 (float64 for float64; CPU's arithmetic), rounded to the
 * dtype on store. Work is split by (b, t) rows of qkv. */
typedef struct qkv_s {
  const void* x;
  const void* bias;
  void* y[3];
  int64_t T, H, dh;
  double scale;
  bool f64;
} qkv_t;

#define QKV_ROWS(TY, SFX)                                                                     \
  static void qkv_rows_##SFX(const qkv_t* S, int64_t rb, int64_t re) {                        \
    const int64_t T = S->T, H = S->H, dh = S->dh, D = H * dh;                                 \
    const TY scale = (TY)S->scale;                                                            \
    const TY* bias = S->bias;                                                                 \
    for (int64_t r = rb; r < re; ++r) {                                                       \
      const int64_t b = r / T, tt = r % T;                                                    \
      for (int s = 0; s < 3; ++s)                                                             \
        for (int64_t h = 0; h < H; ++h) {                                                     \
          const TY* xr = (const TY*)S->x + r * 3 * D + s * D + h * dh;                        \
          const TY* br = bias + s * D + h * dh;                                               \
          TY* yr = (TY*)S->y[s] + ((b * H + h) * T + tt) * dh;                                \
          if (s == 0)                                                                         \
            for (int64_t e = 0; e < dh; ++e) yr[e] = (TY)(xr[e] + br[e]) * scale;             \
          else                                                                                \
            for (int64_t e = 0; e < dh; ++e) yr[e] = xr[e] + br[e];                           \
        }                                                                                     \
    }                                                                                         \
  }
QKV_ROWS(float, f32)
QKV_ROWS(double, f64)

static tpu_status_t qkv_chunk(void* arg, int64_t rb, int64_t re, int tid) {
  (void)tid;
  const qkv_t* S = arg;
  if (S->f64) qkv_rows_f64(S, rb, re);
  else qkv_rows_f32(S, rb, re);
  return NULL;
}

static tpu_status_t qkv_transform_kernel(tpu_node_t* node) {
  const tpu_operand_t* qo = &node->in[0];
  const int64_t B = qo->sizes[0], T = qo->sizes[1], D3 = qo->sizes[2];
  const int64_t H = node->ia[0], dh = D3 / 3 / H;
  const int64_t total = B * T * D3;
  if (total == 0) return NULL;
  const bool f64 = qo->dtype == TPU_DTYPE_F64;
  const tpu_dtype_t rt = f64 ? TPU_DTYPE_F64 : TPU_DTYPE_F32;
  const size_t es = tpu_dtype_size(rt);
  qkv_t S = {NULL, NULL, {NULL, NULL, NULL}, T, H, dh, node->da[0], f64};
  void* x = tpu__malloc(cnt1(total) * es);
  void* bias = tpu__malloc(cnt1(D3) * es);
  for (int s = 0; s < 3; ++s) S.y[s] = tpu__malloc(cnt1(total / 3) * es);
  tpu_status_t st = NULL;
  if (!x || !bias || !S.y[0] || !S.y[1] || !S.y[2]) {
    st = TPU_HOST_NOMEM();
  } else {
    tpu__pack(qo, NULL, rt, x);
    tpu__pack(&node->in[1], NULL, rt, bias);
    S.x = x;
    S.bias = bias;
    st = total >= TPU_PARALLEL_MIN_WORK ? tpu__parallel_for(B * T, TPU_PARALLEL_MIN_WORK / D3 + 1, qkv_chunk, &S)
                                        : qkv_chunk(&S, 0, B * T, 0);
    for (int s = 0; !st && s < 3; ++s) tpu__unpack(&node->out[s], S.y[s], rt);
  }
  tpu__free(x);
  tpu__free(bias);
  for (int s = 0; s < 3; ++s) tpu__free(S.y[s]);
  return st;
}

void tpu__host_register_nn(tpu_host_kernel_fn* table) {
  table[TPU_KIND_MASKED_SOFTMAX] = masked_softmax_kernel;
  table[TPU_KIND_QKV_TRANSFORM] = qkv_transform_kernel;
  table[TPU_KIND_LAYER_NORM] = layer_norm_kernel;
  table[TPU_KIND_LAYER_NORM_BACKWARD] = layer_norm_backward_kernel;
  table[TPU_KIND_EMBEDDING] = embedding_kernel;
  table[TPU_KIND_EMBEDDING_BACKWARD] = embedding_backward_kernel;
  table[TPU_KIND_EMBEDDING_BAG] = embedding_bag_kernel;
  table[TPU_KIND_EMBEDDING_BAG_BACKWARD] = embedding_bag_backward_kernel;
  table[TPU_KIND_EMBEDDING_BAG_PSW_BACKWARD] = embedding_bag_psw_backward_kernel;
  table[TPU_KIND_NLL_LOSS] = nll_kernel;
  table[TPU_KIND_NLL_LOSS_BACKWARD] = nll_backward_kernel;
  table[TPU_KIND_SDPA] = sdpa_kernel;
  table[TPU_KIND_SDPA_BACKWARD] = sdpa_backward_kernel;
  table[TPU_KIND_POINT_LOSS] = point_loss_kernel;
  table[TPU_KIND_POINT_LOSS_BACKWARD] = point_loss_kernel;
  table[TPU_KIND_PAD_EDGE] = pad_edge_kernel;
  table[TPU_KIND_PAD_EDGE_BACKWARD] = pad_edge_backward_kernel;
  table[TPU_KIND_IM2COL] = im2col_kernel;
  table[TPU_KIND_COL2IM] = col2im_kernel;
}
