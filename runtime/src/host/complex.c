/* Complex kernels of the host driver: elementwise arithmetic in the tile engine with a
 * complex compute dtype, and the FFTs.
 *
 * Elementwise: tiles hold interleaved (re, im) pairs of float (complex64) or double
 * (complex128). Products, quotients and magnitudes of complex64 values are formed in
 * double and rounded once, so they are within half an ulp of exact per part.
 *
 * FFT: every transform runs in double precision on a dense complex128 work array of the
 * full signal shape, one dim at a time: each line along the dim is gathered, transformed
 * (iterative radix-2 for powers of two; mixed-radix Cooley-Tukey with radix-4/2 butterflies
 * and direct DFTs of the odd prime factors when those are at most 64; otherwise
 * Bluestein's chirp-z algorithm, a convolution done with power-of-two FFTs)
 * and scattered back. Lines are split over the pool. The result is scaled once and
 * stored in the output dtype. */
#include <math.h>

#include "host/host.h"

/* ---- elementwise tiles ------------------------------------------------------------------- */

/* name_c64 / name_c128 from one body on doubles a + bi (x) and c + di (y, 0 if absent),
 * giving re + i im; the output is stored in the element type T. */
#define CTILE_T(name, SFX, T, BODY)                                                        \
  static void name##_##SFX(int64_t n, void* out, const void* const* in, const tpu_node_t* node) { \
    T* o = out;                                                                            \
    const T* x = in[0];                                                                    \
    const T* y = node->n_in > 1 ? in[1] : NULL;                                            \
    for (int64_t i = 0; i < n; ++i) {                                                      \
      double a = x[2 * i], b = x[2 * i + 1], c = y ? y[2 * i] : 0, d = y ? y[2 * i + 1] : 0; \
      double re, im;                                                                       \
      (void)b; (void)c; (void)d;                                                           \
      BODY;                                                                                \
      o[2 * i] = (T)re;                                                                    \
      o[2 * i + 1] = (T)im;                                                                \
    }                                                                                      \
  }
#define CTILE(name, BODY) CTILE_T(name, c64, float, BODY) CTILE_T(name, c128, double, BODY)

/* Smith's algorithm: no overflow of c*c + d*d for large denominators. */
static inline void cdiv(double a, double b, double c, double d, double* re, double* im) {
  if (fabs(c) >= fabs(d)) {
    if (c == 0 && d == 0) { *re = a / fabs(c); *im = b / fabs(c); return; }
    double r = d / c, den = c + d * r;
    *re = (a + b * r) / den;
    *im = (b - a * r) / den;
  } else {
    double r = c / d, den = c * r + d;
    *re = (a * r + b) / den;
    *im = (b * r - a) / den;
  }
}

CTILE(ident, { re = a; im = b; })
CTILE(add, { re = a + node->da[0] * c - node->da[1] * d; im = b + node->da[0] * d + node->da[1] * c; })
CTILE(sub, { re = a - (node->da[0] * c - node->da[1] * d); im = b - (node->da[0] * d + node->da[1] * c); })
CTILE(mul, { re = a * c - b * d; im = a * d + b * c; })
CTILE(div, { cdiv(a, b, c, d, &re, &im); })
CTILE(neg, { re = -a; im = -b; })
CTILE(conj, { re = a; im = -b; })
CTILE(sgn, {
  double m = hypot(a, b);
  if (m == 0) { re = 0; im = 0; } else { re = a / m; im = b / m; }
})
CTILE(abs, { re = hypot(a, b); im = 0; })
CTILE(angle, {
  if (node->ia[0]) re = isnan(a) ? a : a < 0 ? 3.14159265358979323846 : 0.0;
  else re = atan2(b, a);
  im = 0;
})
CTILE(polar, { re = a * cos(c); im = a * sin(c); })
CTILE(complex, { re = a; im = c; })

