/* Host kernels of the random family.
 *
 * Randomness comes from Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy
 * as 1, 2, 3", SC'11): a counter-based generator, so element i of an op's output is a
 * pure function of (seed, i). Kernels generate values in logical row-major order into a
 * dense buffer and unpack it into the (possibly strided) output; the same seed and shape
 * give the same tensor whatever the output's strides.
 *
 * Counter layout: word 0/1 = element index (low/high), word 2 = stream (distinguishes
 * draws within one op, e.g. multinomial rows vs. samples), word 3 = 0.
 * Key: the op's 64-bit seed (node->ia[0]), low word first. */
#include <math.h>
#include <stdlib.h>

#include "host/host.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* golden ratio */
#define PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

/* One Philox-4x32-10 block. Exported (not static) for the known-answer C test. */
void tpu__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

typedef struct { uint32_t w[4]; } rnd4_t;

static inline rnd4_t philox(uint64_t seed, uint64_t index, uint32_t stream) {
  uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), stream, 0};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  rnd4_t r;
  tpu__philox4x32_10(ctr, key, r.w);
  return r;
}

static inline uint64_t u64_of(uint32_t hi, uint32_t lo) { return (uint64_t)hi << 32 | lo; }
/* [0, 1) with 53 random bits */
static inline double unit_co(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }
/* (0, 1] with 53 random bits: safe under log */
static inline double unit_oc(uint64_t x) { return (double)((x >> 11) + 1) * 0x1.0p-53; }
/* (0, 1): strictly inside, for log(u) and log1p(-u) alike */
static inline double unit_oo(uint64_t x) { return ((double)(x >> 11) + 0.5) * 0x1.0p-53; }

