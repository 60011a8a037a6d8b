/* Fused attention of one f32 head with AVX-512; contract in host/host.h (tpu__attn_f32_*).
 *
 * The generic path (host/nn.c) computes a head as calls to tpu__gemm on blocks of 32 query
 * rows plus separate softmax passes. At the head sizes of small and medium transformers
 * (64-128 positions, 32-64 dims) each of those products is a few thousand FMAs, and a
 * call's kernel selection, buffer allocation and B packing cost about as much as the
 * product. Here every product of a head is one inline tile loop, "broadcast an element of
 * A, multiply a row of B", with B always row-major: K and V are packed transposed once
 * per head (Kt, Vt: one row per dim, keys padded to 16), the other right operands (V, K,
 * Q, dO) are read in place. A tile is MRC rows by NVC 16-float vectors of C (24
 * accumulators or fewer), its shape chosen by the product's width.
 *
 * Numerics are the generic path's: scores = scale * (q . k) summed in dim order, plus the
 * bias (a bool bias: -inf where false), causal cells set to -inf, softmax as exp(x - max)
 * (host/vmath.h's exp) scaled by 1 / sum, logsumexp = max + log(sum); every sum over keys
 * or rows runs in order, so results do not depend on the thread count.
 *
 * Every function here is compiled for AVX-512 (AVX512_TARGET); host/nn.c calls in only
 * when tpu__gemm_f32_supported() (its cpuid check). */
#include <math.h>
#include <string.h>

#include "host/avx512.h"
#include "host/host.h"
#include "host/vmath.h"

#define QB TPU_ATTN_ROWS

static int64_t pad16(int64_t x) { return (x + 15) / 16 * 16; }

size_t tpu__attn_f32_scratch(int64_t S, int64_t E, int64_t Ev) {
  return (size_t)((E + Ev + 2 * QB) * pad16(S) + 16);
}

/* C[mr, n] (row stride ldc) = alpha * A B, or += with acc; A's element (r, k) is a[r * ars
 * + k * aks], B's (k, j) is b[k * ldb + j]; n <= 16 * NVC, lanes past n neither read nor
 * stored. Inlined with constant MRC, NVC, so the accumulators stay in registers. */
AVX512_TARGET static inline __attribute__((always_inline)) void tile(
    const int MRC, const int NVC, int mr, int n, int64_t K, const float* a, int64_t ars, int64_t aks,
    const float* b, int64_t ldb, float* c, int64_t ldc, float alpha, bool acc) {
  __mmask16 mk[4];
  const float* ar[12];
  __m512 s[12][4];
#pragma GCC unroll 4
  for (int v = 0; v < NVC; ++v) mk[v] = tpu__avx512_lanes(n - 16 * v);
#pragma GCC unroll 12
  for (int r = 0; r < MRC; ++r) {
    ar[r] = a + (r < mr ? r : mr - 1) * ars; /* rows past mr repeat the last (not stored) */
#pragma GCC unroll 4
    for (int v = 0; v < NVC; ++v) s[r][v] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    __m512 bv[4];
#pragma GCC unroll 4
    for (int v = 0; v < NVC; ++v) bv[v] = _mm512_maskz_loadu_ps(mk[v], b + k * ldb + 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < MRC; ++r) {
      __m512 av = _mm512_set1_ps(ar[r][k * aks]);
#pragma GCC unroll 4
      for (int v = 0; v < NVC; ++v) s[r][v] = _mm512_fmadd_ps(av, bv[v], s[r][v]);
    }
  }
  __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 12
  for (int r = 0; r < MRC; ++r) {
    if (r >= mr) break;
#pragma GCC unroll 4
    for (int v = 0; v < NVC; ++v) {
      float* cp = c + r * ldc + 16 * v;
      __m512 x = _mm512_mul_ps(s[r][v], va);
      if (acc) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk[v], cp));
      _mm512_mask_storeu_ps(cp, mk[v], x);
    }
  }
}

/* One strip of at most 16 * NVC columns, all M rows. */
#define STRIP(MRC, NVC)                                                                   \
  for (int64_t i = 0; i < M; i += MRC)                                                    \
    tile(MRC, NVC, (int)(M - i < MRC ? M - i : MRC), n, K, a + i * ars, ars, aks, b + j, ldb, \
         c + i * ldc + j, ldc, alpha, acc)

/* C[M, N] = alpha * A B (+= with acc), in strips of 64 columns; the last strip's tile
 * is as narrow as its columns (fewer vectors, more rows). */
AVX512_TARGET static void mm(int64_t M, int64_t N, int64_t K, const float* a, int64_t ars, int64_t aks,
                             const float* b, int64_t ldb, float* c, int64_t ldc, float alpha, bool acc) {
  for (int64_t j = 0; j < N; j += 64) {
    int n = (int)(N - j < 64 ? N - j : 64);
    switch ((n + 15) / 16) {
      case 4: STRIP(6, 4); break;
      case 3: STRIP(8, 3); break;
      case 2: STRIP(12, 2); break;
      default: STRIP(12, 1); break;
    }
  }
}
#undef STRIP