/* add/sub with alpha 1 and no imaginary part: the plain sums, as the CPU computes them
 * in the part dtype (a double-precision alpha product would differ in the last bit). */
static void add1_c64(int64_t n, void* out, const void* const* in, const tpu_node_t* node) {
  float* o = out;
  const float *x = in[0], *y = in[1];
  if (node->kind == TPU_KIND_C_SUB) for (int64_t i = 0; i < 2 * n; ++i) o[i] = x[i] - y[i];
  else for (int64_t i = 0; i < 2 * n; ++i) o[i] = x[i] + y[i];
}
static void add1_c128(int64_t n, void* out, const void* const* in, const tpu_node_t* node) {
  double* o = out;
  const double *x = in[0], *y = in[1];
  if (node->kind == TPU_KIND_C_SUB) for (int64_t i = 0; i < 2 * n; ++i) o[i] = x[i] - y[i];
  else for (int64_t i = 0; i < 2 * n; ++i) o[i] = x[i] + y[i];
}

static tpu_status_t run_ctile(tpu_node_t* n) {
  tpu_tile_fn fn = NULL;
  bool c64 = n->compute == TPU_DTYPE_C64;
#define PICK(K, name) case TPU_KIND_##K: fn = c64 ? name##_c64 : name##_c128; break;
  switch (n->kind) {
    PICK(C_IDENT, ident) PICK(C_ADD, add) PICK(C_SUB, sub) PICK(C_MUL, mul) PICK(C_DIV, div)
    PICK(C_NEG, neg) PICK(C_CONJ, conj) PICK(C_SGN, sgn) PICK(C_ABS, abs) PICK(C_ANGLE, angle)
    PICK(C_POLAR, polar) PICK(C_COMPLEX, complex)
    default: return tpu_status_make(TPU_INTERNAL, "complex kernel for kind %s", tpu__kind_name(n->kind));
  }
#undef PICK
  if ((n->kind == TPU_KIND_C_ADD || n->kind == TPU_KIND_C_SUB) && n->da[0] == 1.0 && n->da[1] == 0.0)
    fn = c64 ? add1_c64 : add1_c128;
  if (n->compute != TPU_DTYPE_C64 && n->compute != TPU_DTYPE_C128)
    return tpu_status_make(TPU_INTERNAL, "%s: complex kernel with compute dtype %s", tpu__node_describe(n),
                           tpu_dtype_name(n->compute));
  return tpu__tile_run(n, n->compute, fn);
}

/* ---- 1-D transforms (double precision, interleaved complex) ----------------------------- */

typedef struct fft1_s {
  int64_t n;
  int sign;       /* -1 forward, +1 backward */
  int kind;       /* 0 radix-2, 1 mixed radix, 2 Bluestein */
  double* tw;     /* radix-2: n/2 twiddles exp(sign 2 pi i k / n); mixed radix: n of them */
  int nf;         /* mixed radix: the factors of n (4s, 2, then odd primes <= MAX_PRIME) */
  int64_t fac[64];
  int64_t max_fac;
  int64_t m;      /* Bluestein: the power-of-two convolution length */
  double* chirp;  /* Bluestein: n values exp(sign pi i k^2 / n) */
  double* bf;     /* Bluestein: FFT (forward, length m) of the conjugate chirp sequence */
  struct fft1_s* sub_fwd; /* Bluestein: radix-2 plans of length m */
  struct fft1_s* sub_bwd;
} fft1_t;

/* Mixed radix is used when every prime factor of n is at most this; each factor p costs
 * p operations per element, so a larger prime goes to Bluestein instead. */
#define MAX_PRIME 64

static void fft1_free(fft1_t* p) {
  if (!p) return;
  tpu__free(p->tw);
  tpu__free(p->chirp);
  tpu__free(p->bf);
  fft1_free(p->sub_fwd);
  fft1_free(p->sub_bwd);
  tpu__free(p);
}