/* Box-Muller: one standard normal per element from its own block. */
static inline double std_normal(uint64_t seed, uint64_t i) {
  rnd4_t r = philox(seed, i, 0);
  double u1 = unit_oc(u64_of(r.w[0], r.w[1])), u2 = unit_co(u64_of(r.w[2], r.w[3]));
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- shared plumbing ------------------------------------------------------------------ */

static tpu_status_t op_error(const tpu_node_t* n, tpu_status_code_t code, const char* msg) {
  return tpu_status_make(code, "%s: %s", tpu__node_describe(n), msg);
}

/* Packs operand `op` broadcast to `shape` (scalars included) into a dense f64 buffer. */
static double* pack_bcast_f64(const tpu_operand_t* op, const tpu_operand_t* shape) {
  tpu_operand_t b = *op;
  b.ndim = shape->ndim;
  for (int d = 0; d < shape->ndim; ++d) {
    b.sizes[d] = shape->sizes[d];
    int sd = d - (shape->ndim - op->ndim);
    b.strides[d] = op->is_scalar || sd < 0 || op->sizes[sd] == 1 ? 0 : op->strides[sd];
  }
  return tpu__pack_alloc(&b, TPU_DTYPE_F64);
}

static void* dense_alloc(int64_t numel, size_t elem) {
  uint64_t n;
  if (!tpu__mul_ok((uint64_t)(numel > 0 ? numel : 1), elem, &n)) return NULL;
  return tpu__malloc(n);
}

/* Fills output 0 from a per-element double generator. */
#define FILL_F64(node, EXPR)                                                      \
  do {                                                                            \
    tpu_operand_t* o_ = &(node)->out[0];                                          \
    int64_t n_ = tpu__operand_numel(o_);                                          \
    if (n_ == 0) return NULL;                                                     \
    double* buf_ = dense_alloc(n_, sizeof(double));                              \
    if (!buf_) return TPU_HOST_NOMEM();                                           \
    uint64_t seed = (uint64_t)(node)->ia[0];                                      \
    (void)seed;                                                                   \
    for (int64_t i = 0; i < n_; ++i) buf_[i] = (EXPR);                            \
    tpu__unpack(o_, buf_, TPU_DTYPE_F64);                                         \
    tpu__free(buf_);                                                              \
  } while (0)

/* ---- uniform_ -------------------------------------------------------------------------- */

/* The largest value of dtype t below x (x representable in t). */
static double prev_below(double x, tpu_dtype_t t) {
  if (t == TPU_DTYPE_F64) return nextafter(x, -INFINITY);
  if (t == TPU_DTYPE_F32) return nextafterf((float)x, -INFINITY);
  if (t == TPU_DTYPE_F16) {
    _Float16 h = (_Float16)x;
    uint16_t u;
    memcpy(&u, &h, 2);
    u = x > 0 ? (uint16_t)(u - 1) : x == 0 ? 0x8001 : (uint16_t)(u + 1);
    memcpy(&h, &u, 2);
    return (double)h;
  }
  uint16_t u = tpu__f32_to_bf16((float)x);
  u = x > 0 ? (uint16_t)(u - 1) : x == 0 ? 0x8001 : (uint16_t)(u + 1);
  return tpu__bf16_to_f32(u);
}

static tpu_status_t k_uniform(tpu_node_t* n) {
  double from = n->da[0], to = n->da[1];
  tpu_dtype_t t = n->out[0].dtype;
  /* Like CPU, draw `digits` bits so every step of u is representable in the dtype. */
  int digits = (int)n->ia[1];
  double scale = ldexp(1.0, -digits), span = to - from;
  double top = from < to ? prev_below(to, t) : from;
  FILL_F64(n, ({
    rnd4_t r = philox(seed, (uint64_t)i, 0);
    uint64_t bits = u64_of(r.w[0], r.w[1]) >> (64 - digits);
    /* rounding to a narrow dtype can land on `to`; keep the interval half-open */
    double v = tpu__round_to_dtype(from + (double)bits * scale * span, t);
    v >= to && from < to ? top : v;
  }));
  return NULL;
}

/* ---- normal ---------------------------------------------------------------------------- */

static tpu_status_t k_normal(tpu_node_t* n) {
  tpu_operand_t* o = &n->out[0];
  if (tpu__operand_numel(o) == 0) return NULL;
  double* mean = pack_bcast_f64(&n->in[0], o);
  double* std = pack_bcast_f64(&n->in[1], o);
  tpu_status_t st = NULL;
  if (!mean || !std) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t numel = tpu__operand_numel(o);
  if (n->ia[1])
    for (int64_t i = 0; i < numel; ++i)
      if (!(std[i] >= 0.0)) {
        st = op_error(n, TPU_INVALID_ARGUMENT, "normal expects all elements of std >= 0.0");
        goto done;
      }
  uint64_t seed = (uint64_t)n->ia[0];
  for (int64_t i = 0; i < numel; ++i) mean[i] += std[i] * std_normal(seed, (uint64_t)i);
  tpu__unpack(o, mean, TPU_DTYPE_F64);
done:
  tpu__free(mean);
  tpu__free(std);
  return st;
}

/* ---- bernoulli ------------------------------------------------------------------------- */

static tpu_status_t k_bernoulli(tpu_node_t* n) {
  tpu_operand_t* o = &n->out[0];
  int64_t numel = tpu__operand_numel(o);
  if (numel == 0) return NULL;
  double* p = pack_bcast_f64(&n->in[0], o);
  if (!p) return TPU_HOST_NOMEM();
  if (n->ia[1])
    for (int64_t i = 0; i < numel; ++i)
      if (!(p[i] >= 0 && p[i] <= 1)) {
        tpu__free(p);
        return op_error(n, TPU_INVALID_ARGUMENT,
                        "Expected p_in >= 0 && p_in <= 1 to be true, but got false.");
      }
  uint64_t seed = (uint64_t)n->ia[0];
  /* u < p with 53-bit u: p = 0 never fires, p = 1 always does */
  for (int64_t i = 0; i < numel; ++i) {
    rnd4_t r = philox(seed, (uint64_t)i, 0);
    p[i] = unit_co(u64_of(r.w[0], r.w[1])) < p[i] ? 1.0 : 0.0;
  }
  tpu__unpack(o, p, TPU_DTYPE_F64);
  tpu__free(p);
  return NULL;
}

/* ---- random_ --------------------------------------------------------------------------- */

/* random_() draws from [0, 2^digits] for floating dtypes and [0, max] for integers. */
static uint64_t default_modulus(tpu_dtype_t t) {
  switch (t) {
    case TPU_DTYPE_BOOL: return 2;
    case TPU_DTYPE_U8: return 256;
    case TPU_DTYPE_I8: return 128;
    case TPU_DTYPE_I16: return 32768;
    case TPU_DTYPE_I32: return 1ull << 31;
    case TPU_DTYPE_I64: return 1ull << 63;
    case TPU_DTYPE_F16: return (1ull << 11) + 1;
    case TPU_DTYPE_BF16: return (1ull << 8) + 1;
    case TPU_DTYPE_F32: return (1ull << 24) + 1;
    default: return (1ull << 53) + 1;
  }
}

static tpu_status_t k_randint(tpu_node_t* n) {
  tpu_operand_t* o = &n->out[0];
  int64_t numel = tpu__operand_numel(o);
  if (numel == 0) return NULL;
  int64_t* buf = dense_alloc(numel, sizeof(int64_t));
  if (!buf) return TPU_HOST_NOMEM();
  uint64_t seed = (uint64_t)n->ia[0];
  int mode = (int)n->ia[1];
  uint64_t range = mode == 0 ? default_modulus(o->dtype) : (uint64_t)n->ia[2];
  uint64_t base = mode == 0 ? 0 : (uint64_t)n->ia[3];
  /* Narrow ranges use 32 bits, as CPU does; modulo bias is below 2^-32 (2^-64) there. */
  bool wide = range > 0xffffffffull || o->dtype == TPU_DTYPE_I64 || o->dtype == TPU_DTYPE_F64;
  for (int64_t i = 0; i < numel; ++i) {
    rnd4_t r = philox(seed, (uint64_t)i, 0);
    uint64_t x = wide ? u64_of(r.w[0], r.w[1]) : r.w[0];
    buf[i] = mode == 2 ? (int64_t)x : (int64_t)(x % range + base);
  }
  tpu__unpack(o, buf, TPU_DTYPE_I64);
  tpu__free(buf);
  return NULL;
}

/* ---- continuous distributions by inversion -------------------------------------------- */

static tpu_status_t k_exponential(tpu_node_t* n) {
  double lambd = n->da[0];
  FILL_F64(n, ({
    rnd4_t r = philox(seed, (uint64_t)i, 0);
    -log(unit_oc(u64_of(r.w[0], r.w[1]))) / lambd;
  }));
  return NULL;
}

static tpu_status_t k_log_normal(tpu_node_t* n) {
  double mean = n->da[0], std = n->da[1];
  FILL_F64(n, exp(mean + std * std_normal(seed, (uint64_t)i)));
  return NULL;
}

static tpu_status_t k_geometric(tpu_node_t* n) {
  double denom = log1p(-n->da[0]);
  FILL_F64(n, ({
    rnd4_t r = philox(seed, (uint64_t)i, 0);
    double v = ceil(log(unit_oo(u64_of(r.w[0], r.w[1]))) / denom);
    /* keep the int64 conversion on unpack defined for tiny p */
    v < 1 ? 1 : v > 0x1.0p62 ? 0x1.0p62 : v;
  }));
  return NULL;
}

static tpu_status_t k_cauchy(tpu_node_t* n) {
  double median = n->da[0], sigma = n->da[1];
  FILL_F64(n, ({
    rnd4_t r = philox(seed, (uint64_t)i, 0);
    median + sigma * tan(3.141592653589793 * (unit_oo(u64_of(r.w[0], r.w[1])) - 0.5));
  }));
  return NULL;
}

/* ---- randperm: Fisher-Yates, swap index for position i from block i ------------------- */

static tpu_status_t k_randperm(tpu_node_t* n) {
  int64_t len = n->ia[1];
  if (len == 0) return NULL;
  int64_t* perm = dense_alloc(len, sizeof(int64_t));
  if (!perm) return TPU_HOST_NOMEM();
  uint64_t seed = (uint64_t)n->ia[0];
  for (int64_t i = 0; i < len; ++i) perm[i] = i;
  for (int64_t i = len - 1; i > 0; --i) {
    rnd4_t r = philox(seed, (uint64_t)i, 0);
    /* multiply-shift maps 64 bits onto [0, i] with bias below 2^-40 */
    int64_t j = (int64_t)(((unsigned __int128)u64_of(r.w[0], r.w[1]) * (uint64_t)(i + 1)) >> 64);
    int64_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
  }
  tpu__unpack(&n->out[0], perm, TPU_DTYPE_I64);
  tpu__free(perm);
  return NULL;
}

/* ---- multinomial ----------------------------------------------------------------------- */

typedef struct { double key; int64_t idx; } keyed_t;

static int by_key_desc(const void* a, const void* b) {
  const keyed_t *x = a, *y = b;
  if (x->key != y->key) return x->key > y->key ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static tpu_status_t k_multinomial(tpu_node_t* n) {
  const tpu_operand_t* in = &n->in[0];
  tpu_operand_t* o = &n->out[0];
  int64_t n_cat = in->sizes[in->ndim - 1];
  int64_t rows = in->ndim == 2 ? in->sizes[0] : 1;
  int64_t ns = n->ia[1];
  bool repl = n->ia[2] != 0;
  if (rows == 0) return NULL;
  double* p = tpu__pack_alloc(in, TPU_DTYPE_F64);
  int64_t* res = dense_alloc(rows * ns, sizeof(int64_t));
  keyed_t* keys = dense_alloc(n_cat, sizeof(keyed_t));
  double* cdf = dense_alloc(n_cat, sizeof(double));
  tpu_status_t st = NULL;
  if (!p || !res || !keys || !cdf) { st = TPU_HOST_NOMEM(); goto done; }
  uint64_t seed = (uint64_t)n->ia[0];
  if (!repl || ns == 1) {
    /* CPU checks the whole tensor, then each row's sum, before sampling */
    for (int64_t i = 0; i < rows * n_cat; ++i)
      if (!(p[i] >= 0 && p[i] < INFINITY)) {
        st = op_error(n, TPU_INVALID_ARGUMENT, "probability tensor contains either `inf`, `nan` or element < 0");
        goto done;
      }
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < n_cat; ++c) s += p[r * n_cat + c];
      if (s == 0) {
        st = op_error(n, TPU_INVALID_ARGUMENT, "invalid multinomial distribution (sum of probabilities <= 0)");
        goto done;
      }
    }
    /* The exponential race: argsort of p / q with q ~ Exp(1) samples without
     * replacement in proportion to p (the Gumbel-top-k trick, exponentiated). */
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < n_cat; ++c) {
        rnd4_t w = philox(seed, (uint64_t)(r * n_cat + c), 1);
        double q = -log(unit_oc(u64_of(w.w[0], w.w[1])));
        keys[c].key = p[r * n_cat + c] / q;
        keys[c].idx = c;
      }
      qsort(keys, (size_t)n_cat, sizeof(keyed_t), by_key_desc);
      for (int64_t s = 0; s < ns; ++s) res[r * ns + s] = keys[s].idx;
    }
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      double total = 0;
      for (int64_t c = 0; c < n_cat; ++c) {
        double v = p[r * n_cat + c];
        if (v < 0) {
          st = op_error(n, TPU_INVALID_ARGUMENT, "invalid multinomial distribution (encountering probability entry < 0)");
          goto done;
        }
        if (!(v < INFINITY)) {
          st = op_error(n, TPU_INVALID_ARGUMENT,
                        "invalid multinomial distribution (encountering probability entry = infinity or NaN)");
          goto done;
        }
        total += v;
        cdf[c] = total;
      }
      if (!(total > 0)) {
        st = op_error(n, TPU_INVALID_ARGUMENT, "invalid multinomial distribution (sum of probabilities <= 0)");
        goto done;
      }
      for (int64_t s = 0; s < ns; ++s) {
        rnd4_t w = philox(seed, (uint64_t)(r * ns + s), 2);
        double x = unit_co(u64_of(w.w[0], w.w[1])) * total;
        /* first category whose cumulative mass exceeds x: zero-mass ones never win */
        int64_t lo = 0, hi = n_cat - 1;
        while (lo < hi) {
          int64_t mid = lo + (hi - lo) / 2;
          if (cdf[mid] > x) hi = mid; else lo = mid + 1;
        }
        while (lo > 0 && p[r * n_cat + lo] == 0) --lo; /* x rounding up onto a plateau */
        res[r * ns + s] = lo;
      }
    }
  }
  tpu__unpack(o, res, TPU_DTYPE_I64);
