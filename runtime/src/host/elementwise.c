/* Elementwise kernels of the host driver: tile functions per op kind and compute dtype.
 * Inputs arrive as dense tiles in node->compute. Parameters: p0..p3 are da[0..3] in the
 * float kernels and ia[0..3] in the integer ones (builders fill both). */
#include <tgmath.h>

#include "host/host.h"
#include "host/vmath.h"

#define EW_IA_RESULT (TPU_NODE_NUM_IATTR - 1) /* the builders' result dtype slot */

/* Integer division by zero found inside a tile is raised with tpu__tile_fault() (tile
 * functions cannot return a status; tiles may run on pool threads) and turned into the
 * op's error by run_tiles_div. */

/* A tile function reads every input as a tile, except B or C (inputs 1, 2) when the
 * node has a scalar there: that one is read once from the node, in the compute dtype,
 * exactly as a constant tile would hold it. Every tile function here keeps to this
 * (pow, clamp too), so a fused group passes no tile for such an input (host/fuse.c). A loop that
 * loads a constant tile per element ran an optimizer's fused chain 1.2x slower than with
 * the constants in registers (bench/tile_streams.c). */
/* With `streams` (a constant of the function: TILE_FS kernels' float loops) and the tile
 * engine's say-so (tpu__tile_stream), 32 results at a time go through registers (a
 * 128-byte local) to non-temporal stores. */
#define TILE_LOOP(LOAD, EXPR)                                                             \
  if (streams && tpu__tile_stream && ((uintptr_t)r & 15) == 0) {                          \
    int64_t i0 = 0;                                                                       \
    for (; i0 + 32 <= n; i0 += 32) {                                                      \
      T t_[32];                                                                           \
      for (int64_t i = i0; i < i0 + 32; ++i) { LOAD t_[i - i0] = (EXPR); }                \
      for (int q_ = 0; q_ < 32; q_ += 8) {                                                \
        v8f v_;                                                                           \
        memcpy(&v_, t_ + q_, sizeof v_);                                                  \
        tpu__stream8_f32((float*)(void*)(r + i0 + q_), v_);                               \
      }                                                                                   \
    }                                                                                     \
    for (int64_t i = i0; i < n; ++i) { LOAD r[i] = (EXPR); }                              \
  } else                                                                                  \
    for (int64_t i = 0; i < n; ++i) { LOAD r[i] = (EXPR); }
#define TILE_BODY(T, PSRC, SV, AR, EXPR)                                                  \
  {                                                                                       \
    T* r = o;                                                                             \
    const T* A = in[0]; const T* B = in[1]; const T* C = in[2];                           \
    const T p0 = (T)nd->PSRC[0], p1 = (T)nd->PSRC[1], p2 = (T)nd->PSRC[2], p3 = (T)nd->PSRC[3]; \
    (void)A; (void)B; (void)C; (void)p0; (void)p1; (void)p2; (void)p3;                     \
    TILE_LOOPS##AR(T, SV, EXPR)                                                           \
  }
#define TILE_LOOPS1(T, SV, EXPR) TILE_LOOP(LOAD1, EXPR)
#define TILE_LOOPS2(T, SV, EXPR)                                                          \
  if (nd->n_in > 1 && nd->in[1].is_scalar) { const T bs = (T)nd->in[1].SV; TILE_LOOP(LOAD2_B, EXPR) } \
  else TILE_LOOP(LOAD2, EXPR)
#define TILE_LOOPS3(T, SV, EXPR)                                                          \
  {                                                                                       \
    bool sb = nd->n_in > 1 && nd->in[1].is_scalar, sc = nd->n_in > 2 && nd->in[2].is_scalar; \
    const T bs = sb ? (T)nd->in[1].SV : 0, cs = sc ? (T)nd->in[2].SV : 0;                 \
    (void)bs; (void)cs;                                                                   \
    switch (sb + 2 * sc) {                                                                \
      case 1: TILE_LOOP(LOAD3_B, EXPR) break;                                             \
      case 2: TILE_LOOP(LOAD3_C, EXPR) break;                                             \
      case 3: TILE_LOOP(LOAD3_BC, EXPR) break;                                            \
      default: TILE_LOOP(LOAD3, EXPR)                                                     \
    }                                                                                     \
  }
#define LOAD1 T a = A[i]; (void)a;
#define LOAD2 T a = A[i]; T b = B[i]; (void)a; (void)b;
#define LOAD2_B T a = A[i]; T b = bs; (void)a; (void)b;
#define LOAD3 T a = A[i]; T b = B[i]; T c = C[i]; (void)a; (void)b; (void)c;
#define LOAD3_B T a = A[i]; T b = bs; T c = C[i]; (void)a; (void)b; (void)c;
#define LOAD3_C T a = A[i]; T b = B[i]; T c = cs; (void)a; (void)b; (void)c;
#define LOAD3_BC T a = A[i]; T b = bs; T c = cs; (void)a; (void)b; (void)c;