static void radix2(const fft1_t* p, double* x) {
  int64_t n = p->n;
  for (int64_t i = 1, j = 0; i < n; ++i) { /* bit reversal */
    int64_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j |= bit;
    if (i < j) {
      double t0 = x[2 * i], t1 = x[2 * i + 1];
      x[2 * i] = x[2 * j]; x[2 * i + 1] = x[2 * j + 1];
      x[2 * j] = t0; x[2 * j + 1] = t1;
    }
  }
  for (int64_t len = 2; len <= n; len <<= 1) {
    int64_t half = len >> 1, step = n / len;
    for (int64_t s = 0; s < n; s += len)
      for (int64_t k = 0; k < half; ++k) {
        double wr = p->tw[2 * k * step], wi = p->tw[2 * k * step + 1];
        double* u = x + 2 * (s + k);
        double* v = x + 2 * (s + k + half);
        double vr = v[0] * wr - v[1] * wi, vi = v[0] * wi + v[1] * wr;
        v[0] = u[0] - vr; v[1] = u[1] - vi;
        u[0] += vr; u[1] += vi;
      }
  }
}

/* Mixed-radix decimation in time: the n-point transform of in[0], in[stride], ... into
 * out[0..n) from P transforms of length n / P of the decimated sequences (written to
 * out's P blocks), combined by one P-point DFT per output index, with twiddles
 * W_n^(r k). f indexes the plan's factor list; t holds 2 * max_fac doubles. */
static void mixed(const fft1_t* p, const double* in, int64_t stride, double* out, int64_t n, int f, double* t) {
  if (n == 1) { out[0] = in[0]; out[1] = in[1]; return; }
  const int64_t P = p->fac[f], m = n / P, N = p->n, tws = N / n;
  for (int64_t r = 0; r < P; ++r) mixed(p, in + 2 * r * stride, stride * P, out + 2 * r * m, m, f + 1, t);
  const double* tw = p->tw;
  for (int64_t k = 0; k < m; ++k) {
    for (int64_t r = 0; r < P; ++r) { /* t_r = out[r m + k] W_n^(r k) */
      const double* o = out + 2 * (r * m + k);
      int64_t e = r * k * tws;
      double wr = tw[2 * e], wi = tw[2 * e + 1];
      t[2 * r] = o[0] * wr - o[1] * wi;
      t[2 * r + 1] = o[0] * wi + o[1] * wr;
    }
    if (P == 2) {
      double* a = out + 2 * k;
      double* b = out + 2 * (k + m);
      a[0] = t[0] + t[2]; a[1] = t[1] + t[3];
      b[0] = t[0] - t[2]; b[1] = t[1] - t[3];
    } else if (P == 4) { /* W_4 = sign i */
      double s0r = t[0] + t[4], s0i = t[1] + t[5], d0r = t[0] - t[4], d0i = t[1] - t[5];
      double s1r = t[2] + t[6], s1i = t[3] + t[7], d1r = t[2] - t[6], d1i = t[3] - t[7];
      double jr = -p->sign * d1i, ji = p->sign * d1r; /* sign i (t1 - t3) */
      double* x0 = out + 2 * k;
      double* x1 = out + 2 * (k + m);
      double* x2 = out + 2 * (k + 2 * m);
      double* x3 = out + 2 * (k + 3 * m);
      x0[0] = s0r + s1r; x0[1] = s0i + s1i;
      x2[0] = s0r - s1r; x2[1] = s0i - s1i;
      x1[0] = d0r + jr; x1[1] = d0i + ji;
      x3[0] = d0r - jr; x3[1] = d0i - ji;
    } else {
      const int64_t wp = N / P; /* W_P^j = W_N^(j N / P) */
      for (int64_t q = 0; q < P; ++q) {
        double sr = 0, si = 0;
        for (int64_t r = 0, e = 0; r < P; ++r, e = e + q < P ? e + q : e + q - P) {
          double wr = tw[2 * e * wp], wi = tw[2 * e * wp + 1];
          sr += t[2 * r] * wr - t[2 * r + 1] * wi;
          si += t[2 * r] * wi + t[2 * r + 1] * wr;
        }
        out[2 * (k + q * m)] = sr;
        out[2 * (k + q * m) + 1] = si;
      }
    }
  }
}