done:
  tpu__free(p);
  tpu__free(res);
  tpu__free(keys);
  tpu__free(cdf);
  return st;
}

/* ---- dropout --------------------------------------------------------------------------- */

static tpu_status_t k_dropout(tpu_node_t* n) {
  tpu_operand_t *o = &n->out[0], *m = &n->out[1];
  int64_t numel = tpu__operand_numel(o);
  if (numel == 0) return NULL;
  tpu_dtype_t c = n->compute;
  void* x = tpu__pack_alloc(&n->in[0], c);
  uint8_t* mask = dense_alloc(numel, 1);
  if (!x || !mask) { tpu__free(x); tpu__free(mask); return TPU_HOST_NOMEM(); }
  if (!n->ia[1]) {
    memset(mask, 1, (size_t)numel);
  } else {
    uint64_t seed = (uint64_t)n->ia[0];
    double p1m = n->da[0];
    for (int64_t i = 0; i < numel; ++i) {
      rnd4_t r = philox(seed, (uint64_t)i, 0);
      mask[i] = unit_co(u64_of(r.w[0], r.w[1])) < p1m;
    }
    /* input * mask * scale, as CPU computes it: 0 * inf stays NaN */
    if (c == TPU_DTYPE_F64) {
      double* d = x;
      for (int64_t i = 0; i < numel; ++i) d[i] = d[i] * mask[i] * n->da[1];
    } else {
      float* f = x;
      float scale = (float)n->da[1];
      for (int64_t i = 0; i < numel; ++i) f[i] = f[i] * (float)mask[i] * scale;
    }
  }
  tpu__unpack(o, x, c);
  tpu__unpack(m, mask, TPU_DTYPE_BOOL);
  tpu__free(x);
  tpu__free(mask);
  return NULL;
}