/* name_f32 / name_f64 from one floating expression; name_i64 from an integer one.
 * TILE_FS / TILE_FIS: a memory-bound kernel, whose float32 loop streams large outputs
 * (TILE_LOOP). 16M f32 on 2 AVX2 cores, ns per element, ordinary -> streaming stores:
 * neg 0.41-0.51 -> 0.29-0.36, x * 1.5 0.43-0.47 -> 0.29-0.33, relu 0.38-0.49 -> 0.29-0.33,
 * add 0.54-0.64 -> 0.43-0.53. Kernels bound by their arithmetic keep ordinary stores:
 * gelu, tanh and sigmoid ran 0-15% slower streaming, exp no faster. Rechecked for gelu
 * on the AVX-512 Zen 4 (16M f32, builds alternated three times): 12.0-12.3 GB/s with
 * ordinary stores against 9.7-9.8 streaming at one thread, 24.1-24.7 against 18.8-19.0
 * at two. */
#define TILE_F_(name, AR, EXPR, S)                                                        \
  TPU_ISA_CLONES static void name##_f32(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    typedef float T; enum { streams = S }; TILE_BODY(float, da, scalar_d, AR, EXPR)       \
  }                                                                                       \
  static void name##_f64(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    typedef double T; enum { streams = 0 }; TILE_BODY(double, da, scalar_d, AR, EXPR)     \
  }
#define TILE_F(name, AR, EXPR) TILE_F_(name, AR, EXPR, 0)
#define TILE_FS(name, AR, EXPR) TILE_F_(name, AR, EXPR, 1)
#define TILE_I(name, AR, EXPR)                                                            \
  static void name##_i64(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    typedef int64_t T; enum { streams = 0 }; TILE_BODY(int64_t, ia, scalar_i, AR, EXPR)   \
  }
#define TILE_FI(name, AR, EXPR_F, EXPR_I) TILE_F(name, AR, EXPR_F) TILE_I(name, AR, EXPR_I)
#define TILE_FIS(name, AR, EXPR_F, EXPR_I) TILE_FS(name, AR, EXPR_F) TILE_I(name, AR, EXPR_I)

/* Wrapping integer arithmetic, as PyTorch's CPU kernels behave on overflow. */
#define UADD(x, y) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define USUB(x, y) ((int64_t)((uint64_t)(x) - (uint64_t)(y)))
#define UMUL(x, y) ((int64_t)((uint64_t)(x) * (uint64_t)(y)))

/* ---- scalar helpers ---------------------------------------------------------------- */

static inline int64_t idiv_trunc(int64_t a, int64_t b) {
  if (b == 0) { tpu__tile_fault(); return 0; }
  if (b == -1) return USUB(0, a); /* INT64_MIN / -1 traps on x86 */
  return a / b;
}
static inline int64_t imod_trunc(int64_t a, int64_t b) {
  if (b == 0) { tpu__tile_fault(); return 0; }
  if (b == -1) return 0;
  return a % b;
}
static inline int64_t idiv_floor(int64_t a, int64_t b) {
  int64_t q = idiv_trunc(a, b), r = imod_trunc(a, b);
  return r != 0 && ((r < 0) != (b < 0)) ? q - 1 : q;
}
static inline int64_t imod_floor(int64_t a, int64_t b) {
  int64_t r = imod_trunc(a, b);
  return r != 0 && ((r < 0) != (b < 0)) ? r + b : r;
}
static inline int64_t ipow(int64_t a, int64_t b) {
  if (b < 0) {
    if (a == 1) return 1;
    if (a == -1) return (b & 1) ? -1 : 1;
    return 0;
  }
  uint64_t r = 1, x = (uint64_t)a;
  while (b) {
    if (b & 1) r *= x;
    x *= x;
    b >>= 1;
  }
  return (int64_t)r;
}

/* Python-style floor division of floats, with the rounding fix-ups that make
 * a == b * q + remainder hold closely, as PyTorch's div_floor does. */
#define FDIV_FLOOR(T, SFX)                                                                \
  static inline T fdiv_floor_##SFX(T a, T b) {                                           \
    if (b == 0) return a / b;                                                             \
    T m = fmod(a, b);                                                                     \
    T d = (a - m) / b;                                                                    \
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;                                           \
    T q;                                                                                  \
    if (d != 0) { q = floor(d); if (d - q > (T)0.5) q += 1; }                             \
    else q = copysign((T)0, a / b);                                                       \
    return q;                                                                             \
  }                                                                                       \
  static inline T fmod_floor_##SFX(T a, T b) {                                           \
    T m = fmod(a, b);                                                                     \
    if (m != 0 && ((b < 0) != (m < 0))) m += b;                                           \
    return m;                                                                             \
  }
FDIV_FLOOR(float, f32)
FDIV_FLOOR(double, f64)
#define FDIV_FLOOR_T(a, b) (sizeof(T) == 4 ? (T)fdiv_floor_f32((float)(a), (float)(b)) : (T)fdiv_floor_f64((a), (b)))
#define FMOD_FLOOR_T(a, b) (sizeof(T) == 4 ? (T)fmod_floor_f32((float)(a), (float)(b)) : (T)fmod_floor_f64((a), (b)))

/* erfinv: a closed-form first guess (relative error ~1e-3) refined by Newton steps on
 * erf, computed in double for both float widths. */
static double erfinv_d(double y) {
  if (isnan(y) || y < -1 || y > 1) return NAN;
  if (y == 1) return INFINITY;
  if (y == -1) return -INFINITY;
  const double k = 0.147, two_pi_k = 2.0 / (3.14159265358979323846 * 0.147);
  double l = log1p(-y * y);
  double t = two_pi_k + 0.5 * l;
  double x = sqrt(sqrt(t * t - l / k) - t);
  x = y < 0 ? -x : x;
  const double two_over_sqrt_pi = 1.1283791670955126;
  for (int it = 0; it < 4; ++it) {
    double err = erf(x) - y;
    double dx = err / (two_over_sqrt_pi * exp(-x * x));
    if (!isfinite(dx)) break;
    x -= dx;
  }
  return x;
}