static bool is_pow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

/* exp(sign * i * pi * num / den) with num reduced modulo 2 den for accuracy. */
static void unit(int sign, int64_t num, int64_t den, double* re, double* im) {
  num %= 2 * den;
  double t = 3.14159265358979323846 * (double)num / (double)den;
  *re = cos(t);
  *im = sign * sin(t);
}

/* Factors n into 4s, a 2, then odd primes; false when a prime factor exceeds MAX_PRIME. */
static bool factor(fft1_t* p, int64_t n) {
  p->nf = 0;
  p->max_fac = 1;
  while (n % 4 == 0 && n > 4) { p->fac[p->nf++] = 4; n /= 4; }
  for (int64_t d = 2; n > 1; d = d == 2 ? 3 : d + 2) {
    if (d > MAX_PRIME) return false;
    while (n % d == 0) {
      if (p->nf == 64) return false;
      p->fac[p->nf++] = d;
      n /= d;
    }
  }
  for (int i = 0; i < p->nf; ++i) if (p->fac[i] > p->max_fac) p->max_fac = p->fac[i];
  return true;
}

static fft1_t* fft1_plan(int64_t n, int sign) {
  fft1_t* p = tpu__calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n;
  p->sign = sign;
  if (is_pow2(n)) {
    p->kind = 0;
    p->tw = tpu__malloc(sizeof(double) * 2 * (size_t)(n / 2 + 1));
    if (!p->tw) { fft1_free(p); return NULL; }
    for (int64_t k = 0; k < n / 2; ++k) unit(sign, 2 * k, n, &p->tw[2 * k], &p->tw[2 * k + 1]);
    return p;
  }
  if (factor(p, n)) {
    p->kind = 1;
    p->tw = tpu__malloc(sizeof(double) * 2 * (size_t)n);
    if (!p->tw) { fft1_free(p); return NULL; }
    for (int64_t k = 0; k < n; ++k) unit(sign, 2 * k, n, &p->tw[2 * k], &p->tw[2 * k + 1]);
    return p;
  }
  /* Bluestein: X_k = w_k sum_j (x_j w_j) conj(w_{k-j}), w_k = exp(sign i pi k^2 / n). */
  p->kind = 2;
  int64_t m = 1;
  while (m < 2 * n - 1) m <<= 1;
  p->m = m;
  p->chirp = tpu__malloc(sizeof(double) * 2 * (size_t)n);
  p->bf = tpu__calloc((size_t)m, sizeof(double) * 2);
  p->sub_fwd = fft1_plan(m, -1);
  p->sub_bwd = fft1_plan(m, +1);
  if (!p->chirp || !p->bf || !p->sub_fwd || !p->sub_bwd) { fft1_free(p); return NULL; }
  for (int64_t k = 0; k < n; ++k) {
    /* k^2 mod 2n without overflow for any n that fits in memory */
    int64_t k2 = (int64_t)(((__int128)k * k) % (2 * n));
    unit(sign, k2, n, &p->chirp[2 * k], &p->chirp[2 * k + 1]);
  }
  for (int64_t k = 0; k < n; ++k) {
    double cr = p->chirp[2 * k], ci = -p->chirp[2 * k + 1];
    p->bf[2 * k] = cr; p->bf[2 * k + 1] = ci;
    if (k) { p->bf[2 * (m - k)] = cr; p->bf[2 * (m - k) + 1] = ci; }
  }
  radix2(p->sub_fwd, p->bf);
  return p;
}

