/* Host kernels of the random family.
 *
 * Randomness comes from Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy
 * as 1, 2, 3", SC'11): a counter-based generator, so element i of an op's output is a
 * pure function of (seed, i). Kernels generate values in logical row-major order into a
 * dense buffer (the output itself when it is dense) and unpack it into the (possibly
 * strided) output; the same seed and shape give the same tensor whatever the output's
 * strides and the thread count. The element-wise draws (uniform, normal, bernoulli,
 * dropout, randint, exponential, log-normal, geometric, Cauchy) run in parallel chunks
 * with eight Philox blocks at a time in SIMD lanes (fill, philox8); float32 and narrower
 * normals come four per block from a float Box-Muller (gen_normal_f32), float32 uniforms
 * four per block (gen_uniform_f32). 4M f32 on 2 AVX2 cores, ns per element, before ->
 * after, with PyTorch CPU in the same runs: randn 90-121 -> 3.4-3.8 (CPU 6.9-10.6), rand
 * 25-36 -> 5.4-6.0 (CPU 3.9-7.8; four per block: 16M, 4.8-5.9 -> 2.6-2.9), dropout 20-27
 * -> 7.2-8.2 (CPU 12-24). The other draws give the scalar kernels' values bit for bit
 * (348 draws over dtypes, shapes, and 1 or 2 threads; randint: 110 draws).
 *
 * Counter layout: word 0/1 = element index (low/high; i >> 2 for the draws four to a
 * block), word 2 = stream (distinguishes draws within one op, e.g. multinomial rows vs.
 * samples), word 3 = 0.
 * Key: the op's 64-bit seed (node->ia[0]), low word first. */
#include <math.h>
#include <stdlib.h>

#include "host/host.h"
#include "host/vmath.h"

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

/* The blocks of elements i0 .. i0 + 7 (stream s): w[k][j] is word k of philox(seed,
 * i0 + j, s). Eight blocks side by side in 64-bit vector lanes holding 32-bit words, so
 * each round's two 32x32->64-bit products are SIMD multiplies (vpmuludq on AVX2); the
 * compiler did not vectorize the same rounds written over arrays of words. */
typedef uint64_t v8du __attribute__((vector_size(64)));
typedef uint32_t v8su __attribute__((vector_size(32)));
TPU_VINLINE void philox8(uint64_t seed, uint64_t i0, uint32_t s, uint32_t w[4][8]) {
  const v8du lo32 = (v8du){0} + 0xffffffffu;
  /* the counters by vector arithmetic: lanes written one by one and read back whole
   * stalled on store forwarding */
  const v8du idx = (v8du){0, 1, 2, 3, 4, 5, 6, 7} + i0;
  v8du c0 = idx & lo32, c1 = idx >> 32, c2 = (v8du){0} + s, c3 = (v8du){0};
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    v8du p0 = c0 * PHILOX_M0, p1 = c2 * PHILOX_M1;
    c0 = (p1 >> 32) ^ c1 ^ k0;
    c2 = (p0 >> 32) ^ c3 ^ k1;
    c1 = p1 & lo32;
    c3 = p0 & lo32;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  v8su o[4] = {__builtin_convertvector(c0, v8su), __builtin_convertvector(c1, v8su),
               __builtin_convertvector(c2, v8su), __builtin_convertvector(c3, v8su)};
  memcpy(w, o, sizeof o);
}

static inline uint64_t u64_of(uint32_t hi, uint32_t lo) { return (uint64_t)hi << 32 | lo; }
/* [0, 1) with 53 random bits */
static inline double unit_co(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }
/* (0, 1] with 53 random bits: safe under log */
static inline double unit_oc(uint64_t x) { return (double)((x >> 11) + 1) * 0x1.0p-53; }
/* (0, 1): strictly inside, for log(u) and log1p(-u) alike */
static inline double unit_oo(uint64_t x) { return ((double)(x >> 11) + 0.5) * 0x1.0p-53; }