#define SIGMOID(a) ((T)1 / ((T)1 + TPU_VEXP(-(a))))
static inline double gelu_d(double x) { return x * 0.5 * (1.0 + erf(x * 0.70710678118654752440)); }
static inline double gelu_grad_d(double x) {
  return 0.5 * (1.0 + erf(x * 0.70710678118654752440)) + x * 0.39894228040143267794 * exp(-0.5 * x * x);
}
#define GELU(x) _Generic((x), float: tpu__vgeluf, default: gelu_d)(x)
#define GELU_GRAD(x) _Generic((x), float: tpu__vgelu_gradf, default: gelu_grad_d)(x)
static inline double gelu_tanh_d(double x) {
  return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}
static inline double gelu_tanh_grad_d(double x) {
  double th = tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.79788456080286535588 * (1.0 + 3.0 * 0.044715 * x * x);
}
#define GELU_TANH(x) _Generic((x), float: tpu__vgelu_tanhf, default: gelu_tanh_d)(x)
#define GELU_TANH_GRAD(x) _Generic((x), float: tpu__vgelu_tanh_gradf, default: gelu_tanh_grad_d)(x)
#define RND(a) nearbyint(a)

/* x * y + z with one rounding in T, where CPU's kernel fuses it (vec::fmadd, or a
 * contracted expression): the f32 clones make it vfmadd, the f64 loops call fma(). */
#define FMA_T(x, y, z) _Generic((x), float: __builtin_fmaf, default: __builtin_fma)((x), (y), (z))

/* ---- existing arithmetic and comparisons -------------------------------------------- */
/* a + alpha * b rounds once, as CPU's add kernel (vec::fmadd; sub and rsub add -alpha).
 * With alpha 1 that is a + b. */
TILE_FIS(add, 2, FMA_T(p0, b, a), UADD(a, UMUL(p0, b)))
TILE_FIS(sub, 2, FMA_T(-p0, b, a), USUB(a, UMUL(p0, b)))
TILE_FIS(rsub, 2, FMA_T(-p0, a, b), USUB(b, UMUL(p0, a)))
TILE_FIS(mul, 2, a * b, UMUL(a, b))
TILE_FI(div, 2, a / b, idiv_trunc(a, b))
TILE_FI(eq, 2, a == b, a == b)
TILE_FI(ne, 2, a != b, a != b)
TILE_FI(lt, 2, a < b, a < b)
TILE_FI(le, 2, a <= b, a <= b)
TILE_FI(gt, 2, a > b, a > b)
TILE_FI(ge, 2, a >= b, a >= b)
TILE_FIS(neg, 1, -a, USUB(0, a))
TILE_F(exp, 1, TPU_VEXP(a))
TILE_FIS(fill, 1, a, a)
TILE_FIS(where, 3, a != 0 ? b : c, a != 0 ? b : c)

/* ---- unary ---------------------------------------------------------------------------- */
TILE_FIS(abs, 1, fabs(a), a < 0 ? USUB(0, a) : a)
TILE_F(sqrt, 1, sqrt(a))
TILE_F(rsqrt, 1, (T)1 / sqrt(a))
TILE_F(log, 1, log(a))
TILE_F(log1p, 1, log1p(a))
TILE_F(log2, 1, log2(a))
TILE_F(log10, 1, log10(a))
TILE_F(exp2, 1, exp2(a))
TILE_F(expm1, 1, expm1(a))
TILE_F(sin, 1, sin(a))
TILE_F(cos, 1, cos(a))
TILE_F(tan, 1, tan(a))
TILE_F(tanh, 1, TPU_VTANH(a))
TILE_F(sigmoid, 1, SIGMOID(a))
TILE_FIS(relu, 1, !(a < 0) ? a : 0, a > 0 ? a : 0) /* NaN and -0 pass, as CPU: one compare */
TILE_F(erf, 1, TPU_VERF(a))
TILE_F(erfinv, 1, (T)erfinv_d((double)a))
TILE_F(reciprocal, 1, (T)1 / a)
TILE_FI(floor, 1, floor(a), a)
TILE_FI(ceil, 1, ceil(a), a)
TILE_FI(round, 1, RND(a), a)
TILE_F(round_dec, 1, nd->ia[0] > 0 ? RND(a * p0) / p0 : RND(a / p0) * p0)
TILE_FI(trunc, 1, trunc(a), a)
TILE_FIS(sign, 1, (T)((0 < a) - (a < 0)), (0 < a) - (a < 0))
TILE_F(frac, 1, a - trunc(a))
TILE_F(asin, 1, asin(a))
TILE_F(acos, 1, acos(a))
TILE_F(atan, 1, atan(a))
TILE_F(sinh, 1, sinh(a))
TILE_F(cosh, 1, cosh(a))
TILE_F(asinh, 1, asinh(a))
TILE_F(acosh, 1, acosh(a))
TILE_F(atanh, 1, atanh(a))
TILE_FI(logical_not, 1, a == 0, a == 0)
TILE_I(bitwise_not, 1, ~a)
TILE_FI(isnan, 1, a != a, 0)
TILE_FI(isinf, 1, isinf(a), 0)
TILE_FI(isposinf, 1, a == (T)INFINITY, 0)
TILE_FI(isneginf, 1, a == -(T)INFINITY, 0)
TILE_FI(signbit, 1, signbit(a) != 0, a < 0)
TILE_FI(nan_to_num, 1, a != a ? p0 : a == (T)INFINITY ? p1 : a == -(T)INFINITY ? p2 : a, a)
TILE_F(gelu, 1, GELU(a))
TILE_F(gelu_tanh, 1, GELU_TANH(a))
TILE_F(silu, 1, a / ((T)1 + TPU_VEXP(-a)))
#define CLAMP2(x, lo, hi) ((x) < (lo) ? (lo) : (x)) > (hi) ? (hi) : ((x) < (lo) ? (lo) : (x))
TILE_FIS(hardtanh, 1, (CLAMP2(a, p0, p1)), (CLAMP2(a, p0, p1)))
TILE_FS(leaky_relu, 1, a > 0 ? a : a * p0)
TILE_F(elu, 1, a <= 0 ? (exp(a * p2) - (T)1) * p0 * p1 : a * p1)
TILE_F(softplus, 1, a * p0 > p1 ? a : log1p(exp(a * p0)) / p0)
/* relu6(x + 3), NaN-propagating like PyTorch's min/max */
#define RELU6_3(x) ((x) + (T)3 < 0 ? (T)0 : (x) + (T)3 > (T)6 ? (T)6 : (x) + (T)3)
TILE_F(hardsigmoid, 1, RELU6_3(a) / (T)6)
TILE_F(hardswish, 1, a * RELU6_3(a) / (T)6)
TILE_F(mish, 1, a * tanh(log1p(exp(a))))
TILE_F(logit, 1, p0 < 0 ? log(a / ((T)1 - a))
                        : log((a < p0 ? p0 : a > (T)1 - p0 ? (T)1 - p0 : a) /
                              ((T)1 - (a < p0 ? p0 : a > (T)1 - p0 ? (T)1 - p0 : a))))