/* Scratch a plan needs per thread (doubles). */
static int64_t fft1_scratch(const fft1_t* p) {
  return p->kind == 0 ? 0 : p->kind == 1 ? 2 * p->n + 2 * p->max_fac : 2 * p->m;
}

/* Unnormalized transform of the n complex values at x, in place. */
static void fft1_run(const fft1_t* p, double* x, double* scratch) {
  int64_t n = p->n;
  if (p->kind == 0) { radix2(p, x); return; }
  if (p->kind == 1) {
    memcpy(scratch, x, sizeof(double) * 2 * (size_t)n);
    mixed(p, scratch, 1, x, n, 0, scratch + 2 * n);
    return;
  }
  int64_t m = p->m;
  double* a = scratch;
  memset(a, 0, sizeof(double) * 2 * (size_t)m);
  for (int64_t k = 0; k < n; ++k) {
    double cr = p->chirp[2 * k], ci = p->chirp[2 * k + 1];
    a[2 * k] = x[2 * k] * cr - x[2 * k + 1] * ci;
    a[2 * k + 1] = x[2 * k] * ci + x[2 * k + 1] * cr;
  }
  radix2(p->sub_fwd, a);
  for (int64_t k = 0; k < m; ++k) {
    double ar = a[2 * k], ai = a[2 * k + 1], br = p->bf[2 * k], bi = p->bf[2 * k + 1];
    a[2 * k] = ar * br - ai * bi;
    a[2 * k + 1] = ar * bi + ai * br;
  }
  radix2(p->sub_bwd, a);
  double inv = 1.0 / (double)m;
  for (int64_t k = 0; k < n; ++k) {
    double cr = p->chirp[2 * k], ci = p->chirp[2 * k + 1];
    double ar = a[2 * k] * inv, ai = a[2 * k + 1] * inv;
    x[2 * k] = ar * cr - ai * ci;
    x[2 * k + 1] = ar * ci + ai * cr;
  }
}

/* ---- transforms along one dim of a dense complex128 array ------------------------------- */

typedef struct lines_s {
  double* data;      /* dense row-major complex128 array */
  int64_t n, stride; /* length and element stride of a line */
  int64_t inner;     /* product of the sizes after the dim (== stride) */
  const fft1_t* plan;
  /* c2r expansion: src is a dense half-spectrum array whose line has nh elements; each
   * line of data is filled from it with Hermitian symmetry before the transform. */
  const double* half;
  int64_t nh;
} lines_t;

static tpu_status_t lines_chunk(void* arg, int64_t b, int64_t e, int tid) {
  const lines_t* L = arg;
  int64_t n = L->n;
  double* buf = tpu__malloc(sizeof(double) * (size_t)(2 * n + fft1_scratch(L->plan)));
  if (!buf) return TPU_HOST_NOMEM();
  double* scratch = buf + 2 * n;
  for (int64_t l = b; l < e; ++l) {
    int64_t outer = l / L->inner, in = l % L->inner;
    double* base = L->data + 2 * (outer * n * L->stride + in);
    if (L->half) {
      const double* h = L->half + 2 * (outer * L->nh * L->stride + in);
      for (int64_t k = 0; k < n; ++k) {
        int64_t src = k < L->nh ? k : n - k;
        buf[2 * k] = h[2 * src * L->stride];
        buf[2 * k + 1] = k < L->nh ? h[2 * src * L->stride + 1] : -h[2 * src * L->stride + 1];
      }
    } else {
      for (int64_t k = 0; k < n; ++k) {
        buf[2 * k] = base[2 * k * L->stride];
        buf[2 * k + 1] = base[2 * k * L->stride + 1];
      }
    }
    fft1_run(L->plan, buf, scratch);
    for (int64_t k = 0; k < n; ++k) {
      base[2 * k * L->stride] = buf[2 * k];
      base[2 * k * L->stride + 1] = buf[2 * k + 1];
    }
  }
  tpu__free(buf);
  return NULL;
}

