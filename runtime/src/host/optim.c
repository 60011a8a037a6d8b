/* Fused optimizer steps (node layouts in aten/optim.c): one pass over a parameter and
 * its states, in float32 for float32/bf16/f16 parameters (ATen's opmath) and float64 for
 * float64 ones, with the step-size arithmetic in double as ATen's CPU kernels do. The
 * step count, a tensor lr, grad_scale and found_inf are read from their one-element
 * tensors when the node runs. When found_inf is 1 the step is skipped: each output keeps
 * its input's values. */
#include <math.h>
#include <string.h>

#include "host/host.h"
#include "host/vmath.h"

#define BLOCK 512

static double scalar_in(const tpu_node_t* n, int i) {
  const tpu_operand_t* op = &n->in[i];
  return tpu__load_f64(tpu__operand_ptr(op), op->dtype);
}

static bool present(const tpu_operand_t* op) { return op->value != NULL; }

/* A step skipped by found_inf: outputs are the inputs' values (in place, a no-op; the
 * copy matters when defer_and_fuse placed an output in memory of its own). */
static void keep_inputs(tpu_node_t* n, const int* out_of_in, int n_out) {
  for (int o = 0; o < n_out; ++o) {
    tpu_operand_t* out = &n->out[o];
    if (tpu__output_absent(out) || !n->out_bound[o]) continue;
    const tpu_operand_t* in = &n->in[out_of_in[o]];
    char* dst = tpu__operand_ptr(out);
    const char* src = tpu__operand_ptr(in);
    if (dst != src) memmove(dst, src, (size_t)tpu__operand_numel(out) * tpu_dtype_size(out->dtype));
  }
}

/* Elements [i0, i0 + len) of input `in` as compute-dtype values that the kernel may
 * update: the memory itself when it is of the compute dtype and either output `out` is
 * that same memory (in place) or nothing is written (out NULL), else a copy in buf. */
static void* load_block(const tpu_operand_t* in, const tpu_operand_t* out, int64_t i0, int64_t len,
                        tpu_dtype_t ct, void* buf) {
  char* p = tpu__operand_ptr(in) + i0 * (int64_t)tpu_dtype_size(in->dtype);
  bool same = !out || tpu__operand_ptr(out) == tpu__operand_ptr(in);
  if (in->dtype == ct && same) return p;
  tpu__convert_run(buf, ct, 1, p, in->dtype, 1, len);
  return buf;
}

static void store_block(tpu_operand_t* op, int64_t i0, int64_t len, tpu_dtype_t ct, const void* v) {
  char* p = tpu__operand_ptr(op) + i0 * (int64_t)tpu_dtype_size(op->dtype);
  if (p != (const char*)v) tpu__convert_run(p, op->dtype, 1, v, ct, 1, len);
}

/* The gradient as a step uses it: unscaled by grad_scale (and stored back, as ATen's
 * fused kernels store the unscaled gradient), negated for maximize. Returns g itself when
 * the step only reads it, else a copy in gr that the step may update (`writes`). */
#define TAKE_GRAD(T)                                                                        \
  TPU_ISA_CLONES static T* take_grad_##T(bool scaled, bool maximize, bool writes, T scale,  \
                                         T* restrict g, T* restrict gr, int64_t len) {       \
    if (scaled)                                                                             \
      for (int64_t i = 0; i < len; ++i) g[i] = g[i] / scale;                                \
    if (maximize)                                                                           \
      for (int64_t i = 0; i < len; ++i) gr[i] = -g[i];                                      \
    else if (writes)                                                                        \
      for (int64_t i = 0; i < len; ++i) gr[i] = g[i];                                       \
    else                                                                                    \
      return g;                                                                             \
    return gr;                                                                              \
  }
TAKE_GRAD(float)
TAKE_GRAD(double)

/* ---- Adam / AdamW ------------------------------------------------------------------ */
typedef struct adam_s {
  tpu_node_t* n;
  double lr, beta1, beta2, wd, eps, step_size, bc2_sqrt, grad_scale;
  bool amsgrad, maximize, adamw, scaled;
} adam_t;

/* A block. The common steps (no grad_scale, maximize or amsgrad) are one loop over every
 * operand: memory streams best when all of them advance together, and a pass per
 * operand over a block from memory ran at half that rate. The other steps run in simple
 * passes, each a loop without branches that vectorizes (one loop with the flags inside
 * stays scalar): the gradient as used (take_grad, then coupled weight decay) into gr,
 * then the moments, then the parameter. Both round each element's operations in the same
 * order (no FMA contraction in C11), so they give identical results. */