TILE_FIS(threshold, 1, a <= p0 ? p1 : a, a <= p0 ? p1 : a)

/* ---- binary ---------------------------------------------------------------------------- */
/* pow with a scalar exponent takes ATen's shortcuts (x*x for 2, sqrt for 0.5, ...), which
 * are both what CPU computes and far faster than pow() per element. */
#define POW_F(T, SFX)                                                                      \
  TPU_ISA_CLONES static void pow_##SFX(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    T* r = o;                                                                              \
    const T* A = in[0];                                                                    \
    const T* B = in[1];                                                                    \
    if (nd->in[1].is_scalar) {                                                             \
      T e = (T)nd->in[1].scalar_d;                                                         \
      tpu_dtype_t res = (tpu_dtype_t)nd->ia[EW_IA_RESULT];                                 \
      if (sizeof(T) == 4 && res == TPU_DTYPE_BF16 && (e == 3 || e == -2)) {                \
        /* ATen's bf16 shortcut runs in BFloat16 vector arithmetic, which rounds x * x     \
         * before the next step (its f16 path calls pow, one rounding) */                  \
        for (int64_t i = 0; i < n; ++i) r[i] = A[i] * A[i];                                \
        tpu__round_f32_run((float*)r, n, res);                                             \
        if (e == 3) for (int64_t i = 0; i < n; ++i) r[i] *= A[i];                          \
        else for (int64_t i = 0; i < n; ++i) r[i] = (T)1 / r[i];                           \
        return;                                                                            \
      }                                                                                    \
      if (e == 2) { for (int64_t i = 0; i < n; ++i) r[i] = A[i] * A[i]; return; }          \
      if (e == 3) { for (int64_t i = 0; i < n; ++i) r[i] = A[i] * A[i] * A[i]; return; }   \
      if (e == (T)0.5) { for (int64_t i = 0; i < n; ++i) r[i] = sqrt(A[i]); return; }      \
      if (e == (T)-0.5) { for (int64_t i = 0; i < n; ++i) r[i] = (T)1 / sqrt(A[i]); return; } \
      if (e == -1) { for (int64_t i = 0; i < n; ++i) r[i] = (T)1 / A[i]; return; }         \
      if (e == -2) { for (int64_t i = 0; i < n; ++i) r[i] = (T)1 / (A[i] * A[i]); return; } \
      for (int64_t i = 0; i < n; ++i) r[i] = pow(A[i], e);                                 \
      return;                                                                              \
    }                                                                                      \
    for (int64_t i = 0; i < n; ++i) r[i] = pow(A[i], B[i]);                                \
  }