/* Transforms every line along dim d of data (shape[nd]); with half != NULL the lines are
 * first filled from the half spectrum (its dim d has nh elements). */
static tpu_status_t transform_dim(double* data, const int64_t* shape, int nd, int d, int sign,
                                  const double* half, int64_t nh) {
  int64_t n = shape[d], inner = 1, numel = 1;
  for (int k = d + 1; k < nd; ++k) inner *= shape[k];
  for (int k = 0; k < nd; ++k) numel *= shape[k];
  if (numel == 0) return NULL;
  if (n == 1 && !half) return NULL;
  fft1_t* plan = fft1_plan(n, sign);
  if (!plan) return TPU_HOST_NOMEM();
  lines_t L = {data, n, inner, inner, plan, half, nh};
  int64_t lines = numel / n;
  int64_t work = numel * (int64_t)(log2((double)n) + 2);
  int64_t grain = TPU_PARALLEL_MIN_WORK / (n * 8) + 1;
  tpu_status_t st = work < TPU_PARALLEL_MIN_WORK ? lines_chunk(&L, 0, lines, 0)
                                                 : tpu__parallel_for(lines, grain, lines_chunk, &L);
  fft1_free(plan);
  return st;
}

/* Keeps the first h elements of dim d of a dense array (in place, front to back). */
static void narrow_dense(double* data, const int64_t* shape, int nd, int d, int64_t h) {
  int64_t outer = 1, inner = 1, n = shape[d];
  for (int k = 0; k < d; ++k) outer *= shape[k];
  for (int k = d + 1; k < nd; ++k) inner *= shape[k];
  for (int64_t o = 0; o < outer; ++o)
    memmove(data + 2 * o * h * inner, data + 2 * o * n * inner, sizeof(double) * 2 * (size_t)(h * inner));
}

static double norm_scale(int64_t mode, double n) {
  return mode == 1 ? 1.0 / sqrt(n) : mode == 2 ? 1.0 / n : 1.0;
}

static void scale(double* data, int64_t count, double s) {
  if (s != 1.0)
    for (int64_t i = 0; i < 2 * count; ++i) data[i] *= s;
}

static double* alloc_c128(int64_t numel) {
  uint64_t bytes;
  if (!tpu__mul_ok((uint64_t)(numel > 0 ? numel : 1), 16, &bytes)) return NULL;
  return tpu__malloc(bytes);
}

static tpu_status_t fft_kernel(tpu_node_t* node) {
  const tpu_operand_t* x = &node->in[0];
  tpu_operand_t* out = &node->out[0];
  int nd = x->ndim, nf = node->ilist_len;
  const int64_t* dims = node->ilist;
  int last = (int)dims[nf - 1];
  int64_t shape[TPU_MAX_DIMS];
  memcpy(shape, x->sizes, sizeof(int64_t) * (size_t)nd);
  int64_t numel = tpu__operand_numel(x);
  double* w = alloc_c128(numel);
  if (!w) return TPU_HOST_NOMEM();
  tpu__pack(x, NULL, TPU_DTYPE_C128, w); /* a real input becomes (x, 0) */
  tpu_status_t st = NULL;
  double points = 1;
  if (node->kind == TPU_KIND_FFT_C2R) {
    int64_t n = node->ia[2], nh = n / 2 + 1;
    if (shape[last] != nh) { narrow_dense(w, shape, nd, last, nh); shape[last] = nh; }
    for (int k = 0; k < nf - 1 && !st; ++k) {
      st = transform_dim(w, shape, nd, (int)dims[k], +1, NULL, 0);
      points *= (double)shape[dims[k]];
    }
    int64_t full[TPU_MAX_DIMS];
    memcpy(full, shape, sizeof full);
    full[last] = n;
    double* f = st ? NULL : alloc_c128(tpu__operand_numel(out));
    if (!st && !f) st = TPU_HOST_NOMEM();
    if (!st) st = transform_dim(f, full, nd, last, +1, w, nh);
    tpu__free(w);
    w = f;
    points *= (double)n;
    memcpy(shape, full, sizeof full);
  } else {
    int sign = node->kind == TPU_KIND_FFT_C2C && !node->ia[1] ? +1 : -1;
    for (int k = 0; k < nf && !st; ++k) {
      st = transform_dim(w, shape, nd, (int)dims[k], sign, NULL, 0);
      points *= (double)shape[dims[k]];
    }
    if (!st && node->kind == TPU_KIND_FFT_R2C && node->ia[1]) {
      narrow_dense(w, shape, nd, last, shape[last] / 2 + 1);
      shape[last] = shape[last] / 2 + 1;
    }
  }
  if (!st) {
    scale(w, tpu__operand_numel(out), norm_scale(node->ia[0], points));
    tpu__unpack(out, w, TPU_DTYPE_C128); /* a real output keeps the real parts */
  }
  tpu__free(w);
  return st;
}