/* unit_co(x) < p, for any x, as an integer test: x >> 11 < below_53(p). (x >> 11 is an
 * integer k < 2^53, exact in double, and p 2^53 is exact, so k 2^-53 < p iff k < ceil(p 2^53).) */
static uint64_t below_53(double p) {
  if (!(p > 0)) return 0;
  return p >= 1 ? (uint64_t)1 << 53 : (uint64_t)ceil(p * 0x1.0p53);
}
/* A Bernoulli draw from a block's words 0 and 1: unit_co(u64_of(w0, w1)) < p */
static inline bool fires(uint32_t w0, uint32_t w1, uint64_t below) { return u64_of(w0, w1) >> 11 < below; }

/* Box-Muller: one standard normal per element from its own block's words. */
static inline double normal_of(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  double u1 = unit_oc(u64_of(w0, w1)), u2 = unit_co(u64_of(w2, w3));
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

/* op's value when it is one element (a scalar, or a tensor of one element broadcast), as
 * pack_bcast_f64 would give it; false otherwise. */
static bool single_f64(const tpu_operand_t* op, double* v) {
  if (!op->is_scalar && tpu__operand_numel(op) != 1) return false;
  tpu_operand_t one = *op;
  one.ndim = 0;
  tpu__pack(&one, NULL, TPU_DTYPE_F64, v);
  return true;
}

/* Fills of output 0 from each element's Philox block (stream 0): gen writes the values of
 * elements [i0, i0 + len) as doubles, the kernel's formula of (seed, i) and parameters;
 * chunks of the output run on the pool, each piece converted into the output's dtype
 * where it lies (the output's memory when dense, else a buffer unpacked at the end).
 * Element i depends on (seed, i) alone, so the values do not depend on the threads. */
typedef struct fill_s fill_t;
struct fill_s {
  void (*gen)(const fill_t* F, int64_t i0, int64_t len, double* out);
  uint64_t seed;
  double p[6];            /* the kernel's parameters */
  uint64_t below;         /* bernoulli: below_53(p[0]) */
  const double *pa, *pb;  /* per-element parameters (broadcast tensors), or NULL */
  tpu_dtype_t t;          /* output dtype */
  char* dst;              /* dense output in t */
};

#define FILL_PIECE 256
#define FILL_GRAIN 16384

static tpu_status_t fill_chunk(void* arg, int64_t b, int64_t e, int tid) {
  (void)tid;
  const fill_t* F = arg;
  double v[FILL_PIECE];
  size_t es = tpu_dtype_size(F->t);
  for (int64_t i = b; i < e; i += FILL_PIECE) {
    int64_t len = e - i < FILL_PIECE ? e - i : FILL_PIECE;
    F->gen(F, i, len, v);
    tpu__convert_run(F->dst + (size_t)i * es, F->t, 1, v, TPU_DTYPE_F64, 1, len);
  }
  return NULL;
}

static tpu_status_t fill(tpu_node_t* n, fill_t* F) {
  tpu_operand_t* o = &n->out[0];
  int64_t numel = tpu__operand_numel(o);
  if (numel == 0) return NULL;
  void* owned;
  F->seed = (uint64_t)n->ia[0];
  F->t = o->dtype;
  F->dst = tpu__dense_out(n, o, o->dtype, false, &owned);
  if (!F->dst) return TPU_HOST_NOMEM();
  tpu_status_t st = tpu__parallel_for(numel, FILL_GRAIN, fill_chunk, F);
  if (!st) tpu__dense_out_done(o, owned, o->dtype);
  tpu__free(owned);
  return st;
}

/* The words of the blocks of elements [i0, i0 + len), len <= FILL_PIECE: ws[k][t] is word k
 * of element i0 + t's block, eight blocks at a time. */
TPU_VINLINE void block_words(uint64_t seed, int64_t i0, int64_t len, uint32_t ws[4][FILL_PIECE + 8]) {
  uint32_t w[4][8];
  for (int64_t b = 0; b < len; b += 8) {
    philox8(seed, (uint64_t)(i0 + b), 0, w);
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 8; ++j) ws[k][b + j] = w[k][j];
  }
}