POW_F(float, f32)
POW_F(double, f64)
TILE_I(pow, 2, ipow(a, b))
TILE_FI(div_trunc, 2, trunc(a / b), idiv_trunc(a, b))
TILE_FI(div_floor, 2, FDIV_FLOOR_T(a, b), idiv_floor(a, b))
TILE_FIS(maximum, 2, a != a ? a : b != b ? b : a > b ? a : b, a > b ? a : b)
TILE_FIS(minimum, 2, a != a ? a : b != b ? b : a < b ? a : b, a < b ? a : b)
TILE_FIS(fmax, 2, fmax(a, b), a > b ? a : b)
TILE_FIS(fmin, 2, fmin(a, b), a < b ? a : b)
TILE_F(atan2, 2, atan2(a, b))
TILE_FI(remainder, 2, FMOD_FLOOR_T(a, b), imod_floor(a, b))
TILE_FI(fmod, 2, fmod(a, b), imod_trunc(a, b))
TILE_I(bitwise_and, 2, a & b)
TILE_I(bitwise_or, 2, a | b)
TILE_I(bitwise_xor, 2, a ^ b)
TILE_FI(logical_and, 2, a != 0 && b != 0, a != 0 && b != 0)
TILE_FI(logical_or, 2, a != 0 || b != 0, a != 0 || b != 0)
TILE_FI(logical_xor, 2, (a != 0) != (b != 0), (a != 0) != (b != 0))
TILE_F(hypot, 2, hypot(a, b))
TILE_FS(copysign, 2, copysign(a, b))
TILE_F(xlogy, 2, b != b ? b : a == 0 ? (T)0 : a * log(b))

/* ---- ternary ---------------------------------------------------------------------------- */
/* CPU's kernels: addcmul is compiled with contraction, one rounding for the product's
 * last step and the add (x + v * y * z -> fma(v * y, z, x)); addcdiv divides last. */
TILE_FIS(addcmul, 3, FMA_T(p0 * b, c, a), UADD(a, UMUL(UMUL(p0, b), c)))
TILE_F(addcdiv, 3, a + p0 * b / c)
/* addr: beta * a + alpha * b * c (p1 beta, p0 alpha); beta == 0 ignores a, NaN included,
 * as CPU's kernel. With an f16/bf16 result each product and the sum round to it, as that
 * kernel's Half/BFloat16 arithmetic does: cancellation makes the difference visible. */
TILE_FI(addr_wide, 3, p1 == 0 ? p0 * b * c : p1 * a + p0 * b * c,
        p1 == 0 ? UMUL(UMUL(p0, b), c) : UADD(UMUL(p1, a), UMUL(UMUL(p0, b), c)))
#define addr_f64 addr_wide_f64 /* REG_FI(EW_ADDR, addr) takes these two as they are */
#define addr_i64 addr_wide_i64
static void addr_f32(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) {
  tpu_dtype_t res = (tpu_dtype_t)nd->ia[EW_IA_RESULT];
  if (res != TPU_DTYPE_F16 && res != TPU_DTYPE_BF16) {
    addr_wide_f32(n, o, in, nd);
    return;
  }
  float* r = o;
  const float *a = in[0], *b = in[1], *c = in[2];
  const float alpha = (float)nd->da[0], beta = (float)nd->da[1];
  float t[256];
  for (int64_t i0 = 0; i0 < n; i0 += 256) {
    int64_t m = n - i0 < 256 ? n - i0 : 256;
    for (int64_t i = 0; i < m; ++i) t[i] = alpha * b[i0 + i];
    tpu__round_f32_run(t, m, res);
    for (int64_t i = 0; i < m; ++i) t[i] *= c[i0 + i];
    tpu__round_f32_run(t, m, res);
    if (beta == 0) {
      memcpy(r + i0, t, sizeof(float) * (size_t)m);
      continue;
    }
    for (int64_t i = 0; i < m; ++i) r[i0 + i] = beta * a[i0 + i];
    tpu__round_f32_run(r + i0, m, res);
    for (int64_t i = 0; i < m; ++i) r[i0 + i] += t[i];
    tpu__round_f32_run(r + i0, m, res);
  }
}
/* CPU's lerp_vec: fma(w, end - start, start) for |w| < 0.5, else
 * fma(w - 1, end - start, end). */
TILE_FS(lerp, 3, fabs(c) < (T)0.5 ? FMA_T(c, b - a, a) : FMA_T(c - (T)1, b - a, b))

/* clamp: in[1] and in[2] are the bounds that were given (ia[1] has min, ia[2] has max),
 * each a tile or, when the node has a scalar there, that value (as every tile function
 * here reads a scalar second or third input). A NaN bound makes the result NaN, as in
 * PyTorch. */
#define CLAMP_BODY(T, ISNAN, SV)                                                         \
  {                                                                                       \
    T* r = o;                                                                             \
    const T* x = in[0];                                                                   \
    int jl = nd->ia[1] ? 1 : 0, jh = nd->ia[2] ? 1 + (jl != 0) : 0;                        \
    bool ls = jl && nd->in[jl].is_scalar, hs = jh && nd->in[jh].is_scalar;                \
    const T* lo = jl && !ls ? (const T*)in[jl] : NULL;                                    \
    const T* hi = jh && !hs ? (const T*)in[jh] : NULL;                                    \
    const T lv = ls ? (T)nd->in[jl].SV : 0, hv = hs ? (T)nd->in[jh].SV : 0;               \
    (void)lv; (void)hv;                                                                   \
    if (jl && jh) {                                                                       \
      if (ls && hs) CLAMP_BOTH(T, ISNAN, lv, hv)                                             \
      else if (ls) CLAMP_BOTH(T, ISNAN, lv, hi[i])                                           \
      else if (hs) CLAMP_BOTH(T, ISNAN, lo[i], hv)                                           \
      else CLAMP_BOTH(T, ISNAN, lo[i], hi[i])                                                \
    } else if (jl) {                                                                      \
      if (ls) CLAMP_ONE(ISNAN, <, lv) else CLAMP_ONE(ISNAN, <, lo[i])                     \
    } else {                                                                              \
      if (hs) CLAMP_ONE(ISNAN, >, hv) else CLAMP_ONE(ISNAN, >, hi[i])                     \
    }                                                                                     \
  }