/* Sums in double, in row-major order of the input, then one rounding to the output. */
static tpu_status_t sum_kernel(tpu_node_t* node) {
  const tpu_operand_t* x = &node->in[0];
  tpu_operand_t* out = &node->out[0];
  int64_t numel = tpu__operand_numel(x), on = tpu__operand_numel(out);
  double* w = alloc_c128(numel);
  double* acc = tpu__calloc((size_t)(on > 0 ? on : 1), sizeof(double) * 2);
  if (!w || !acc) { tpu__free(w); tpu__free(acc); return TPU_HOST_NOMEM(); }
  tpu__pack(x, NULL, TPU_DTYPE_C128, w);
  int nd = x->ndim;
  int64_t ost[TPU_MAX_DIMS], s = 1; /* output stride of each input dim (0: reduced) */
  for (int d = nd - 1; d >= 0; --d) {
    ost[d] = node->ilist[d] ? 0 : s;
    if (!node->ilist[d]) s *= x->sizes[d];
  }
  int64_t idx[TPU_MAX_DIMS] = {0}, o = 0;
  for (int64_t i = 0; i < numel; ++i) {
    acc[2 * o] += w[2 * i];
    acc[2 * o + 1] += w[2 * i + 1];
    for (int d = nd - 1; d >= 0; --d) {
      o += ost[d];
      if (++idx[d] < x->sizes[d]) break;
      o -= ost[d] * x->sizes[d];
      idx[d] = 0;
    }
  }
  if (node->ia[0]) scale(acc, on, on ? (double)on / (double)numel : 1.0); /* mean: 0/0 is NaN below */
  if (node->ia[0] && numel == 0)
    for (int64_t i = 0; i < 2 * on; ++i) acc[i] = NAN;
  tpu__unpack(out, acc, TPU_DTYPE_C128);
  tpu__free(w);
  tpu__free(acc);
  return NULL;
}

void tpu__host_register_complex(tpu_host_kernel_fn* table) {
  tpu_kind_t ew[] = {TPU_KIND_C_IDENT, TPU_KIND_C_ADD, TPU_KIND_C_SUB, TPU_KIND_C_MUL, TPU_KIND_C_DIV,
                     TPU_KIND_C_NEG, TPU_KIND_C_CONJ, TPU_KIND_C_SGN, TPU_KIND_C_ABS, TPU_KIND_C_ANGLE,
                     TPU_KIND_C_POLAR, TPU_KIND_C_COMPLEX};
  for (size_t i = 0; i < sizeof ew / sizeof *ew; ++i) table[ew[i]] = run_ctile;
  table[TPU_KIND_C_SUM] = sum_kernel;
  table[TPU_KIND_FFT_R2C] = fft_kernel;
  table[TPU_KIND_FFT_C2C] = fft_kernel;
  table[TPU_KIND_FFT_C2R] = fft_kernel;
}
