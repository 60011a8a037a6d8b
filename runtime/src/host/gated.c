/* Gated activation and recurrent cell kernels, forward and backward.
 *
 * glu and prelu are elementwise over views: glu's halves are two windows of one operand
 * (same strides, the second offset by half the dimension), so they run on the tile
 * engine without copies. The fused cells work on dense buffers in the compute dtype
 * (float32, or float64): an operand that is already dense in that dtype is used in
 * place, others are packed; rows (batch entries) are split across the pool. Each
 * element loads everything it reads before it stores, so an out= tensor that is one of
 * the inputs (cy into cx) is safe. Bias gradients are column sums in float64, over the
 * rows in order, so they do not depend on the thread count. The cells' formulas and
 * their order of operations are those of PyTorch's CUDA kernels (aten/src/ATen/native/
 * cuda/RNN.cu), whose workspace layouts aten/gated.c describes. */
#include <math.h>

#include "host/host.h"

#define GATED_IA_RESULT 1 /* aten/gated.c: the result dtype of glu / prelu */

static size_t cnt1(int64_t n) { return n > 0 ? (size_t)n : 1; }

static bool present(const tpu_operand_t* op) { return op->value || op->is_scalar; }

/* A float32 tile rounded through the f16/bf16 result dtype when the bound output is
 * wider (an out= tensor): ATen computes in the result dtype, then casts. */
static void round_result(float* r, int64_t n, const tpu_node_t* nd) {
  tpu_dtype_t res = (tpu_dtype_t)nd->ia[GATED_IA_RESULT];
  if (nd->out[0].dtype != res) tpu__round_f32_run(r, n, res);
}
static void round_none(double* r, int64_t n, const tpu_node_t* nd) { (void)r; (void)n; (void)nd; }

/* ---- elementwise tiles ------------------------------------------------------------- */

#define GATED_TILES(T, SFX, EXP, ROUND)                                                      \
  static inline T sigm_##SFX(T x) { return (T)1 / ((T)1 + EXP(-x)); }                        \
  /* glu: a * sigmoid(b) */                                                                  \
  static void glu_##SFX(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) {   \
    T* r = o;                                                                                \
    const T *a = in[0], *b = in[1];                                                          \
    for (int64_t i = 0; i < n; ++i) r[i] = a[i] * sigm_##SFX(b[i]);                          \
    ROUND(r, n, nd);                                                                         \
  }                                                                                          \
  /* glu backward, first half: sigmoid(b) * g */                                             \
  static void glu_bw_a_##SFX(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    T* r = o;                                                                                \
    const T *b = in[0], *g = in[1];                                                          \
    for (int64_t i = 0; i < n; ++i) r[i] = sigm_##SFX(b[i]) * g[i];                          \
  }                                                                                          \
  /* glu backward, second half: (1 - s) * s * a * g with s = sigmoid(b) */                   \
  static void glu_bw_b_##SFX(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    T* r = o;                                                                                \
    const T *a = in[0], *b = in[1], *g = in[2];                                              \
    for (int64_t i = 0; i < n; ++i) {                                                        \
      T s = sigm_##SFX(b[i]);                                                                \
      r[i] = ((T)1 - s) * s * a[i] * g[i];                                                   \
    }                                                                                        \
  }                                                                                          \
  /* glu_jvp: da * s + glu * (db - s * db) */                                                \
  static void glu_jvp_##SFX(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    T* r = o;                                                                                \
    const T *y = in[0], *b = in[1], *da = in[2], *db = in[3];                                \
    for (int64_t i = 0; i < n; ++i) {                                                        \
      T s = sigm_##SFX(b[i]);                                                                \
      r[i] = da[i] * s + y[i] * (db[i] - s * db[i]);                                         \
    }                                                                                        \
    ROUND(r, n, nd);                                                                         \
  }                                                                                          \
  static void prelu_##SFX(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    T* r = o;                                                                                \
    const T *x = in[0], *w = in[1];                                                          \
    for (int64_t i = 0; i < n; ++i) r[i] = x[i] > 0 ? x[i] : w[i] * x[i];                    \
    ROUND(r, n, nd);                                                                         \
  }                                                                                          \
  static void prelu_bw_x_##SFX(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    T* r = o;                                                                                \
    const T *x = in[0], *w = in[1], *g = in[2];                                              \
    for (int64_t i = 0; i < n; ++i) r[i] = x[i] > 0 ? g[i] : w[i] * g[i];                    \
  }                                                                                          \
  static void prelu_bw_w_##SFX(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    T* r = o;                                                                                \
    const T *x = in[0], *g = in[2];                                                          \
    for (int64_t i = 0; i < n; ++i) r[i] = x[i] > 0 ? (T)0 : x[i] * g[i];                    \
  }