#define ADAM_ONE_LOOP(T, SQRT, P_DECAYED, GRAD)                                              \
  for (int64_t i = 0; i < len; ++i) {                                                       \
    const T pd = P_DECAYED, gi = GRAD;                                                      \
    const T mi = m[i] * b1 + gi * c1, vi = v[i] * b2 + gi * gi * c2;                        \
    m[i] = mi;                                                                              \
    v[i] = vi;                                                                              \
    p[i] = pd - step * mi / (SQRT(vi) / bc2 + eps);                                         \
  }
#define ADAM_BLOCK(T, SQRT)                                                                   \
  TPU_ISA_CLONES static void adam_block_##T(const adam_t* a, T* restrict p, T* restrict g,    \
                                            T* restrict m, T* restrict v, T* restrict vmax,   \
                                            int64_t len) {                                    \
    const T b1 = (T)a->beta1, b2 = (T)a->beta2, c1 = (T)(1 - a->beta1), c2 = (T)(1 - a->beta2); \
    const T wd = (T)a->wd, decay = (T)(1 - a->lr * a->wd), eps = (T)a->eps;                    \
    const T step = (T)a->step_size, bc2 = (T)a->bc2_sqrt, scale = (T)a->grad_scale;            \
    if (!a->scaled && !a->maximize && !a->amsgrad) {                                          \
      if (a->wd == 0) ADAM_ONE_LOOP(T, SQRT, p[i], g[i])                                     \
      else if (a->adamw) ADAM_ONE_LOOP(T, SQRT, p[i] * decay, g[i])                          \
      else ADAM_ONE_LOOP(T, SQRT, p[i], g[i] + p[i] * wd)                                    \
      return;                                                                                 \
    }                                                                                         \
    T buf[BLOCK];                                                                             \
    T* gr = take_grad_##T(a->scaled, a->maximize, a->wd != 0 && !a->adamw, scale, g, buf, len); \
    if (a->wd != 0 && a->adamw)                                                               \
      for (int64_t i = 0; i < len; ++i) p[i] = p[i] * decay;                                  \
    else if (a->wd != 0)                                                                      \
      for (int64_t i = 0; i < len; ++i) gr[i] = gr[i] + p[i] * wd;                            \
    for (int64_t i = 0; i < len; ++i) {                                                       \
      m[i] = m[i] * b1 + gr[i] * c1;                                                          \
      v[i] = v[i] * b2 + gr[i] * gr[i] * c2;                                                  \
    }                                                                                         \
    const T* den = v;                                                                         \
    if (a->amsgrad) {                                                                         \
      for (int64_t i = 0; i < len; ++i) vmax[i] = vmax[i] > v[i] ? vmax[i] : v[i];            \
      den = vmax;                                                                             \
    }                                                                                         \
    for (int64_t i = 0; i < len; ++i) p[i] = p[i] - step * m[i] / (SQRT(den[i]) / bc2 + eps); \
  }
ADAM_BLOCK(float, sqrtf)
ADAM_BLOCK(double, sqrt)

static tpu_status_t adam_chunk(void* ctx, int64_t i0, int64_t i1, int tid) {
  (void)tid;
  const adam_t* a = ctx;
  tpu_node_t* n = a->n;
  tpu_dtype_t ct = n->compute;
  double buf[5][BLOCK]; /* compute-dtype copies of narrower operands */
  for (int64_t s = i0; s < i1; s += BLOCK) {
    int64_t len = i1 - s < BLOCK ? i1 - s : BLOCK;
    void* p = load_block(&n->in[0], &n->out[0], s, len, ct, buf[0]);
    void* g = load_block(&n->in[1], a->scaled ? &n->out[1] : NULL, s, len, ct, buf[1]);
    void* m = load_block(&n->in[2], &n->out[2], s, len, ct, buf[2]);
    void* v = load_block(&n->in[3], &n->out[3], s, len, ct, buf[3]);
    void* vmax = a->amsgrad ? load_block(&n->in[4], &n->out[4], s, len, ct, buf[4]) : NULL;
    if (ct == TPU_DTYPE_F64) adam_block_double(a, p, g, m, v, vmax, len);
    else adam_block_float(a, p, g, m, v, vmax, len);
    store_block(&n->out[0], s, len, ct, p);
    if (a->scaled) store_block(&n->out[1], s, len, ct, g);
    store_block(&n->out[2], s, len, ct, m);
    store_block(&n->out[3], s, len, ct, v);
    if (a->amsgrad) store_block(&n->out[4], s, len, ct, vmax);
  }
  return NULL;
}