/* A gen function: EXPR of F, i (the element) and w0..w3 (its block's words). The blocks'
 * words come into arrays first (block_words), then one loop over the elements evaluates
 * EXPR (a loop the compiler can vectorize where EXPR allows). */
#define GEN_FN(NAME, EXPR)                                                                  \
  TPU_ISA_CLONES static void NAME(const fill_t* Fp, int64_t i0, int64_t len, double* restrict out) { \
    const fill_t Fl = *Fp, *F = &Fl; /* a local copy: out cannot alias the parameters */  \
    uint32_t ws[4][FILL_PIECE + 8];                                                        \
    block_words(F->seed, i0, len, ws);                                                     \
    for (int64_t t = 0; t < len; ++t) {                                                    \
      int64_t i = i0 + t;                                                                  \
      uint32_t w0 = ws[0][t], w1 = ws[1][t], w2 = ws[2][t], w3 = ws[3][t];                 \
      (void)i, (void)w1, (void)w2, (void)w3;                                               \
      out[t] = (EXPR);                                                                     \
    }                                                                                      \
  }

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

/* p: from, to, 2^-digits, to - from, the largest value below `to`, digits. ROUND rounds v
 * to the output dtype; rounding to a narrow dtype can land on `to`, so the interval is
 * kept half-open. */
#define UNIFORM_OF(BITS, ROUND)                                                             \
  ({                                                                                       \
    double v = F->p[0] + (double)(BITS) * F->p[2] * F->p[3];                               \
    v = ROUND;                                                                             \
    v >= F->p[1] && F->p[0] < F->p[1] ? F->p[4] : v;                                       \
  })
GEN_FN(gen_uniform, UNIFORM_OF(u64_of(w0, w1) >> (64 - (int)F->p[5]), tpu__round_to_dtype(v, F->t)))
/* float32 (24 digits): four elements per Philox block, element i from the top 24 bits of
 * word i & 3 of block i >> 2 (as an int32, rounded by a cast, so the loop vectorizes), a
 * quarter of the blocks of gen_uniform. 16M floats on 2 AVX2 cores: 4.8-5.9 -> 2.6-2.9 ns
 * per element. */
TPU_ISA_CLONES static void gen_uniform_f32(const fill_t* Fp, int64_t i0, int64_t len, double* restrict out) {
  const fill_t Fl = *Fp, *F = &Fl;
  uint32_t w[4][8], u[FILL_PIECE + 32];
  int64_t k0 = i0 >> 2, k1 = (i0 + len + 3) >> 2;
  for (int64_t k = k0, nu = 0; k < k1; k += 8, nu += 32) {
    philox8(F->seed, (uint64_t)k, 0, w);
    for (int j = 0; j < 8; ++j)
      for (int q = 0; q < 4; ++q) u[nu + 4 * j + q] = w[q][j];
  }
  const uint32_t* us = u + (i0 & 3);
  for (int64_t t = 0; t < len; ++t) out[t] = UNIFORM_OF((int32_t)(us[t] >> 8), (double)(float)v);
}

static tpu_status_t k_uniform(tpu_node_t* n) {
  double from = n->da[0], to = n->da[1];
  tpu_dtype_t t = n->out[0].dtype;
  /* Like CPU, draw `digits` bits so every step of u is representable in the dtype. */
  int digits = (int)n->ia[1];
  double top = from < to ? prev_below(to, t) : from;
  fill_t F = {.gen = t == TPU_DTYPE_F32 && digits == 24 ? gen_uniform_f32 : gen_uniform,
              .p = {from, to, ldexp(1.0, -digits), to - from, top, digits}};
  return fill(n, &F);
}