GATED_TILES(float, f32, expf, round_result)
GATED_TILES(double, f64, exp, round_none)

#define PICK(node, name) ((node)->compute == TPU_DTYPE_F64 ? name##_f64 : name##_f32)

/* Window `which` (0 or 1) of op's halves along dim. */
static tpu_operand_t half_of(const tpu_operand_t* op, int dim, int which) {
  tpu_operand_t h = *op;
  int64_t k = op->sizes[dim] / 2;
  h.sizes[dim] = k;
  h.offset += which * k * op->strides[dim];
  return h;
}

static tpu_status_t glu_kernel(tpu_node_t* n) {
  int d = (int)n->ia[0];
  tpu_operand_t a = half_of(&n->in[0], d, 0), b = half_of(&n->in[0], d, 1);
  const tpu_operand_t* ins[2] = {&a, &b};
  return tpu__tile_run_ops(n, &n->out[0], ins, 2, n->compute, PICK(n, glu));
}

/* inputs: grad_output (broadcasts to the halved shape), self */
static tpu_status_t glu_backward_kernel(tpu_node_t* n) {
  int d = (int)n->ia[0];
  const tpu_operand_t* g = &n->in[0];
  tpu_operand_t a = half_of(&n->in[1], d, 0), b = half_of(&n->in[1], d, 1);
  tpu_operand_t oa = half_of(&n->out[0], d, 0), ob = half_of(&n->out[0], d, 1);
  const tpu_operand_t* ins_a[2] = {&b, g};
  const tpu_operand_t* ins_b[3] = {&a, &b, g};
  TPU_RETURN_IF_ERROR(tpu__tile_run_ops(n, &oa, ins_a, 2, n->compute, PICK(n, glu_bw_a)));
  return tpu__tile_run_ops(n, &ob, ins_b, 3, n->compute, PICK(n, glu_bw_b));
}

/* inputs: glu, x, dx */
static tpu_status_t glu_jvp_kernel(tpu_node_t* n) {
  int d = (int)n->ia[0];
  tpu_operand_t b = half_of(&n->in[1], d, 1), da = half_of(&n->in[2], d, 0), db = half_of(&n->in[2], d, 1);
  const tpu_operand_t* ins[4] = {&n->in[0], &b, &da, &db};
  return tpu__tile_run_ops(n, &n->out[0], ins, 4, n->compute, PICK(n, glu_jvp));
}

static tpu_status_t prelu_kernel(tpu_node_t* n) { return tpu__tile_run(n, n->compute, PICK(n, prelu)); }

/* inputs: self, weight, grad_output */
static tpu_status_t prelu_backward_kernel(tpu_node_t* n) {
  const tpu_operand_t* ins[3] = {&n->in[0], &n->in[1], &n->in[2]};
  TPU_RETURN_IF_ERROR(tpu__tile_run_ops(n, &n->out[0], ins, 3, n->compute, PICK(n, prelu_bw_x)));
  return tpu__tile_run_ops(n, &n->out[1], ins, 3, n->compute, PICK(n, prelu_bw_w));
}

/* ---- dense operands of the cells --------------------------------------------------- */

typedef struct dense_s {
  void* p;    /* NULL for an absent operand */
  bool owned; /* scratch (packed input, or output to unpack) rather than the tensor */
} dense_t;