#define CLAMP_BOTH(T, ISNAN, L, H)                                                           \
  for (int64_t i = 0; i < n; ++i) {                                                       \
    T v = x[i] < (L) || ISNAN(L) ? (L) : x[i];                                            \
    r[i] = v > (H) || ISNAN(H) ? (H) : v;                                                 \
  }
#define CLAMP_ONE(ISNAN, CMP, B) for (int64_t i = 0; i < n; ++i) r[i] = x[i] CMP (B) || ISNAN(B) ? (B) : x[i];
#define FNAN(v) ((v) != (v))
#define NONAN(v) 0
static void clamp_f32(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) CLAMP_BODY(float, FNAN, scalar_d)
static void clamp_f64(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) CLAMP_BODY(double, FNAN, scalar_d)
static void clamp_i64(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) CLAMP_BODY(int64_t, NONAN, scalar_i)

/* ---- activation backward: a = grad_output, b = self (or result) ----------------------- */
TILE_FIS(threshold_bw, 2, b <= p0 ? (T)0 : a, b <= p0 ? 0 : a)
TILE_F(gelu_bw, 2, a * GELU_GRAD(b))
TILE_F(gelu_tanh_bw, 2, a * GELU_TANH_GRAD(b))
TILE_F(silu_bw, 2, a * SIGMOID(b) * ((T)1 + b * ((T)1 - SIGMOID(b))))
TILE_F(sigmoid_bw, 2, a * ((T)1 - b) * b)
TILE_F(tanh_bw, 2, a * ((T)1 - b * b))
TILE_FS(hardtanh_bw, 2, b <= p0 || b >= p1 ? (T)0 : a)
TILE_FS(leaky_relu_bw, 2, b > 0 ? a : a * p0)
TILE_F(elu_bw, 2,
       nd->ia[3] ? (b <= 0 ? a * p2 * (b + p0 * p1) : a * p1)
                 : (b <= 0 ? a * p2 * p0 * p1 * exp(b * p2) : a * p1))
TILE_F(softplus_bw, 2, b * p0 > p1 ? a : a * exp(b * p0) / (exp(b * p0) + (T)1))
/* PyTorch scales by the float constant 1/6 also for double; matched on purpose */
TILE_F(hardsigmoid_bw, 2, b > (T)-3 && b < (T)3 ? a * (T)(1.0f / 6.0f) : (T)0)
TILE_F(hardswish_bw, 2, b < (T)-3 ? (T)0 : b <= (T)3 ? a * (b / (T)3 + (T)0.5) : a)
TILE_F(logit_bw, 2,
       p0 < 0 ? (b < 0 || b > 1 ? (T)NAN : a / (b * ((T)1 - b)))
              : (b < p0 || b > (T)1 - p0 ? (T)0 : a / (b * ((T)1 - b))))

/* ---- more unary / binary ---------------------------------------------------------------- */
/* lgamma_r: plain lgamma writes the global signgam, racy across queue threads. */
static inline float lgamma_f(float x) { int s; return lgammaf_r(x, &s); }
static inline double lgamma_d(double x) { int s; return lgamma_r(x, &s); }
#define LGAMMA_T(x) (sizeof(T) == 4 ? (T)lgamma_f((float)(x)) : (T)lgamma_d((double)(x)))
#define PI_T ((T)3.14159265358979323846)
#define LN2_T ((T)0.69314718055994530942)
TILE_F(erfc, 1, erfc(a))
TILE_F(lgamma, 1, LGAMMA_T(a))
TILE_F(sinc, 1, a == 0 ? (T)1 : sin(PI_T * a) / (PI_T * a))
TILE_FS(scale, 1, a * p0)
TILE_F(logaddexp, 2, isinf(a) && a == b ? a : fmax(a, b) + log1p(exp(-fabs(a - b))))
TILE_F(logaddexp2, 2, isinf(a) && a == b ? a : fmax(a, b) + log1p(exp2(-fabs(a - b))) / LN2_T)
TILE_FI(heaviside, 2, a == 0 ? b : (T)(a > 0), a == 0 ? b : a > 0)
TILE_F(hardshrink, 1, a >= -p0 && a <= p0 ? (T)0 : a)
TILE_F(softshrink, 1, a > p0 ? a - p0 : a < -p0 ? a + p0 : (T)0)
TILE_F(shrink_bw, 2, b >= -p0 && b <= p0 ? (T)0 : a)
TILE_F(log_sigmoid, 1, fmin(a, (T)0) - log1p(exp(-fabs(a))))
TILE_F(log_sigmoid_buf, 1, exp(-fabs(a)))
TILE_F(log_sigmoid_bw, 3, a * ((b < 0 ? (T)1 : (T)0) - (b < 0 ? (T)1 : (T)-1) * (c / ((T)1 + c))))
/* Shifts past the width give 0 (left) or the sign fill (right), as PyTorch defines. */
TILE_I(lshift, 2, b < 0 || b >= 64 ? 0 : (int64_t)((uint64_t)a << b))
TILE_I(rshift, 2, b < 0 || b >= 64 ? a >> 63 : a >> b)

/* ---- registration -------------------------------------------------------------------- */