/* ---- normal ---------------------------------------------------------------------------- */

/* p: mean, std, unless pa, pb give them per element */
GEN_FN(gen_normal, (F->pa ? F->pa[i] : F->p[0]) + (F->pb ? F->pb[i] : F->p[1]) * normal_of(w0, w1, w2, w3))

/* Standard normals in float, for float32 and narrower outputs: four per Philox block (two
 * Box-Muller pairs of 32-bit words; PyTorch's CPU kernel draws pairs too), so a quarter of
 * the blocks and half the logarithms of the double path. u1 comes from 31 bits (|z| up to
 * 6.66; CPU's float normals stop at 5.77), the angle from 24 bits, and ln u1 and the
 * sine and cosine of 2 pi u2 from polynomials fitted for this file (least squares
 * reweighted toward minimax). Against double libm over 2e8 draws: ln 1.41 ulp, sin and
 * cos 1.41 * 2^-24 absolute, z within 11 * 2^-24 absolute (|z| <= 6.66). */
/* ln x for a normal float x > 0: x = m 2^e, m in [sqrt(1/2), sqrt(2)), ln(1 + f) =
 * f - f^2/2 + f^3 P(f) with P of degree 7 */
TPU_VINLINE float bm_log(float x) {
  uint32_t bx;
  memcpy(&bx, &x, 4);
  float m = tpu__f32_from_bits((bx & 0x7fffffu) | 0x3f800000u);
  float e = (float)((int32_t)(bx >> 23) - 127);
  bool big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = big ? e + 1.0f : e;
  float f = m - 1.0f, f2 = f * f;
  float q = -7.634429634e-02f;
  q = TPU_FMAF(q, f, 1.276154965e-01f);
  q = TPU_FMAF(q, f, -1.316019446e-01f);
  q = TPU_FMAF(q, f, 1.420176178e-01f);
  q = TPU_FMAF(q, f, -1.662335694e-01f);
  q = TPU_FMAF(q, f, 2.000122666e-01f);
  q = TPU_FMAF(q, f, -2.500082254e-01f);
  q = TPU_FMAF(q, f, 3.333333135e-01f);
  float lg = f + TPU_FMAF(f2 * f, q, -0.5f * f2);
  return TPU_FMAF(e, 0.693359375f, TPU_FMAF(e, -2.12194440e-4f, lg)); /* ln 2 = hi + lo */
}

/* cos and sin of 2 pi u for u in [0, 1): u = q/4 + r, |r| <= 1/8 (exact), polynomials in r,
 * then the quarter turns q */
TPU_VINLINE void bm_sincos(float u, float* c, float* s) {
  float q = (float)(int32_t)(u * 4.0f + 0.5f);
  float r = TPU_FMAF(q, -0.25f, u), r2 = r * r;
  float sp = -7.539374542e+01f;
  sp = TPU_FMAF(sp, r2, 8.159236145e+01f);
  sp = TPU_FMAF(sp, r2, -4.134166336e+01f);
  sp = TPU_FMAF(sp, r2, 6.283185482e+00f);
  float sn = r * sp;
  float cp = 5.920289230e+01f;
  cp = TPU_FMAF(cp, r2, -8.544229889e+01f);
  cp = TPU_FMAF(cp, r2, 6.493930817e+01f);
  cp = TPU_FMAF(cp, r2, -1.973920822e+01f);
  float cs = TPU_FMAF(cp, r2, 1.0f);
  /* quarter turns q = 0..3: (cs, sn), (-sn, cs), (-cs, -sn), (sn, -cs); as a swap for odd q
   * and sign flips, without branches or tables, so the loop vectorizes */
  uint32_t qi = (uint32_t)(int32_t)q;
  bool odd = qi & 1u;
  float a = odd ? sn : cs, b = odd ? cs : sn;
  uint32_t ab, bb;
  memcpy(&ab, &a, 4);
  memcpy(&bb, &b, 4);
  *c = tpu__f32_from_bits(ab ^ (((qi + 1u) & 2u) << 30));
  *s = tpu__f32_from_bits(bb ^ ((qi & 2u) << 30));
}