static bool dense_in(dense_t* d, const tpu_operand_t* op, tpu_dtype_t c) {
  d->p = NULL;
  d->owned = false;
  if (!present(op)) return true;
  if (op->dtype == c && tpu__operand_is_contiguous(op)) {
    d->p = tpu__operand_ptr(op);
    return true;
  }
  d->p = tpu__pack_alloc(op, c);
  d->owned = true;
  return d->p != NULL;
}

static bool dense_out(dense_t* d, tpu_operand_t* op, tpu_dtype_t c) {
  d->p = NULL;
  d->owned = false;
  if (tpu__output_absent(op)) return true;
  if (op->dtype == c && tpu__operand_is_contiguous(op)) {
    d->p = tpu__operand_ptr(op);
    return true;
  }
  d->p = tpu__malloc(tpu_dtype_size(c) * cnt1(tpu__operand_numel(op)));
  d->owned = true;
  return d->p != NULL;
}

/* Unpacks an owned output buffer into its tensor (when write) and frees scratch. */
static void dense_close(dense_t* d, tpu_operand_t* op, tpu_dtype_t c, bool write) {
  if (d->owned) {
    if (write) tpu__unpack(op, d->p, c);
    tpu__free(d->p);
  }
  d->p = NULL;
  d->owned = false;
}

typedef struct cell_s {
  const void* in[5];
  void* out[3];
  int64_t H;
  /* column sums */
  const void* sum_src;
  double* sum_dst;
  int64_t rows, cols;
} cell_t;

/* ---- cell arithmetic, per compute dtype -------------------------------------------- */