static void bwd_f32(int64_t n, void* out, const void* const* in, const tpu_node_t* node) {
  float* r = out; const float *g = in[0], *m = in[1];
  float s = (float)node->da[0];
  for (int64_t i = 0; i < n; ++i) r[i] = g[i] * m[i] * s;
}
static void bwd_f64(int64_t n, void* out, const void* const* in, const tpu_node_t* node) {
  double* r = out; const double *g = in[0], *m = in[1];
  for (int64_t i = 0; i < n; ++i) r[i] = g[i] * m[i] * node->da[0];
}

static tpu_status_t k_dropout_backward(tpu_node_t* n) {
  return tpu__tile_run(n, n->compute, n->compute == TPU_DTYPE_F64 ? bwd_f64 : bwd_f32);
}

void tpu__host_register_random(tpu_host_kernel_fn* table) {
  table[TPU_KIND_RAND_UNIFORM] = k_uniform;
  table[TPU_KIND_RAND_NORMAL] = k_normal;
  table[TPU_KIND_RAND_BERNOULLI] = k_bernoulli;
  table[TPU_KIND_RAND_INT] = k_randint;
  table[TPU_KIND_RAND_EXPONENTIAL] = k_exponential;
  table[TPU_KIND_RAND_LOG_NORMAL] = k_log_normal;
  table[TPU_KIND_RAND_GEOMETRIC] = k_geometric;
  table[TPU_KIND_RAND_CAUCHY] = k_cauchy;
  table[TPU_KIND_RAND_PERM] = k_randperm;
  table[TPU_KIND_RAND_MULTINOMIAL] = k_multinomial;
  table[TPU_KIND_DROPOUT] = k_dropout;
  table[TPU_KIND_DROPOUT_BACKWARD] = k_dropout_backward;
}