/* p: mean, std, unless pa, pb give them per element. Element i is from block i >> 2:
 * its words 0, 1 give elements 0 (cosine) and 1 (sine), words 2, 3 elements 2 and 3.
 * The blocks' words are laid out as pairs first, then one loop over the pairs (a trip
 * count the compiler does not know, so it vectorizes the loop instead of unrolling it). */
#define PAIRS_MAX (FILL_PIECE / 2 + 16)
TPU_ISA_CLONES static void gen_normal_f32(const fill_t* F, int64_t i0, int64_t len, double* out) {
  uint32_t w[4][8], a[PAIRS_MAX], b[PAIRS_MAX];
  float zc[PAIRS_MAX], zs[PAIRS_MAX];
  int64_t k0 = i0 >> 2, k1 = (i0 + len + 3) >> 2;
  int np = 0;
  for (int64_t k = k0; k < k1; k += 8, np += 16) {
    philox8(F->seed, (uint64_t)k, 0, w);
    for (int j = 0; j < 8; ++j)
      for (int p = 0; p < 2; ++p) {
        a[np + 2 * j + p] = w[2 * p][j];
        b[np + 2 * j + p] = w[2 * p + 1][j];
      }
  }
  for (int q = 0; q < np; ++q) {
    float u1 = ((float)(int32_t)(a[q] >> 1) + 0.5f) * 0x1.0p-31f; /* (0, 1) */
    float u2 = (float)(int32_t)(b[q] >> 8) * 0x1.0p-24f;          /* [0, 1) */
    float r = __builtin_sqrtf(-2.0f * bm_log(u1)), c, sn;
    bm_sincos(u2, &c, &sn);
    zc[q] = r * c;
    zs[q] = r * sn;
  }
  for (int64_t i = i0; i < i0 + len; ++i) {
    int64_t q = (i - 4 * k0) >> 1;
    double z = i & 1 ? zs[q] : zc[q];
    out[i - i0] = (F->pa ? F->pa[i] : F->p[0]) + (F->pb ? F->pb[i] : F->p[1]) * z;
  }
}

/* A per-element parameter of a fill: one value in *v, or a packed broadcast array in
 * *arr (for tpu__free). False on host OOM. */
static bool fill_param(const tpu_operand_t* op, const tpu_operand_t* shape, double* v, double** arr) {
  *arr = NULL;
  if (single_f64(op, v)) return true;
  *arr = pack_bcast_f64(op, shape);
  return *arr != NULL;
}

static tpu_status_t k_normal(tpu_node_t* n) {
  tpu_operand_t* o = &n->out[0];
  int64_t numel = tpu__operand_numel(o);
  if (numel == 0) return NULL;
  tpu_dtype_t t = o->dtype;
  bool narrow = t == TPU_DTYPE_F32 || t == TPU_DTYPE_BF16 || t == TPU_DTYPE_F16;
  fill_t F = {.gen = narrow ? gen_normal_f32 : gen_normal};
  double *mean = NULL, *std = NULL;
  tpu_status_t st = NULL;
  bool ok = fill_param(&n->in[0], o, &F.p[0], &mean) && fill_param(&n->in[1], o, &F.p[1], &std);
  if (!ok) { st = TPU_HOST_NOMEM(); goto done; }
  F.pa = mean;
  F.pb = std;
  if (n->ia[1])
    for (int64_t i = 0; i < (std ? numel : 1); ++i)
      if (!(std ? std[i] >= 0.0 : F.p[1] >= 0.0)) {
        st = op_error(n, TPU_INVALID_ARGUMENT, "normal expects all elements of std >= 0.0");
        goto done;
      }
  st = fill(n, &F);
done:
  tpu__free(mean);
  tpu__free(std);
  return st;
}