typedef struct { tpu_tile_fn f32, f64, i64; } tiles_t;
static tiles_t tiles[TPU_KIND_COUNT];
/* Kinds whose kernel is exactly run_tiles (no side checks): safe inside a fused loop. */
static bool pure[TPU_KIND_COUNT];
/* Division kinds check for integer division by zero; their float kernels are pure. */
static bool zero_div[TPU_KIND_COUNT];

/* f32 tile, then rounded through the f16/bf16 result dtype (the out= tensor is wider). */
static void f32_round_f16(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) {
  tiles[nd->kind].f32(n, o, in, nd);
  tpu__round_f32_run(o, n, TPU_DTYPE_F16);
}
static void f32_round_bf16(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) {
  tiles[nd->kind].f32(n, o, in, nd);
  tpu__round_f32_run(o, n, TPU_DTYPE_BF16);
}

static tpu_status_t run_tiles(tpu_node_t* n) {
  const tiles_t* t = &tiles[n->kind];
  tpu_tile_fn fn = n->compute == TPU_DTYPE_F32 ? t->f32 : n->compute == TPU_DTYPE_F64 ? t->f64
                 : n->compute == TPU_DTYPE_I64 ? t->i64 : NULL;
  if (!fn) return tpu_status_make(TPU_UNIMPLEMENTED, "%s: no host kernel for %s",
                                  tpu__node_describe(n), tpu_dtype_name(n->compute));
  tpu_dtype_t result = (tpu_dtype_t)n->ia[EW_IA_RESULT];
  if (n->compute == TPU_DTYPE_F32 && n->out[0].dtype != result) {
    if (result == TPU_DTYPE_F16) fn = f32_round_f16;
    else if (result == TPU_DTYPE_BF16) fn = f32_round_bf16;
  }
  return tpu__tile_run(n, n->compute, fn);
}

/* Integer division kinds: a zero divisor is the op's error (PyTorch raises
 * "ZeroDivisionError" as a RuntimeError). */
static tpu_status_t run_tiles_div(tpu_node_t* n) {
  tpu__tile_take_fault();
  tpu_status_t st = run_tiles(n);
  if (tpu__tile_take_fault() && !st)
    st = tpu_status_make(TPU_INVALID_ARGUMENT, "%s: ZeroDivisionError", tpu__node_describe(n));
  return st;
}

static tpu_status_t run_log_sigmoid(tpu_node_t* n) {
  tpu_tile_fn f = n->compute == TPU_DTYPE_F64 ? log_sigmoid_f64 : log_sigmoid_f32;
  tpu_tile_fn g = n->compute == TPU_DTYPE_F64 ? log_sigmoid_buf_f64 : log_sigmoid_buf_f32;
  const tpu_operand_t* ins[1] = {&n->in[0]};
  TPU_RETURN_IF_ERROR(tpu__tile_run_ops(n, &n->out[0], ins, 1, n->compute, f));
  return tpu__tile_run_ops(n, &n->out[1], ins, 1, n->compute, g);
}

tpu_tile_fn tpu__elementwise_tile_fn(const tpu_node_t* n) {
  if (n->kind < 0 || n->kind >= TPU_KIND_COUNT) return NULL;
  if (!pure[n->kind] && !(zero_div[n->kind] && n->compute != TPU_DTYPE_I64)) return NULL;
  const tiles_t* t = &tiles[n->kind];
  tpu_tile_fn fn = n->compute == TPU_DTYPE_F32 ? t->f32 : n->compute == TPU_DTYPE_F64 ? t->f64
                 : n->compute == TPU_DTYPE_I64 ? t->i64 : NULL;
  tpu_dtype_t result = (tpu_dtype_t)n->ia[EW_IA_RESULT];
  if (fn && n->compute == TPU_DTYPE_F32 && n->out[0].dtype != result) {
    if (result == TPU_DTYPE_F16) fn = f32_round_f16;
    else if (result == TPU_DTYPE_BF16) fn = f32_round_bf16;
  }
  return fn;
}

#define REG_FI(K, name) tiles[TPU_KIND_##K] = (tiles_t){name##_f32, name##_f64, name##_i64}; table[TPU_KIND_##K] = run_tiles; pure[TPU_KIND_##K] = true;
#define REG_F(K, name) tiles[TPU_KIND_##K] = (tiles_t){name##_f32, name##_f64, NULL}; table[TPU_KIND_##K] = run_tiles; pure[TPU_KIND_##K] = true;
#define REG_I(K, name) tiles[TPU_KIND_##K] = (tiles_t){NULL, NULL, name##_i64}; table[TPU_KIND_##K] = run_tiles; pure[TPU_KIND_##K] = true;
#define REG_DIV(K, name) REG_FI(K, name) table[TPU_KIND_##K] = run_tiles_div; pure[TPU_KIND_##K] = false; zero_div[TPU_KIND_##K] = true;