/* dst[e * ld + j] = src[j * lds + e] for j < S, e < E; columns S..pad16(S) zero. */
AVX512_TARGET static void pack_t(float* dst, int64_t ld, const float* src, int64_t lds, int64_t S, int64_t E) {
  for (int64_t j0 = 0; j0 < pad16(S); j0 += 16)
    for (int64_t e0 = 0; e0 < E; e0 += 16) {
      __mmask16 m = tpu__avx512_lanes((int)(E - e0));
      __m512i r[16];
      for (int j = 0; j < 16; ++j)
        r[j] = j0 + j < S ? _mm512_maskz_loadu_epi32(m, src + (j0 + j) * lds + e0) : _mm512_setzero_si512();
      tpu__avx512_transpose16(r);
      for (int e = 0; e < 16 && e0 + e < E; ++e) _mm512_storeu_si512(dst + (e0 + e) * ld + j0, r[e]);
    }
}

/* row[j] = e^(row[j] - shift) for j < c: host/vmath.h's exp in a loop the compiler
 * vectorizes (with fma, so its TPU_FMAF steps are vfmadd, as in vmath.h's AVX-512 clones). */
AVX512_TARGET __attribute__((target("fma"))) static void exp_shifted(float* row, int64_t c, float shift) {
  for (int64_t j = 0; j < c; ++j) row[j] = tpu__vexpf(row[j] - shift);
}

/* The bias of rows [i0, i0 + m) added to a block's scores (c keys, row stride cs). */
AVX512_TARGET static void add_bias(const tpu_attn_f32_t* h, float* sc, int64_t cs, int64_t m, int64_t c, int64_t i0) {
  __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < m; ++i) {
    float* row = sc + i * cs;
    int64_t sr = h->bias_sr, sb = h->bias_sc;
    if (h->bias_dtype == TPU_DTYPE_F32) {
      const float* b = (const float*)h->bias + (i0 + i) * sr;
      if (sb != 1) {
        for (int64_t j = 0; j < c; ++j) row[j] += b[j * sb];
        continue;
      }
      for (int64_t j = 0; j < c; j += 16) {
        __mmask16 k = tpu__avx512_lanes((int)(c - j));
        __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(k, row + j), _mm512_maskz_loadu_ps(k, b + j));
        _mm512_mask_storeu_ps(row + j, k, x);
      }
    } else {
      const uint8_t* b = (const uint8_t*)h->bias + (i0 + i) * sr;
      if (sb != 1) {
        for (int64_t j = 0; j < c; ++j) row[j] = b[j * sb] ? row[j] : -INFINITY;
        continue;
      }
      for (int64_t j = 0; j < c; j += 16) {
        __mmask16 k = tpu__avx512_lanes((int)(c - j));
        __m128i bv = _mm_maskz_loadu_epi8(k, b + j);
        __mmask16 drop = k & ~_mm_test_epi8_mask(bv, bv);
        _mm512_mask_storeu_ps(row + j, drop, ninf);
      }
    }
  }
}

/* Row i of a block's scores (c keys, row stride cs): causal cells after key i0 + i to -inf. */
AVX512_TARGET static void mask_causal(float* sc, int64_t cs, int64_t m, int64_t c, int64_t i0) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = i0 + i + 1; j < c; ++j) sc[i * cs + j] = -INFINITY;
}

/* Softmax of each of m rows of c scores in place; lse[i] = max + log(sum). A row of only
 * -inf becomes zeros with lse -inf (ATen's _safe_softmax). */
AVX512_TARGET static void softmax_rows(float* sc, int64_t cs, int64_t m, int64_t c, float* lse) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = sc + i * cs;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < c; j += 16)
      mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, tpu__avx512_lanes((int)(c - j)), row + j));
    float m1 = _mm512_reduce_max_ps(mx);
    if (m1 == -INFINITY) {
      memset(row, 0, sizeof(float) * (size_t)c);
      lse[i] = -INFINITY;
      continue;
    }
    exp_shifted(row, c, m1);
    __m512 sum = _mm512_setzero_ps(); /* 16 lane sums in key order, then a fixed tree */
    for (int64_t j = 0; j < c; j += 16)
      sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(tpu__avx512_lanes((int)(c - j)), row + j));
    float s = _mm512_reduce_add_ps(sum);
    __m512 inv = _mm512_set1_ps(1.0f / s);
    for (int64_t j = 0; j < c; j += 16) {
      __mmask16 k = tpu__avx512_lanes((int)(c - j));
      _mm512_mask_storeu_ps(row + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), inv));
    }
    lse[i] = m1 + logf(s);
  }
}