#define CELLS(T, SFX, EXP, TANH)                                                             \
  /* LSTM forward. inputs: input_gates, hidden_gates, cx, input_bias?, hidden_bias?;      \
   * outputs: hy, cy, workspace (i, f, g, o activated). */                                   \
  static tpu_status_t lstm_fwd_rows_##SFX(void* arg, int64_t rb, int64_t re, int tid) {      \
    const cell_t* C = arg;                                                                   \
    int64_t H = C->H, G = 4 * H;                                                             \
    const T *ig = C->in[0], *hg = C->in[1], *cx = C->in[2], *bi = C->in[3], *bh = C->in[4];  \
    T *hy = C->out[0], *cy = C->out[1], *ws = C->out[2];                                     \
    for (int64_t r = rb; r < re; ++r) {                                                      \
      const T *igr = ig + r * G, *hgr = hg + r * G;                                          \
      T* wsr = ws + r * G;                                                                   \
      for (int64_t h = 0; h < H; ++h) {                                                      \
        T g[4];                                                                              \
        for (int k = 0; k < 4; ++k) {                                                        \
          T v = igr[k * H + h] + hgr[k * H + h];                                             \
          if (bi) v = v + bi[k * H + h] + bh[k * H + h];                                     \
          g[k] = v;                                                                          \
        }                                                                                    \
        T c0 = cx[r * H + h];                                                                \
        T ing = sigm_##SFX(g[0]), fg = sigm_##SFX(g[1]), cg = TANH(g[2]), og = sigm_##SFX(g[3]); \
        T c1 = fg * c0 + ing * cg;                                                           \
        T h1 = og * TANH(c1);                                                                \
        hy[r * H + h] = h1;                                                                  \
        cy[r * H + h] = c1;                                                                  \
        wsr[h] = ing;                                                                        \
        wsr[H + h] = fg;                                                                     \
        wsr[2 * H + h] = cg;                                                                 \
        wsr[3 * H + h] = og;                                                                 \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }                                                                                          \
  /* LSTM backward. inputs: grad_hy?, grad_cy?, cx, cy, workspace; outputs: grad_gates,   \
   * grad_cx. */                                                                             \
  static tpu_status_t lstm_bwd_rows_##SFX(void* arg, int64_t rb, int64_t re, int tid) {      \
    const cell_t* C = arg;                                                                   \
    int64_t H = C->H, G = 4 * H;                                                             \
    const T *ghy = C->in[0], *gcy = C->in[1], *cx = C->in[2], *cy = C->in[3], *ws = C->in[4]; \
    T *gg = C->out[0], *gcx = C->out[1];                                                     \
    for (int64_t r = rb; r < re; ++r) {                                                      \
      const T* wsr = ws + r * G;                                                             \
      T* ggr = gg + r * G;                                                                   \
      for (int64_t h = 0; h < H; ++h) {                                                      \
        int64_t i = r * H + h;                                                               \
        T ing = wsr[h], fg = wsr[H + h], cg = wsr[2 * H + h], og = wsr[3 * H + h];           \
        T go = ghy ? ghy[i] : (T)0, goc = gcy ? gcy[i] : (T)0;                               \
        T c0 = cx[i], t = TANH(cy[i]);                                                       \
        T gog = go * t;                                                                      \
        T gc = go * og * ((T)1 - t * t) + goc;                                               \
        T gig = gc * cg, gfg = gc * c0, gcg = gc * ing;                                      \
        gc = gc * fg;                                                                        \
        gig = gig * ((T)1 - ing) * ing;                                                      \
        gfg = gfg * ((T)1 - fg) * fg;                                                        \
        gcg = gcg * ((T)1 - cg * cg);                                                        \
        gog = gog * ((T)1 - og) * og;                                                        \
        gcx[i] = gc;                                                                         \
        ggr[h] = gig;                                                                        \
        ggr[H + h] = gfg;                                                                    \
        ggr[2 * H + h] = gcg;                                                                \
        ggr[3 * H + h] = gog;                                                                \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }                                                                                          \
  /* GRU forward. inputs: input_gates, hidden_gates, hx, input_bias?, hidden_bias?;       \
   * outputs: hy, workspace (r, z, n, hx, hn + b_hn). */                                     \
  static tpu_status_t gru_fwd_rows_##SFX(void* arg, int64_t rb, int64_t re, int tid) {       \
    const cell_t* C = arg;                                                                   \
    int64_t H = C->H, G = 3 * H, W = 5 * H;                                                  \
    const T *ig = C->in[0], *hg = C->in[1], *hx = C->in[2], *bi = C->in[3], *bh = C->in[4];  \
    T *hy = C->out[0], *ws = C->out[1];                                                      \
    for (int64_t r = rb; r < re; ++r) {                                                      \
      const T *igr = ig + r * G, *hgr = hg + r * G;                                          \
      T* wsr = ws + r * W;                                                                   \
      for (int64_t h = 0; h < H; ++h) {                                                      \
        T ir = igr[h], ii = igr[H + h], in_ = igr[2 * H + h];                                \
        T hr = hgr[h], hi = hgr[H + h], hn = hgr[2 * H + h];                                 \
        T b1r = 0, b1i = 0, b1n = 0, b2r = 0, b2i = 0, b2n = 0;                              \
        if (bi) {                                                                            \
          b1r = bi[h]; b1i = bi[H + h]; b1n = bi[2 * H + h];                                 \
          b2r = bh[h]; b2i = bh[H + h]; b2n = bh[2 * H + h];                                 \
        }                                                                                    \
        T h0 = hx[r * H + h];                                                                \
        T rg = sigm_##SFX(ir + hr + b1r + b2r);                                              \
        T zg = sigm_##SFX(ii + hi + b1i + b2i);                                              \
        T hnb = hn + b2n;                                                                    \
        T ng = TANH(in_ + b1n + rg * hnb);                                                   \
        hy[r * H + h] = ng + zg * (h0 - ng);                                                 \
        wsr[h] = rg;                                                                         \
        wsr[H + h] = zg;                                                                     \
        wsr[2 * H + h] = ng;                                                                 \
        wsr[3 * H + h] = h0;                                                                 \
        wsr[4 * H + h] = hnb;                                                                \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }                                                                                          \
  /* GRU backward. inputs: grad_hy, workspace; outputs: grad_input_gates,                 \
   * grad_hidden_gates, grad_hx. */                                                          \
  static tpu_status_t gru_bwd_rows_##SFX(void* arg, int64_t rb, int64_t re, int tid) {       \
    const cell_t* C = arg;                                                                   \
    int64_t H = C->H, G = 3 * H, W = 5 * H;                                                  \
    const T *ghy = C->in[0], *ws = C->in[1];                                                 \
    T *gi = C->out[0], *gh = C->out[1], *ghx = C->out[2];                                    \
    for (int64_t r = rb; r < re; ++r) {                                                      \
      const T* wsr = ws + r * W;                                                             \
      T *gir = gi + r * G, *ghr = gh + r * G;                                                \
      for (int64_t h = 0; h < H; ++h) {                                                      \
        T rg = wsr[h], zg = wsr[H + h], ng = wsr[2 * H + h], h0 = wsr[3 * H + h], hn = wsr[4 * H + h]; \
        T go = ghy[r * H + h];                                                               \
        T gzg = go * (h0 - ng) * ((T)1 - zg) * zg;                                           \
        T gh0 = go * zg;                                                                     \
        T gin = go * ((T)1 - zg) * ((T)1 - ng * ng);                                         \
        T ghn = gin * rg;                                                                    \
        T grg = gin * hn * ((T)1 - rg) * rg;                                                 \
        ghx[r * H + h] = gh0;                                                                \
        gir[h] = grg;                                                                        \
        gir[H + h] = gzg;                                                                    \
        gir[2 * H + h] = gin;                                                                \
        ghr[h] = grg;                                                                        \
        ghr[H + h] = gzg;                                                                    \
        ghr[2 * H + h] = ghn;                                                                \
      }                                                                                      \
    }                                                                                        \
    return NULL;                                                                             \
  }                                                                                          \
  /* Column sums of a dense [rows, cols] buffer, for columns [cb, ce). */                    \
  static tpu_status_t colsum_##SFX(void* arg, int64_t cb, int64_t ce, int tid) {             \
    const cell_t* C = arg;                                                                   \
    const T* g = C->sum_src;                                                                 \
    double* acc = C->sum_dst;                                                                \
    for (int64_t j = cb; j < ce; ++j) acc[j] = 0;                                            \
    for (int64_t r = 0; r < C->rows; ++r)                                                    \
      for (int64_t j = cb; j < ce; ++j) acc[j] += (double)g[r * C->cols + j];                \
    return NULL;                                                                             \
  }

CELLS(float, f32, expf, tanhf)
CELLS(double, f64, exp, tanh)

/* Runs fn over the B rows of a cell (each row G elements of work), on the pool when
 * large enough. */
static tpu_status_t cell_rows(cell_t* C, int64_t B, int64_t G, tpu_parallel_fn fn) {
  if (B > 1 && B * G >= TPU_PARALLEL_MIN_WORK)
    return tpu__parallel_for(B, TPU_PARALLEL_MIN_WORK / cnt1(G) + 1, fn, C);
  return fn(C, 0, B, 0);
}

/* The batch sum of a dense [B, G] gradient into output op (a bias gradient). */
static tpu_status_t bias_grad(tpu_node_t* n, cell_t* C, const void* src, int64_t B, int64_t G, int out) {
  /* a bias gradient the node could not declare (aten/gated.c) is one it does not need */
  if (out >= n->n_out || tpu__output_absent(&n->out[out])) return NULL;
  tpu_operand_t* op = &n->out[out];
  double* acc = tpu__malloc(sizeof(double) * cnt1(G));
  if (!acc) return TPU_HOST_NOMEM();
  C->sum_src = src;
  C->sum_dst = acc;
  C->rows = B;
  C->cols = G;
  tpu_parallel_fn fn = n->compute == TPU_DTYPE_F64 ? colsum_f64 : colsum_f32;
  tpu_status_t st = G > 1 && B * G >= TPU_PARALLEL_MIN_WORK
                        ? tpu__parallel_for(G, TPU_PARALLEL_MIN_WORK / cnt1(B) + 1, fn, C)
                        : fn(C, 0, G, 0);
  if (!st) tpu__unpack(op, acc, TPU_DTYPE_F64);
  tpu__free(acc);
  return st;
}

/* Opens inputs [0, n_in) and outputs [0, n_out) densely, runs fn over the rows, then
 * the bias gradients of outputs [n_out, n_out + n_bias) from the gate gradients in
 * outputs [0, n_bias), and writes back. */
static tpu_status_t run_cell(tpu_node_t* n, int n_in, int n_out, int n_bias, int factor, tpu_parallel_fn fn) {
  tpu_dtype_t c = n->compute;
  int64_t B = n->ia[0], H = n->ia[1];
  dense_t din[5] = {0}, dout[3] = {0};
  cell_t C = {.H = H};
  bool ok = true;
  for (int i = 0; i < n_in; ++i) ok &= dense_in(&din[i], &n->in[i], c);
  for (int i = 0; i < n_out; ++i) ok &= dense_out(&dout[i], &n->out[i], c);
  tpu_status_t st = ok ? NULL : TPU_HOST_NOMEM();
  if (!st && B * H > 0) {
    for (int i = 0; i < n_in; ++i) C.in[i] = din[i].p;
    for (int i = 0; i < n_out; ++i) C.out[i] = dout[i].p;
    st = cell_rows(&C, B, factor * H, fn);
    for (int k = 0; k < n_bias && !st; ++k)
      st = bias_grad(n, &C, dout[k].p, B, factor * H, n_out + k);
  } else if (!st) {
    for (int k = 0; k < n_bias && n_out + k < n->n_out; ++k) /* empty batch: zero bias gradients */
      if (!tpu__output_absent(&n->out[n_out + k])) {
        double* z = tpu__calloc(cnt1(factor * H), sizeof(double));
        if (!z) { st = TPU_HOST_NOMEM(); break; }
        tpu__unpack(&n->out[n_out + k], z, TPU_DTYPE_F64);
        tpu__free(z);
      }
  }
  for (int i = 0; i < n_in; ++i) dense_close(&din[i], &n->in[i], c, false);
  for (int i = 0; i < n_out; ++i) dense_close(&dout[i], &n->out[i], c, !st);
  return st;
}

static tpu_status_t lstm_cell_kernel(tpu_node_t* n) {
  return run_cell(n, 5, 3, 0, 4, n->compute == TPU_DTYPE_F64 ? lstm_fwd_rows_f64 : lstm_fwd_rows_f32);
}

static tpu_status_t lstm_cell_backward_kernel(tpu_node_t* n) {
  if (tpu__output_absent(&n->out[0])) return NULL; /* neither grad_hy nor grad_cy */
  return run_cell(n, 5, 2, 1, 4, n->compute == TPU_DTYPE_F64 ? lstm_bwd_rows_f64 : lstm_bwd_rows_f32);
}

static tpu_status_t gru_cell_kernel(tpu_node_t* n) {
  return run_cell(n, 5, 2, 0, 3, n->compute == TPU_DTYPE_F64 ? gru_fwd_rows_f64 : gru_fwd_rows_f32);
}

static tpu_status_t gru_cell_backward_kernel(tpu_node_t* n) {
  return run_cell(n, 2, 3, 2, 3, n->compute == TPU_DTYPE_F64 ? gru_bwd_rows_f64 : gru_bwd_rows_f32);
}

void tpu__host_register_gated(tpu_host_kernel_fn* table) {
  table[TPU_KIND_GLU] = glu_kernel;
  table[TPU_KIND_GLU_BACKWARD] = glu_backward_kernel;
  table[TPU_KIND_GLU_JVP] = glu_jvp_kernel;
  table[TPU_KIND_PRELU] = prelu_kernel;
  table[TPU_KIND_PRELU_BACKWARD] = prelu_backward_kernel;
  table[TPU_KIND_LSTM_CELL] = lstm_cell_kernel;
  table[TPU_KIND_LSTM_CELL_BACKWARD] = lstm_cell_backward_kernel;
  table[TPU_KIND_GRU_CELL] = gru_cell_kernel;
  table[TPU_KIND_GRU_CELL_BACKWARD] = gru_cell_backward_kernel;
}