static tpu_status_t adam_kernel(tpu_node_t* n) {
  static const int out_of_in[5] = {0, 1, 2, 3, 4};
  if (present(&n->in[8]) && scalar_in(n, 8) == 1.0) { keep_inputs(n, out_of_in, 5); return NULL; }
  adam_t a = {.n = n, .lr = present(&n->in[6]) ? scalar_in(n, 6) : n->da[0], .beta1 = n->da[1],
              .beta2 = n->da[2], .wd = n->da[3], .eps = n->da[4], .amsgrad = n->ia[0] != 0,
              .maximize = n->ia[1] != 0, .adamw = n->ia[2] != 0, .scaled = present(&n->in[7])};
  double step = scalar_in(n, 5);
  a.step_size = a.lr / (1 - pow(a.beta1, step));
  a.bc2_sqrt = sqrt(1 - pow(a.beta2, step));
  a.grad_scale = a.scaled ? scalar_in(n, 7) : 1.0;
  return tpu__parallel_for(tpu__operand_numel(&n->in[0]), 1 << 14, adam_chunk, &a);
}

/* ---- SGD ----------------------------------------------------------------------------- */
typedef struct sgd_s {
  tpu_node_t* n;
  double lr, wd, momentum, dampening, grad_scale;
  bool nesterov, maximize, first, scaled, has_buf;
} sgd_t;

/* The step without grad_scale, maximize or a first momentum step, in one loop as Adam's:
 * gi the gradient with weight decay, bi the new momentum buffer (HAS_BUF), NEW_P the
 * parameter. */
#define SGD_ONE_LOOP(T, GRAD, HAS_BUF, NEW_P)                                               \
  for (int64_t i = 0; i < len; ++i) {                                                       \
    const T gi = GRAD;                                                                      \
    const T bi = HAS_BUF ? buf[i] * mom + gi * damp : (T)0;                                 \
    if (HAS_BUF) buf[i] = bi;                                                               \
    p[i] = NEW_P;                                                                           \
  }
#define SGD_VARIANTS(T, GRAD)                                                               \
  if (!a->has_buf) SGD_ONE_LOOP(T, GRAD, 0, p[i] - lr * gi)                                 \
  else if (a->nesterov) SGD_ONE_LOOP(T, GRAD, 1, p[i] - lr * (gi + bi * mom))               \
  else SGD_ONE_LOOP(T, GRAD, 1, p[i] - lr * bi)
#define SGD_BLOCK(T)                                                                        \
  TPU_ISA_CLONES static void sgd_block_##T(const sgd_t* a, T* restrict p, T* restrict g,     \
                                           T* restrict buf, int64_t len) {                   \
    const T lr = (T)a->lr, wd = (T)a->wd, mom = (T)a->momentum, damp = (T)(1 - a->dampening); \
    const T scale = (T)a->grad_scale;                                                       \
    if (!a->scaled && !a->maximize && (!a->has_buf || !a->first)) {                        \
      if (a->wd != 0) SGD_VARIANTS(T, g[i] + p[i] * wd)                                     \
      else SGD_VARIANTS(T, g[i])                                                            \
      return;                                                                               \
    }                                                                                       \
    T tmp[BLOCK];                                                                           \
    T* gr = take_grad_##T(a->scaled, a->maximize, a->wd != 0 || a->has_buf, scale, g, tmp, len); \
    if (a->wd != 0)                                                                         \
      for (int64_t i = 0; i < len; ++i) gr[i] = gr[i] + p[i] * wd;                          \
    if (a->has_buf) {                                                                       \
      if (a->first)                                                                         \
        for (int64_t i = 0; i < len; ++i) buf[i] = gr[i];                                   \
      else                                                                                  \
        for (int64_t i = 0; i < len; ++i) buf[i] = buf[i] * mom + gr[i] * damp;             \
      if (a->nesterov)                                                                      \
        for (int64_t i = 0; i < len; ++i) gr[i] = gr[i] + buf[i] * mom;                     \
      else                                                                                  \
        for (int64_t i = 0; i < len; ++i) gr[i] = buf[i];                                   \
    }                                                                                       \
    for (int64_t i = 0; i < len; ++i) p[i] = p[i] - lr * gr[i];                             \
  }
SGD_BLOCK(float)
SGD_BLOCK(double)