AVX512_TARGET void tpu__attn_f32_fwd(const tpu_attn_f32_t* h, int64_t r0, int64_t r1, float* out, int64_t ldo,
                                     float* lse, float* scratch) {
  int64_t S = h->S, ls = pad16(S);
  int64_t seen = h->causal ? (r1 < S ? r1 : S) : S; /* keys any of the rows sees */
  float *kt = scratch, *sc = kt + h->E * ls;
  pack_t(kt, ls, h->k, h->ldk, seen, h->E);
  for (int64_t i0 = r0; i0 < r1; i0 += QB) {
    int64_t m = r1 - i0 < QB ? r1 - i0 : QB;
    int64_t c = h->causal ? (i0 + m < S ? i0 + m : S) : S; /* keys the block's rows see */
    if (c <= 0) { /* no key at all (S = 0): zeros, as ATen */
      for (int64_t i = 0; i < m; ++i) {
        memset(out + (i0 + i) * ldo, 0, sizeof(float) * (size_t)h->Ev);
        lse[i0 + i] = -INFINITY;
      }
      continue;
    }
    mm(m, c, h->E, h->q + i0 * h->ldq, h->ldq, 1, kt, ls, sc, ls, h->scale, false);
    if (h->bias) add_bias(h, sc, ls, m, c, i0);
    if (h->causal) mask_causal(sc, ls, m, c, i0);
    softmax_rows(sc, ls, m, c, lse + i0);
    mm(m, h->Ev, c, sc, ls, 1, h->v, h->ldv, out + i0 * ldo, ldo, 1.0f, false);
  }
}

AVX512_TARGET void tpu__attn_f32_bwd(const tpu_attn_f32_t* h, const float* go, int64_t ldgo, const float* o,
                                     int64_t ldo, const float* lse, float* dq, int64_t lddq, float* dk,
                                     int64_t lddk, float* dv, int64_t lddv, float* scratch) {
  int64_t L = h->L, S = h->S, E = h->E, Ev = h->Ev, ls = pad16(S);
  float *kt = scratch, *vt = kt + E * ls, *p = vt + Ev * ls, *dp = p + QB * ls;
  pack_t(kt, ls, h->k, h->ldk, S, E);
  pack_t(vt, ls, h->v, h->ldv, S, Ev);
  for (int64_t i0 = 0; i0 < L; i0 += QB) {
    int64_t m = L - i0 < QB ? L - i0 : QB;
    int64_t c = h->causal ? (i0 + m < S ? i0 + m : S) : S;
    const float *qb = h->q + i0 * h->ldq, *gb = go + i0 * ldgo;
    if (c <= 0) { /* no keys: the rows' gradient is zero */
      for (int64_t i = 0; i < m; ++i) memset(dq + (i0 + i) * lddq, 0, sizeof(float) * (size_t)E);
      continue;
    }
    /* P = exp(scale q k - lse), rebuilt from the saved logsumexp */
    mm(m, c, E, qb, h->ldq, 1, kt, ls, p, ls, h->scale, false);
    if (h->bias) add_bias(h, p, ls, m, c, i0);
    if (h->causal) mask_causal(p, ls, m, c, i0);
    for (int64_t i = 0; i < m; ++i) {
      float* row = p + i * ls;
      float l = lse[i0 + i];
      if (l == -INFINITY) memset(row, 0, sizeof(float) * (size_t)c);
      else exp_shifted(row, c, l);
    }
    mm(c, Ev, m, p, 1, ls, gb, ldgo, dv, lddv, 1.0f, true);   /* dV += P^T dO */
    mm(m, c, Ev, gb, ldgo, 1, vt, ls, dp, ls, 1.0f, false);    /* dP = dO V^T */
    for (int64_t i = 0; i < m; ++i) { /* dS = P * (dP - rowsum(dO * O)) */
      const float *g = gb + i * ldgo, *oi = o + (i0 + i) * ldo;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t e = 0; e < Ev; e += 16) {
        __mmask16 k = tpu__avx512_lanes((int)(Ev - e));
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, g + e), _mm512_maskz_loadu_ps(k, oi + e), acc);
      }
      __m512 di = _mm512_set1_ps(_mm512_reduce_add_ps(acc));
      float *pr = p + i * ls, *dr = dp + i * ls;
      for (int64_t j = 0; j < c; j += 16) {
        __mmask16 k = tpu__avx512_lanes((int)(c - j));
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, pr + j), _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dr + j), di));
        _mm512_mask_storeu_ps(dr + j, k, x);
      }
    }
    mm(m, E, c, dp, ls, 1, h->k, h->ldk, dq + i0 * lddq, lddq, h->scale, false); /* dQ = scale dS K */
    mm(c, E, m, dp, 1, ls, qb, h->ldq, dk, lddk, h->scale, true);               /* dK += scale dS^T Q */
  }
}