/* ---- bernoulli ------------------------------------------------------------------------- */

/* u < p with 53-bit u (fires): p = 0 never fires, p = 1 always does (below: below_53(p),
 * unless pa gives p per element) */
GEN_FN(gen_bernoulli, fires(w0, w1, F->pa ? below_53(F->pa[i]) : F->below) ? 1.0 : 0.0)

static tpu_status_t k_bernoulli(tpu_node_t* n) {
  tpu_operand_t* o = &n->out[0];
  int64_t numel = tpu__operand_numel(o);
  if (numel == 0) return NULL;
  fill_t F = {.gen = gen_bernoulli};
  double* p;
  if (!fill_param(&n->in[0], o, &F.p[0], &p)) return TPU_HOST_NOMEM();
  F.pa = p;
  F.below = below_53(F.p[0]);
  tpu_status_t st = NULL;
  if (n->ia[1])
    for (int64_t i = 0; i < (p ? numel : 1) && !st; ++i) {
      double pi = p ? p[i] : F.p[0];
      if (!(pi >= 0 && pi <= 1))
        st = op_error(n, TPU_INVALID_ARGUMENT, "Expected p_in >= 0 && p_in <= 1 to be true, but got false.");
    }
  if (!st) st = fill(n, &F);
  tpu__free(p);
  return st;
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

typedef struct randint_s {
  uint64_t seed, range, base;
  int mode;   /* 0: the dtype's default range, 1: [base, base + range), 2: all 64 bits */
  bool wide;  /* 64 random bits per element, else 32 */
  int64_t* buf;
} randint_t;

TPU_ISA_CLONES static tpu_status_t randint_chunk(void* arg, int64_t b, int64_t e, int tid) {
  (void)tid;
  const randint_t* R = arg;
  uint32_t ws[4][FILL_PIECE + 8];
  for (int64_t i0 = b; i0 < e; i0 += FILL_PIECE) {
    int64_t len = e - i0 < FILL_PIECE ? e - i0 : FILL_PIECE;
    block_words(R->seed, i0, len, ws);
    for (int64_t t = 0; t < len; ++t) {
      uint64_t x = R->wide ? u64_of(ws[0][t], ws[1][t]) : ws[0][t];
      /* narrow: a 32-bit remainder (range < 2^32), the same value at about half the cost */
      if (R->mode != 2) x = (R->wide ? x % R->range : (uint32_t)x % (uint32_t)R->range) + R->base;
      R->buf[i0 + t] = (int64_t)x;
    }
  }
  return NULL;
}

static tpu_status_t k_randint(tpu_node_t* n) {
  tpu_operand_t* o = &n->out[0];
  int64_t numel = tpu__operand_numel(o);
  if (numel == 0) return NULL;
  int64_t* buf = dense_alloc(numel, sizeof(int64_t));
  if (!buf) return TPU_HOST_NOMEM();
  int mode = (int)n->ia[1];
  uint64_t range = mode == 0 ? default_modulus(o->dtype) : (uint64_t)n->ia[2];
  /* Narrow ranges use 32 bits, as CPU does; modulo bias is below 2^-32 (2^-64) there. */
  bool wide = range > 0xffffffffull || o->dtype == TPU_DTYPE_I64 || o->dtype == TPU_DTYPE_F64;
  randint_t R = {(uint64_t)n->ia[0], range, mode == 0 ? 0 : (uint64_t)n->ia[3], mode, wide, buf};
  tpu_status_t st = tpu__parallel_for(numel, FILL_GRAIN, randint_chunk, &R);
  if (!st) tpu__unpack(o, buf, TPU_DTYPE_I64);
  tpu__free(buf);
  return st;
}

/* ---- continuous distributions by inversion -------------------------------------------- */

/* p: lambda */
GEN_FN(gen_exponential, -log(unit_oc(u64_of(w0, w1))) / F->p[0])
/* p: mean, std */
GEN_FN(gen_log_normal, exp(F->p[0] + F->p[1] * normal_of(w0, w1, w2, w3)))
/* p: log1p(-p); the clamp keeps the int64 conversion of the output defined for tiny p */
GEN_FN(gen_geometric, ({
  double v = ceil(log(unit_oo(u64_of(w0, w1))) / F->p[0]);
  v < 1 ? 1 : v > 0x1.0p62 ? 0x1.0p62 : v;
}))
/* p: median, sigma */
GEN_FN(gen_cauchy, F->p[0] + F->p[1] * tan(3.141592653589793 * (unit_oo(u64_of(w0, w1)) - 0.5)))

static tpu_status_t k_exponential(tpu_node_t* n) {
  fill_t F = {.gen = gen_exponential, .p = {n->da[0]}};
  return fill(n, &F);
}

static tpu_status_t k_log_normal(tpu_node_t* n) {
  fill_t F = {.gen = gen_log_normal, .p = {n->da[0], n->da[1]}};
  return fill(n, &F);
}

static tpu_status_t k_geometric(tpu_node_t* n) {
  fill_t F = {.gen = gen_geometric, .p = {log1p(-n->da[0])}};
  return fill(n, &F);
}

static tpu_status_t k_cauchy(tpu_node_t* n) {
  fill_t F = {.gen = gen_cauchy, .p = {n->da[0], n->da[1]}};
  return fill(n, &F);
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

typedef struct drop_s {
  uint64_t seed, below; /* keep an element when its 53 random bits are below this */
  double scale;
  bool f64;
  void* x;        /* the input in the compute dtype, scaled in place */
  uint8_t* mask;
} drop_t;

TPU_ISA_CLONES static tpu_status_t dropout_chunk(void* arg, int64_t b, int64_t e, int tid) {
  (void)tid;
  const drop_t* D = arg;
  uint32_t ws[4][FILL_PIECE + 8];
  for (int64_t i0 = b; i0 < e; i0 += FILL_PIECE) {
    int64_t len = e - i0 < FILL_PIECE ? e - i0 : FILL_PIECE;
    block_words(D->seed, i0, len, ws);
    for (int64_t t = 0; t < len; ++t) D->mask[i0 + t] = fires(ws[0][t], ws[1][t], D->below);
  }
  /* input * mask * scale, as CPU computes it: 0 * inf stays NaN */
  if (D->f64) {
    double* d = D->x;
    for (int64_t i = b; i < e; ++i) d[i] = d[i] * D->mask[i] * D->scale;
  } else {
    float* f = D->x;
    float scale = (float)D->scale;
    for (int64_t i = b; i < e; ++i) f[i] = f[i] * (float)D->mask[i] * scale;
  }
  return NULL;
}

static tpu_status_t k_dropout(tpu_node_t* n) {
  tpu_operand_t *o = &n->out[0], *m = &n->out[1];
  int64_t numel = tpu__operand_numel(o);
  if (numel == 0) return NULL;
  tpu_dtype_t c = n->compute;
  void* x = tpu__pack_alloc(&n->in[0], c);
  uint8_t* mask = dense_alloc(numel, 1);
  if (!x || !mask) { tpu__free(x); tpu__free(mask); return TPU_HOST_NOMEM(); }
  tpu_status_t st = NULL;
  if (!n->ia[1]) {
    memset(mask, 1, (size_t)numel);
  } else {
    drop_t D = {(uint64_t)n->ia[0], below_53(n->da[0]), n->da[1], c == TPU_DTYPE_F64, x, mask};
    st = tpu__parallel_for(numel, FILL_GRAIN, dropout_chunk, &D);
  }
  if (!st) {
    tpu__unpack(o, x, c);
    tpu__unpack(m, mask, TPU_DTYPE_BOOL);
  }
  tpu__free(x);
  tpu__free(mask);
  return st;
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