static tpu_status_t sgd_chunk(void* ctx, int64_t i0, int64_t i1, int tid) {
  (void)tid;
  const sgd_t* a = ctx;
  tpu_node_t* n = a->n;
  tpu_dtype_t ct = n->compute;
  double buf[3][BLOCK];
  for (int64_t s = i0; s < i1; s += BLOCK) {
    int64_t len = i1 - s < BLOCK ? i1 - s : BLOCK;
    void* p = load_block(&n->in[0], &n->out[0], s, len, ct, buf[0]);
    void* g = load_block(&n->in[1], a->scaled ? &n->out[1] : NULL, s, len, ct, buf[1]);
    void* mb = a->has_buf ? load_block(&n->in[2], &n->out[2], s, len, ct, buf[2]) : NULL;
    if (ct == TPU_DTYPE_F64) sgd_block_double(a, p, g, mb, len);
    else sgd_block_float(a, p, g, mb, len);
    store_block(&n->out[0], s, len, ct, p);
    if (a->scaled) store_block(&n->out[1], s, len, ct, g);
    if (a->has_buf) store_block(&n->out[2], s, len, ct, mb);
  }
  return NULL;
}

static tpu_status_t sgd_kernel(tpu_node_t* n) {
  static const int out_of_in[3] = {0, 1, 2};
  if (present(&n->in[5]) && scalar_in(n, 5) == 1.0) { keep_inputs(n, out_of_in, 3); return NULL; }
  sgd_t a = {.n = n, .lr = present(&n->in[3]) ? scalar_in(n, 3) : n->da[0], .wd = n->da[1],
             .momentum = n->da[2], .dampening = n->da[3], .nesterov = n->ia[0] != 0,
             .maximize = n->ia[1] != 0, .first = n->ia[2] != 0, .scaled = present(&n->in[4]),
             .has_buf = present(&n->in[2])};
  a.grad_scale = a.scaled ? scalar_in(n, 4) : 1.0;
  return tpu__parallel_for(tpu__operand_numel(&n->in[0]), 1 << 14, sgd_chunk, &a);
}

/* ---- GradScaler ------------------------------------------------------------------------ */
typedef struct unscale_s {
  tpu_node_t* n;
  double inv;
  int nonfinite; /* any chunk saw a NaN or Inf (atomic or) */
} unscale_t;

static tpu_status_t unscale_chunk(void* ctx, int64_t i0, int64_t i1, int tid) {
  unscale_t* a = ctx;
  tpu_node_t* n = a->n;
  tpu_dtype_t ct = n->compute;
  double buf[BLOCK];
  int bad = 0;
  for (int64_t s = i0; s < i1; s += BLOCK) {
    int64_t len = i1 - s < BLOCK ? i1 - s : BLOCK;
    void* g = load_block(&n->in[0], &n->out[0], s, len, ct, buf);
    if (ct == TPU_DTYPE_F64) {
      double* x = g;
      for (int64_t i = 0; i < len; ++i) { bad |= !isfinite(x[i]); x[i] *= a->inv; }
    } else {
      float* x = g;
      float inv = (float)a->inv;
      for (int64_t i = 0; i < len; ++i) { bad |= !isfinite(x[i]); x[i] *= inv; }
    }
    store_block(&n->out[0], s, len, ct, g);
  }
  (void)tid;
  if (bad) __atomic_fetch_or(&a->nonfinite, 1, __ATOMIC_RELAXED);
  return NULL;
}

static tpu_status_t amp_unscale_kernel(tpu_node_t* n) {
  unscale_t a = {.n = n, .inv = scalar_in(n, 2)};
  TPU_RETURN_IF_ERROR(tpu__parallel_for(tpu__operand_numel(&n->in[0]), 1 << 14, unscale_chunk, &a));
  float found = (float)scalar_in(n, 1);
  if (a.nonfinite) found = 1.0f;
  *(float*)tpu__operand_ptr(&n->out[1]) = found;
  return NULL;
}

/* ATen's rule: back off on an overflow; grow after growth_interval clean steps in a row,
 * when the grown scale is finite. */
static tpu_status_t amp_update_scale_kernel(tpu_node_t* n) {
  float scale = (float)scalar_in(n, 0);
  int32_t tracker = (int32_t)tpu__load_i64(tpu__operand_ptr(&n->in[1]), n->in[1].dtype);
  if (scalar_in(n, 2) != 0) {
    scale *= (float)n->da[1];
    tracker = 0;
  } else if (tracker + 1 == n->ia[0]) {
    float grown = scale * (float)n->da[0];
    if (isfinite(grown)) scale = grown;
    tracker = 0;
  } else {
    tracker++;
  }
  *(float*)tpu__operand_ptr(&n->out[0]) = scale;
  *(int32_t*)tpu__operand_ptr(&n->out[1]) = tracker;
  return NULL;
}

void tpu__host_register_optim(tpu_host_kernel_fn* table) {
  table[TPU_KIND_AMP_UNSCALE] = amp_unscale_kernel;
  table[TPU_KIND_AMP_UPDATE_SCALE] = amp_update_scale_kernel;
  table[TPU_KIND_ADAM_STEP] = adam_kernel;
  table[TPU_KIND_SGD_STEP] = sgd_kernel;
}