void tpu__host_register_elementwise(tpu_host_kernel_fn* table) {
  REG_FI(ADD, add) REG_FI(SUB, sub) REG_FI(MUL, mul) REG_DIV(DIV, div) REG_FI(EQ, eq) REG_FI(NE, ne)
  REG_FI(LT, lt) REG_FI(LE, le) REG_FI(GT, gt) REG_FI(GE, ge) REG_FI(NEG, neg) REG_F(EXP, exp)
  REG_FI(FILL, fill) REG_FI(WHERE, where)
  REG_FI(EW_ABS, abs) REG_F(EW_SQRT, sqrt) REG_F(EW_RSQRT, rsqrt) REG_F(EW_LOG, log)
  REG_F(EW_LOG1P, log1p) REG_F(EW_LOG2, log2) REG_F(EW_LOG10, log10) REG_F(EW_EXP2, exp2)
  REG_F(EW_EXPM1, expm1) REG_F(EW_SIN, sin) REG_F(EW_COS, cos) REG_F(EW_TAN, tan)
  REG_F(EW_TANH, tanh) REG_F(EW_SIGMOID, sigmoid) REG_FI(EW_RELU, relu) REG_F(EW_ERF, erf)
  REG_F(EW_ERFINV, erfinv) REG_F(EW_RECIPROCAL, reciprocal) REG_FI(EW_FLOOR, floor)
  REG_FI(EW_CEIL, ceil) REG_FI(EW_ROUND, round) REG_F(EW_ROUND_DEC, round_dec)
  REG_FI(EW_TRUNC, trunc) REG_FI(EW_SIGN, sign) REG_F(EW_FRAC, frac) REG_F(EW_ASIN, asin)
  REG_F(EW_ACOS, acos) REG_F(EW_ATAN, atan) REG_F(EW_SINH, sinh) REG_F(EW_COSH, cosh)
  REG_F(EW_ASINH, asinh) REG_F(EW_ACOSH, acosh) REG_F(EW_ATANH, atanh)
  REG_FI(EW_LOGICAL_NOT, logical_not) REG_I(EW_BITWISE_NOT, bitwise_not) REG_FI(EW_ISNAN, isnan)
  REG_FI(EW_ISINF, isinf) REG_FI(EW_ISPOSINF, isposinf) REG_FI(EW_ISNEGINF, isneginf)
  REG_FI(EW_SIGNBIT, signbit) REG_FI(EW_NAN_TO_NUM, nan_to_num) REG_F(EW_GELU, gelu)
  REG_F(EW_GELU_TANH, gelu_tanh) REG_F(EW_SILU, silu) REG_FI(EW_HARDTANH, hardtanh)
  REG_F(EW_LEAKY_RELU, leaky_relu) REG_F(EW_ELU, elu) REG_F(EW_SOFTPLUS, softplus)
  REG_F(EW_HARDSIGMOID, hardsigmoid) REG_F(EW_HARDSWISH, hardswish) REG_F(EW_MISH, mish)
  REG_F(EW_LOGIT, logit) REG_FI(EW_THRESHOLD, threshold)
  REG_FI(EW_POW, pow) REG_DIV(EW_DIV_TRUNC, div_trunc) REG_DIV(EW_DIV_FLOOR, div_floor)
  REG_FI(EW_MAXIMUM, maximum) REG_FI(EW_MINIMUM, minimum) REG_FI(EW_FMAX, fmax) REG_FI(EW_FMIN, fmin)
  REG_F(EW_ATAN2, atan2) REG_DIV(EW_REMAINDER, remainder) REG_DIV(EW_FMOD, fmod)
  REG_I(EW_BITWISE_AND, bitwise_and) REG_I(EW_BITWISE_OR, bitwise_or) REG_I(EW_BITWISE_XOR, bitwise_xor)
  REG_FI(EW_LOGICAL_AND, logical_and) REG_FI(EW_LOGICAL_OR, logical_or) REG_FI(EW_LOGICAL_XOR, logical_xor)
  REG_F(EW_HYPOT, hypot) REG_F(EW_COPYSIGN, copysign) REG_F(EW_XLOGY, xlogy) REG_FI(EW_RSUB, rsub)
  REG_FI(EW_ADDCMUL, addcmul) REG_F(EW_ADDCDIV, addcdiv) REG_F(EW_LERP, lerp) REG_FI(EW_ADDR, addr) REG_FI(EW_CLAMP, clamp)
  REG_FI(EW_THRESHOLD_BW, threshold_bw) REG_F(EW_GELU_BW, gelu_bw) REG_F(EW_GELU_TANH_BW, gelu_tanh_bw)
  REG_F(EW_SILU_BW, silu_bw) REG_F(EW_SIGMOID_BW, sigmoid_bw) REG_F(EW_TANH_BW, tanh_bw)
  REG_F(EW_HARDTANH_BW, hardtanh_bw) REG_F(EW_LEAKY_RELU_BW, leaky_relu_bw) REG_F(EW_ELU_BW, elu_bw)
  REG_F(EW_SOFTPLUS_BW, softplus_bw) REG_F(EW_HARDSIGMOID_BW, hardsigmoid_bw)
  REG_F(EW_HARDSWISH_BW, hardswish_bw) REG_F(EW_LOGIT_BW, logit_bw)
  REG_F(EW_ERFC, erfc) REG_F(EW_LGAMMA, lgamma) REG_F(EW_SINC, sinc) REG_F(EW_SCALE, scale)
  REG_F(EW_LOGADDEXP, logaddexp) REG_F(EW_LOGADDEXP2, logaddexp2) REG_FI(EW_HEAVISIDE, heaviside)
  REG_F(EW_HARDSHRINK, hardshrink) REG_F(EW_SOFTSHRINK, softshrink) REG_F(EW_SHRINK_BW, shrink_bw)
  REG_F(EW_LOG_SIGMOID_BW, log_sigmoid_bw) REG_I(EW_LSHIFT, lshift) REG_I(EW_RSHIFT, rshift)
  table[TPU_KIND_EW_LOG_SIGMOID] = run_log_sigmoid;
}
