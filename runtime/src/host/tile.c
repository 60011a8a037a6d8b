/* The tile engine and dtype conversions of the host driver.
 *
 * Elementwise nodes run row by row over their (coalesced) iteration space, in tiles of
 * TILE elements. An input already dense in the compute dtype is read in place; others
 * are converted into a small per-input tile buffer, so every kernel sees dense tiles of
 * one dtype. The same loop is the building block the fused interpreter of
 * defer_and_fuse will chain (docs/architecture.md). */
#include "host/host.h"
#include "host/vmath.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define TILE 2048

/* ---- conversions ---------------------------------------------------------------- */
#define LD_U8(p) (*(const uint8_t*)(p))
#define LD_I8(p) (*(const int8_t*)(p))
#define LD_I16(p) (*(const int16_t*)(p))
#define LD_I32(p) (*(const int32_t*)(p))
#define LD_I64(p) (*(const int64_t*)(p))
#define LD_F16(p) ((float)*(const _Float16*)(p))
#define LD_F32(p) (*(const float*)(p))
#define LD_F64(p) (*(const double*)(p))
#define LD_BOOL(p) (*(const uint8_t*)(p) != 0)
#define LD_BF16(p) tpu__bf16_to_f32(*(const uint16_t*)(p))

/* Integer stores from floating values go through int64 so negative values wrap the way
 * PyTorch's CPU casts do on x86 instead of being undefined. */
#define TO_INT(T, v) ((T)(int64_t)(v))
#define ST_U8(p, v) (*(uint8_t*)(p) = TO_INT(uint8_t, v))
#define ST_I8(p, v) (*(int8_t*)(p) = TO_INT(int8_t, v))
#define ST_I16(p, v) (*(int16_t*)(p) = TO_INT(int16_t, v))
#define ST_I32(p, v) (*(int32_t*)(p) = TO_INT(int32_t, v))
#define ST_I64(p, v) (*(int64_t*)(p) = (int64_t)(v))
#define ST_F16(p, v) (*(_Float16*)(p) = (_Float16)(v))
#define ST_F32(p, v) (*(float*)(p) = (float)(v))
#define ST_F64(p, v) (*(double*)(p) = (double)(v))
#define ST_BOOL(p, v) (*(uint8_t*)(p) = (uint8_t)((v) != 0))
#define ST_BF16(p, v) (*(uint16_t*)(p) = tpu__f32_to_bf16((float)(v)))

#define DTYPES(X) X(U8, 1) X(I8, 1) X(I16, 2) X(I32, 4) X(I64, 8) X(F16, 2) X(F32, 4) \
                  X(F64, 8) X(BOOL, 1) X(BF16, 2)

#define INNER(SN, SS)                                                            \
  case TPU_DTYPE_##SN:                                                           \
    switch (dt) {                                                                \
      INNER2(SN, SS, U8, 1) INNER2(SN, SS, I8, 1) INNER2(SN, SS, I16, 2)          \
      INNER2(SN, SS, I32, 4) INNER2(SN, SS, I64, 8) INNER2(SN, SS, F16, 2)        \
      INNER2(SN, SS, F32, 4) INNER2(SN, SS, F64, 8) INNER2(SN, SS, BOOL, 1)       \
      INNER2(SN, SS, BF16, 2)                                                    \
      default: break;                                                            \
    }                                                                            \
    break;
#define INNER2(SN, SS, DN, DS)                                                   \
  case TPU_DTYPE_##DN:                                                           \
    for (int64_t i = 0; i < n; ++i)                                              \
      ST_##DN(d + i * ds * DS, LD_##SN(s + i * ss * SS));                        \
    break;

/* tpu__f32_to_bf16 in the high half of 32 bits (the low half is garbage), in 32-bit
 * operations only: written through 16-bit results, the compiler narrowed every vector to
 * 16-bit lanes and widened it back (permutes), 2x the instructions. */
static inline uint32_t bf16_rounded_bits(uint32_t u) {
  uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  uint32_t quiet = u | 0x00400000u; /* a NaN stays a (quiet) NaN */
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
}
/* Dense f32 -> bf16, the store of every bf16 kernel's f32 result (GEMM included), built
 * per ISA: the strided loop below runs it one element at a time. */
TPU_ISA_CLONES static void f32_to_bf16_dense(uint16_t* d, const float* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    memcpy(&u, s + i, sizeof u);
    d[i] = (uint16_t)(bf16_rounded_bits(u) >> 16);
  }
}
/* and the load of every bf16 operand into f32 tiles: the generic loop below, with its
 * strides unknown, stays scalar (a bf16 AdamW step spent a third of its time there) */
TPU_ISA_CLONES static void bf16_to_f32_dense(float* d, const uint16_t* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = tpu__bf16_to_f32(s[i]);
}

/* (fused groups round every bf16 member's tile like this: through two conversion calls
 * and a buffer it took a bf16 AdamW chain 2-3x the time of the float32 one) */
TPU_ISA_CLONES static void round_bf16_run(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    memcpy(&u, v + i, sizeof u);
    u = bf16_rounded_bits(u) & 0xffff0000u;
    memcpy(v + i, &u, sizeof u);
  }
}
TPU_ISA_CLONES static void round_f16_run(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = (float)(_Float16)v[i];
}
TPU_ISA_CLONES void tpu__round_store_bf16(float* v, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    memcpy(&u, v + i, sizeof u);
    u = bf16_rounded_bits(u);
    d[i] = (uint16_t)(u >> 16);
    u &= 0xffff0000u;
    memcpy(v + i, &u, sizeof u);
  }
}
void tpu__round_f32_run(float* v, int64_t n, tpu_dtype_t dt) {
  if (dt == TPU_DTYPE_BF16) round_bf16_run(v, n);
  else if (dt == TPU_DTYPE_F16) round_f16_run(v, n);
}

/* Runs with a complex side. A real source becomes (x, 0); a complex source stored to a
 * real dtype keeps its real part, as PyTorch's copy does (it warns in Python). */
static void convert_complex(char* d, tpu_dtype_t dt, int64_t ds, const char* s, tpu_dtype_t st,
                            int64_t ss, int64_t n) {
  if (st == TPU_DTYPE_C64 && dt == TPU_DTYPE_C64) {
    for (int64_t i = 0; i < n; ++i) memcpy(d + i * ds * 8, s + i * ss * 8, 8);
    return;
  }
  if (st == TPU_DTYPE_C128 && dt == TPU_DTYPE_C128) {
    for (int64_t i = 0; i < n; ++i) memcpy(d + i * ds * 16, s + i * ss * 16, 16);
    return;
  }
  if (tpu_dtype_is_complex(st) && tpu_dtype_is_complex(dt)) { /* c64 <-> c128 */
    for (int64_t i = 0; i < n; ++i) {
      double re, im;
      if (st == TPU_DTYPE_C64) { re = ((const float*)(s + i * ss * 8))[0]; im = ((const float*)(s + i * ss * 8))[1]; }
      else { re = ((const double*)(s + i * ss * 16))[0]; im = ((const double*)(s + i * ss * 16))[1]; }
      if (dt == TPU_DTYPE_C64) { float* q = (float*)(d + i * ds * 8); q[0] = (float)re; q[1] = (float)im; }
      else { double* q = (double*)(d + i * ds * 16); q[0] = re; q[1] = im; }
    }
    return;
  }
  if (tpu_dtype_is_complex(st)) { /* complex -> real: the real part, through its part dtype */
    tpu_dtype_t part = tpu__real_of(st);
    tpu__convert_run(d, dt, ds, s, part, 2 * ss, n);
    return;
  }
  /* real -> complex: the real parts through the part dtype, then zero imaginary parts */
  tpu_dtype_t part = tpu__real_of(dt);
  size_t psz = tpu_dtype_size(part);
  tpu__convert_run(d, part, 2 * ds, s, st, ss, n);
  for (int64_t i = 0; i < n; ++i) memset(d + (2 * i * ds + 1) * (int64_t)psz, 0, psz);
}

void tpu__convert_run(void* dst, tpu_dtype_t dt, int64_t ds, const void* src,
                      tpu_dtype_t st, int64_t ss, int64_t n) {
  char* d = dst;
  const char* s = src;
  if (dt == st && ds == 1 && ss == 1) {
    memcpy(d, s, (size_t)n * tpu_dtype_size(dt));
    return;
  }
  if (tpu_dtype_is_complex(dt) || tpu_dtype_is_complex(st)) {
    convert_complex(d, dt, ds, s, st, ss, n);
    return;
  }
  if (ds == 1 && ss == 1) {
    if (st == TPU_DTYPE_F32 && dt == TPU_DTYPE_BF16) { f32_to_bf16_dense(dst, src, n); return; }
    if (st == TPU_DTYPE_BF16 && dt == TPU_DTYPE_F32) { bf16_to_f32_dense(dst, src, n); return; }
  }
  switch (st) {
    DTYPES(INNER)
    default: break;
  }
}

double tpu__load_f64(const void* p, tpu_dtype_t t) {
  double v = 0;
  tpu__convert_run(&v, TPU_DTYPE_F64, 1, p, t, 1, 1);
  return v;
}
int64_t tpu__load_i64(const void* p, tpu_dtype_t t) {
  int64_t v = 0;
  tpu__convert_run(&v, TPU_DTYPE_I64, 1, p, t, 1, 1);
  return v;
}
void tpu__store_f64(void* p, tpu_dtype_t t, double v) { tpu__convert_run(p, t, 1, &v, TPU_DTYPE_F64, 1, 1); }
void tpu__store_i64(void* p, tpu_dtype_t t, int64_t v) { tpu__convert_run(p, t, 1, &v, TPU_DTYPE_I64, 1, 1); }

/* ---- iteration space ---------------------------------------------------------------- */

typedef struct iter_s {
  int ndim;
  int64_t sizes[TPU_MAX_DIMS];
  int nops; /* op 0 = output */
  int64_t strides[9][TPU_MAX_DIMS];
} iter_t;

/* Broadcast-aligns each operand to the output's shape, then merges adjacent dims that
 * are contiguous in every operand, and drops size-1 dims. */
static void iter_build(iter_t* it, const tpu_operand_t* out, const tpu_operand_t* const* ins, int n_in) {
  int nd = out->ndim;
  it->nops = n_in + 1;
  for (int o = 0; o < it->nops; ++o) {
    const tpu_operand_t* op = o == 0 ? out : ins[o - 1];
    for (int d = 0; d < nd; ++d) {
      int sd = d - (nd - (op->is_scalar ? 0 : op->ndim));
      int64_t st = 0;
      if (!op->is_scalar && sd >= 0 && op->sizes[sd] != 1) st = op->strides[sd];
      it->strides[o][d] = st;
    }
  }
  /* drop size-1 dims, then coalesce */
  int k = 0;
  for (int d = 0; d < nd; ++d) {
    if (out->sizes[d] == 1) continue;
    it->sizes[k] = out->sizes[d];
    for (int o = 0; o < it->nops; ++o) it->strides[o][k] = it->strides[o][d];
    ++k;
  }
  nd = k;
  if (nd == 0) { it->ndim = 1; it->sizes[0] = 1; for (int o = 0; o < it->nops; ++o) it->strides[o][0] = 0; return; }
  k = 0;
  for (int d = 1; d < nd; ++d) {
    bool can = true;
    for (int o = 0; o < it->nops && can; ++o)
      can = it->strides[o][k] == it->strides[o][d] * it->sizes[d];
    if (can) {
      it->sizes[k] *= it->sizes[d];
      for (int o = 0; o < it->nops; ++o) it->strides[o][k] = it->strides[o][d];
    } else {
      ++k;
      it->sizes[k] = it->sizes[d];
      for (int o = 0; o < it->nops; ++o) it->strides[o][k] = it->strides[o][d];
    }
  }
  it->ndim = k + 1;
}

static void fill_const(void* buf, tpu_dtype_t c, const tpu_operand_t* s, int64_t n) {
  if (c == TPU_DTYPE_C64) {
    float re = (float)s->scalar_d, im = (float)s->scalar_im;
    for (int64_t i = 0; i < n; ++i) { ((float*)buf)[2 * i] = re; ((float*)buf)[2 * i + 1] = im; }
  } else if (c == TPU_DTYPE_C128) {
    for (int64_t i = 0; i < n; ++i) { ((double*)buf)[2 * i] = s->scalar_d; ((double*)buf)[2 * i + 1] = s->scalar_im; }
  } else if (c == TPU_DTYPE_F32) { float v = (float)s->scalar_d; for (int64_t i = 0; i < n; ++i) ((float*)buf)[i] = v; }
  else if (c == TPU_DTYPE_F64) { for (int64_t i = 0; i < n; ++i) ((double*)buf)[i] = s->scalar_d; }
  else { for (int64_t i = 0; i < n; ++i) ((int64_t*)buf)[i] = s->scalar_i; }
}

/* ---- faults raised by tile functions ------------------------------------------------ */

static _Thread_local bool tile_faulted;
_Thread_local bool tpu__tile_stream;
void tpu__tile_fault(void) { tile_faulted = true; }
bool tpu__tile_take_fault(void) {
  bool f = tile_faulted;
  tile_faulted = false;
  return f;
}

/* ---- the run ------------------------------------------------------------------------ */

/* Rows shorter than this are batched: one tile then holds TILE / inner whole rows, so
 * the per-row cost (offsets, a call into the tile function) is paid once per tile. */
#define SMALL_ROW 256

typedef struct tile_run_s {
  const tpu_node_t* node;
  tpu_operand_t* out;
  const tpu_operand_t* const* ins;
  int n_in;
  tpu_dtype_t c;
  tpu_tile_fn fn;
  iter_t it;
  int64_t rows, inner;
  int64_t per_unit; /* batched: rows per tile; else tiles per row */
  bool batched;
  bool direct; /* every tile in place: dense operands in the compute dtype, no scalars */
  bool stream; /* a float32 output past the cache, written in place (tpu__tile_stream) */
  atomic_bool fault;
} tile_run_t;

/* Element offsets (in elements of each operand) of the start of row r. */
static void row_offsets(const iter_t* it, int64_t r, int64_t* off) {
  int nd = it->ndim;
  int64_t idx[TPU_MAX_DIMS];
  for (int d = nd - 2; d >= 0; --d) { idx[d] = r % it->sizes[d]; r /= it->sizes[d]; }
  for (int o = 0; o < it->nops; ++o) {
    off[o] = 0;
    for (int d = 0; d < nd - 1; ++d) off[o] += idx[d] * it->strides[o][d];
  }
}

/* Moves off (and the odometer idx) from one row to the next. */
static void row_next(const iter_t* it, int64_t* idx, int64_t* off) {
  for (int d = it->ndim - 2; d >= 0; --d) {
    for (int o = 0; o < it->nops; ++o) off[o] += it->strides[o][d];
    if (++idx[d] < it->sizes[d]) return;
    for (int o = 0; o < it->nops; ++o) off[o] -= it->strides[o][d] * it->sizes[d];
    idx[d] = 0;
  }
}

/* Units [b, e): rows*tiles_per_row tiles, or ceil(rows / rows_per_tile) row batches. */
static tpu_status_t tile_chunk(void* arg, int64_t b, int64_t e, int tid) {
  tile_run_t* R = arg;
  const iter_t* it = &R->it;
  tpu_dtype_t c = R->c;
  int n_in = R->n_in, nd = it->ndim;
  size_t csz = tpu_dtype_size(c);
  char* scratch = NULL; /* conversion and constant tiles; a direct run needs none */
  if (!R->direct) {
    if (!(scratch = tpu__malloc((size_t)(n_in + 1) * TILE * csz))) return TPU_HOST_NOMEM();
    for (int j = 0; j < n_in; ++j)
      if (R->ins[j]->is_scalar) fill_const(scratch + (size_t)(j + 1) * TILE * csz, c, R->ins[j], TILE);
  }
  const void* inp[8] = {0}; /* absent inputs stay NULL for the tile functions */
  const char* ibase[8];
  size_t isz[8];
  for (int j = 0; j < n_in; ++j) {
    isz[j] = tpu_dtype_size(R->ins[j]->dtype);
    ibase[j] = R->ins[j]->value ? tpu__operand_ptr(R->ins[j]) : NULL;
  }
  tpu_operand_t* out = R->out;
  size_t osz = tpu_dtype_size(out->dtype);
  char* obase = tpu__operand_ptr(out);
  int64_t inner = R->inner, ost = it->strides[0][nd - 1];
  int64_t idx[TPU_MAX_DIMS] = {0}, off[9];
  int64_t row = R->batched ? b * R->per_unit : b / R->per_unit;
  { int64_t r = row; for (int d = nd - 2; d >= 0; --d) { idx[d] = r % it->sizes[d]; r /= it->sizes[d]; } }
  row_offsets(it, row, off);
  bool faulted = tile_faulted;
  tile_faulted = false;
  for (int64_t u = b; u < e; ++u) {
    if (!R->batched) {
      int64_t t0 = (u % R->per_unit) * TILE;
      if (u != b && t0 == 0) row_next(it, idx, off);
      int64_t len = inner - t0 < TILE ? inner - t0 : TILE;
      for (int j = 0; j < n_in; ++j) {
        const tpu_operand_t* op = R->ins[j];
        char* buf = scratch + (size_t)(j + 1) * TILE * csz;
        if (op->is_scalar) { inp[j] = buf; continue; }
        if (!op->value) { inp[j] = NULL; continue; }
        int64_t st = it->strides[j + 1][nd - 1];
        const char* p = ibase[j] + (off[j + 1] + t0 * st) * (int64_t)isz[j];
        if (op->dtype == c && st == 1) inp[j] = p;
        else { tpu__convert_run(buf, c, 1, p, op->dtype, st, len); inp[j] = buf; }
      }
      char* op_ = obase + (off[0] + t0 * ost) * (int64_t)osz;
      /* The output tile may be an input tile (in-place ops, donated buffers): tile
       * functions compute element i from elements i in one pass (host.h). */
      if (out->dtype == c && ost == 1) {
        tpu__tile_stream = R->stream;
        R->fn(len, op_, inp, R->node);
        tpu__tile_stream = false;
      } else {
        R->fn(len, scratch, inp, R->node);
        tpu__convert_run(op_, out->dtype, ost, scratch, c, 1, len);
      }
    } else {
      /* Gather whole rows into the tiles, run once, scatter the output rows. */
      int64_t r0 = u * R->per_unit, r1 = r0 + R->per_unit < R->rows ? r0 + R->per_unit : R->rows;
      int64_t len = (r1 - r0) * inner;
      int64_t soff[9], sidx[TPU_MAX_DIMS];
      if (u != b) row_next(it, idx, off);
      memcpy(soff, off, sizeof soff);
      memcpy(sidx, idx, sizeof sidx);
      for (int j = 0; j < n_in; ++j) {
        const tpu_operand_t* op = R->ins[j];
        char* buf = scratch + (size_t)(j + 1) * TILE * csz;
        inp[j] = op->is_scalar ? buf : op->value ? buf : NULL;
      }
      for (int64_t r = r0; r < r1; ++r) {
        if (r != r0) row_next(it, idx, off);
        for (int j = 0; j < n_in; ++j) {
          const tpu_operand_t* op = R->ins[j];
          if (op->is_scalar || !op->value) continue;
          char* buf = scratch + (size_t)(j + 1) * TILE * csz + (size_t)((r - r0) * inner) * csz;
          tpu__convert_run(buf, c, 1, ibase[j] + off[j + 1] * (int64_t)isz[j], op->dtype,
                           it->strides[j + 1][nd - 1], inner);
        }
      }
      R->fn(len, scratch, inp, R->node);
      memcpy(off, soff, sizeof soff);
      memcpy(idx, sidx, sizeof sidx);
      for (int64_t r = r0; r < r1; ++r) {
        if (r != r0) row_next(it, idx, off);
        tpu__convert_run(obase + off[0] * (int64_t)osz, out->dtype, ost,
                         scratch + (size_t)((r - r0) * inner) * csz, c, 1, inner);
      }
    }
  }
  if (R->stream) tpu__stream_fence();
  if (tile_faulted) atomic_store(&R->fault, true);
  tile_faulted = faulted;
  tpu__free(scratch);
  return NULL;
}

tpu_status_t tpu__tile_run_ops(const tpu_node_t* node, tpu_operand_t* out,
                               const tpu_operand_t* const* ins, int n_in,
                               tpu_dtype_t c, tpu_tile_fn fn) {
  if (n_in > 8) return tpu_status_make(TPU_INTERNAL, "tile engine: too many inputs");
  int64_t numel = tpu__operand_numel(out);
  if (numel == 0) return NULL;
  tile_run_t R = {node, out, ins, n_in, c, fn};
  atomic_init(&R.fault, false);
  iter_build(&R.it, out, ins, n_in);
  int nd = R.it.ndim;
  R.inner = R.it.sizes[nd - 1];
  R.rows = 1;
  for (int d = 0; d < nd - 1; ++d) R.rows *= R.it.sizes[d];
  int64_t units;
  bool out_in_place = out->dtype == c && R.it.strides[0][nd - 1] == 1;
  R.direct = out_in_place;
  for (int j = 0; j < n_in; ++j)
    if (ins[j]->is_scalar || (ins[j]->value && (ins[j]->dtype != c || R.it.strides[j + 1][nd - 1] != 1)))
      R.direct = false;
  if (R.inner < SMALL_ROW && R.rows > 1) {
    out_in_place = R.direct = false; /* rows gathered into scratch */
    R.batched = true;
    R.per_unit = TILE / R.inner;
    units = (R.rows + R.per_unit - 1) / R.per_unit;
  } else {
    R.per_unit = (R.inner + TILE - 1) / TILE;
    units = R.rows * R.per_unit;
  }
  R.stream = out_in_place && c == TPU_DTYPE_F32 && numel * (int64_t)sizeof(float) >= tpu__stream_min_bytes();
  /* Elementwise work scales with elements times operands; a unit is ~TILE elements. */
  int64_t grain = TPU_PARALLEL_MIN_WORK / ((int64_t)TILE * (n_in + 1)) + 1;
  tpu_status_t st = numel * (n_in + 1) < TPU_PARALLEL_MIN_WORK ? tile_chunk(&R, 0, units, 0)
                                                               : tpu__parallel_for(units, grain, tile_chunk, &R);
  if (atomic_load(&R.fault)) tile_faulted = true;
  return st;
}

tpu_status_t tpu__tile_run(tpu_node_t* node, tpu_dtype_t c, tpu_tile_fn fn) {
  const tpu_operand_t* ins[8];
  if (node->n_in > 8) return tpu_status_make(TPU_INTERNAL, "tile engine: too many inputs");
  for (int j = 0; j < node->n_in; ++j) ins[j] = &node->in[j];
  return tpu__tile_run_ops(node, &node->out[0], ins, node->n_in, c, fn);
}

/* ---- streaming stores ---------------------------------------------------------------- */

static int64_t stream_min;
static pthread_once_t stream_once = PTHREAD_ONCE_INIT;

int64_t tpu__cache_bytes(int level) {
  int64_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 8; ++i) {
    char path[96], buf[32] = "";
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    FILE* f = fopen(path, "r");
    if (!f) break;
    int lv = 0;
    if (fscanf(f, "%d", &lv) != 1) lv = 0;
    fclose(f);
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
    if ((f = fopen(path, "r"))) {
      if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
      fclose(f);
    }
    if (strncmp(buf, "Instruction", 11) == 0 || (level ? lv != level : lv < best_level)) continue;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    if (!(f = fopen(path, "r"))) continue;
    long long v = 0;
    char unit = 0;
    if (fgets(buf, sizeof buf, f) && sscanf(buf, "%lld%c", &v, &unit) >= 1 && v > 0) {
      best = v * (unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1);
      best_level = lv;
    }
    fclose(f);
  }
  return best;
}

static void read_llc(void) {
  const char* e = getenv("TORCHTPU_STREAM_MIN_BYTES"); /* tests: force the streaming path */
  if (e && *e) {
    long long v = atoll(e);
    stream_min = v > 0 ? v : INT64_MAX;
    return;
  }
  int64_t llc = tpu__cache_bytes(0);
  if (llc <= 0) llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  stream_min = llc > 0 ? llc : 32 << 20;
}

int64_t tpu__stream_min_bytes(void) {
  pthread_once(&stream_once, read_llc);
  return stream_min;
}

void tpu__stream_copy(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  char* d = dst;
  const char* s = src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)s), b = _mm_loadu_si128((const __m128i*)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i*)(s + 32)), e = _mm_loadu_si128((const __m128i*)(s + 48));
    _mm_stream_si128((__m128i*)d, a);
    _mm_stream_si128((__m128i*)(d + 16), b);
    _mm_stream_si128((__m128i*)(d + 32), c);
    _mm_stream_si128((__m128i*)(d + 48), e);
  }
  for (; n >= 16; n -= 16, d += 16, s += 16) _mm_stream_si128((__m128i*)d, _mm_loadu_si128((const __m128i*)s));
  memcpy(d, s, n);
#else
  memcpy(dst, src, n);
#endif
}

void tpu__stream_fence(void) {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

/* ---- pack / unpack ------------------------------------------------------------------ */

/* Same-dtype strided copies: bytes move as they are (no conversion, no tile buffers), so
 * the only per-row cost is an odometer step and one memcpy or element loop. This is
 * what a transposed .contiguous(), cat and a same-dtype pack/unpack spend their time on:
 * through the tile engine (gather a tile of short rows, copy it, scatter it) a
 * [8,4,64,32] transpose took 3-6x PyTorch CPU's time. */
typedef struct scopy_s {
  int nd;
  int64_t sizes[TPU_MAX_DIMS], ds[TPU_MAX_DIMS], ss[TPU_MAX_DIMS]; /* strides in bytes */
  char* dst;
  const char* src;
  size_t esz;
  int64_t inner; /* elements of the last dim */
  bool stream;   /* dense rows bypass the cache (tpu__stream_min_bytes) */
} scopy_t;

static inline void scopy_row(char* d, int64_t dsb, const char* s, int64_t ssb, int64_t n, size_t esz, bool stream) {
  if (dsb == (int64_t)esz && ssb == (int64_t)esz) {
    if (stream) tpu__stream_copy(d, s, (size_t)n * esz);
    else memcpy(d, s, (size_t)n * esz);
    return;
  }
  switch (esz) {
    case 4: for (int64_t i = 0; i < n; ++i) memcpy(d + i * dsb, s + i * ssb, 4); break;
    case 8: for (int64_t i = 0; i < n; ++i) memcpy(d + i * dsb, s + i * ssb, 8); break;
    case 2: for (int64_t i = 0; i < n; ++i) memcpy(d + i * dsb, s + i * ssb, 2); break;
    case 1: for (int64_t i = 0; i < n; ++i) d[i * dsb] = s[i * ssb]; break;
    default: for (int64_t i = 0; i < n; ++i) memcpy(d + i * dsb, s + i * ssb, esz); break;
  }
}

static tpu_status_t scopy_rows(void* arg, int64_t rb, int64_t re, int tid) {
  const scopy_t* C = arg;
  int nd = C->nd;
  int64_t idx[TPU_MAX_DIMS] = {0}, doff = 0, soff = 0, r = rb;
  for (int d = nd - 2; d >= 0; --d) {
    idx[d] = r % C->sizes[d];
    r /= C->sizes[d];
    doff += idx[d] * C->ds[d];
    soff += idx[d] * C->ss[d];
  }
  int64_t dl = C->ds[nd - 1], sl = C->ss[nd - 1];
  for (r = rb; r < re; ++r) {
    scopy_row(C->dst + doff, dl, C->src + soff, sl, C->inner, C->esz, C->stream);
    for (int d = nd - 2; d >= 0; --d) {
      doff += C->ds[d];
      soff += C->ss[d];
      if (++idx[d] < C->sizes[d]) break;
      doff -= C->ds[d] * C->sizes[d];
      soff -= C->ss[d] * C->sizes[d];
      idx[d] = 0;
    }
  }
  if (C->stream) tpu__stream_fence();
  return NULL;
}

void tpu__strided_copy(int nd, const int64_t* sizes, void* dst, const int64_t* dst_strides,
                       const void* src, const int64_t* src_strides, size_t esz) {
  scopy_t C = {0};
  C.dst = dst;
  C.src = src;
  C.esz = esz;
  int64_t numel = 1;
  /* size-1 dims dropped, then neighbours merged where both sides are contiguous across
   * them; the innermost dim is kept last so unit-stride rows stay one memcpy */
  for (int d = 0; d < nd; ++d) {
    numel *= sizes[d];
    if (sizes[d] == 1) continue;
    int k = C.nd;
    if (k > 0 && C.ds[k - 1] == dst_strides[d] * sizes[d] * (int64_t)esz &&
        C.ss[k - 1] == src_strides[d] * sizes[d] * (int64_t)esz) {
      C.sizes[k - 1] *= sizes[d];
      C.ds[k - 1] = dst_strides[d] * (int64_t)esz;
      C.ss[k - 1] = src_strides[d] * (int64_t)esz;
      continue;
    }
    C.sizes[k] = sizes[d];
    C.ds[k] = dst_strides[d] * (int64_t)esz;
    C.ss[k] = src_strides[d] * (int64_t)esz;
    C.nd = k + 1;
  }
  if (numel == 0) return;
  if (C.nd == 0) { memcpy(dst, src, esz); return; }
  C.stream = numel * (int64_t)esz >= tpu__stream_min_bytes();
  C.inner = C.sizes[C.nd - 1];
  int64_t rows = numel / C.inner;
  /* one long row: split it into pieces, each its own "row" */
  if (rows == 1 && numel >= 8 * TPU_PARALLEL_MIN_WORK) {
    int64_t piece = 4 * TPU_PARALLEL_MIN_WORK;
    C.nd = 2;
    C.sizes[1] = piece;
    C.ds[1] = C.ds[0];
    C.ss[1] = C.ss[0];
    if (numel % piece) { /* the tail first, then whole pieces */
      int64_t whole = numel / piece * piece;
      scopy_row((char*)dst + whole * C.ds[0], C.ds[0], (const char*)src + whole * C.ss[0], C.ss[0],
                numel - whole, esz, C.stream);
      if (C.stream) tpu__stream_fence();
      numel = whole;
    }
    C.sizes[0] = numel / piece;
    C.ds[0] *= piece;
    C.ss[0] *= piece;
    C.inner = piece;
    rows = C.sizes[0];
  }
  /* a copy is 2 touches per element, like a one-input elementwise node */
  if (2 * numel >= 4 * TPU_PARALLEL_MIN_WORK && rows > 1)
    tpu_status_free(tpu__parallel_for(rows, 2 * TPU_PARALLEL_MIN_WORK / C.inner + 1, scopy_rows, &C));
  else
    scopy_rows(&C, 0, rows, 0);
}

typedef struct walk_s {
  int nd;
  int64_t sizes[TPU_MAX_DIMS], strides[TPU_MAX_DIMS];
  int64_t inner, ist;
  tpu_dtype_t op_dtype, dt;
  char* base;
  char* dense;
  bool to_dense;
  int64_t piece; /* > 0: one long row split into pieces of this many elements */
} walk_t;

static tpu_status_t walk_rows(void* arg, int64_t rb, int64_t re, int tid) {
  walk_t* W = arg;
  int nd = W->nd;
  size_t dsz = tpu_dtype_size(W->dt), osz = tpu_dtype_size(W->op_dtype);
  if (W->piece) {
    int64_t b = rb * W->piece, e = re * W->piece < W->inner ? re * W->piece : W->inner;
    char* p = W->base + b * W->ist * (int64_t)osz;
    char* q = W->dense + b * (int64_t)dsz;
    if (W->to_dense) tpu__convert_run(q, W->dt, 1, p, W->op_dtype, W->ist, e - b);
    else tpu__convert_run(p, W->op_dtype, W->ist, q, W->dt, 1, e - b);
    return NULL;
  }
  int64_t idx[TPU_MAX_DIMS] = {0}, off = 0;
  int64_t r = rb;
  for (int d = nd - 2; d >= 0; --d) { idx[d] = r % W->sizes[d]; r /= W->sizes[d]; }
  for (int d = 0; d < nd - 1; ++d) off += idx[d] * W->strides[d];
  for (r = rb; r < re; ++r) {
    char* p = W->base + off * (int64_t)osz;
    char* q = W->dense + r * W->inner * (int64_t)dsz;
    if (W->to_dense) tpu__convert_run(q, W->dt, 1, p, W->op_dtype, W->ist, W->inner);
    else tpu__convert_run(p, W->op_dtype, W->ist, q, W->dt, 1, W->inner);
    for (int d = nd - 2; d >= 0; --d) {
      off += W->strides[d];
      if (++idx[d] < W->sizes[d]) break;
      off -= W->strides[d] * W->sizes[d];
      idx[d] = 0;
    }
  }
  return NULL;
}

static void walk(tpu_operand_t* op, const int* perm, tpu_dtype_t dt, char* dense, bool to_dense) {
  walk_t W;
  int nd = W.nd = op->ndim;
  for (int d = 0; d < nd; ++d) {
    int s = perm ? perm[d] : d;
    W.sizes[d] = op->sizes[s];
    W.strides[d] = op->strides[s];
  }
  int64_t numel = 1;
  for (int d = 0; d < nd; ++d) numel *= W.sizes[d];
  if (numel == 0) return;
  size_t dsz = tpu_dtype_size(dt);
  if (op->is_scalar) {
    if (!to_dense) return;
    if (tpu_dtype_is_complex(dt)) { fill_const(dense, dt, op, numel); return; }
    for (int64_t i = 0; i < numel; ++i) {
      if (tpu_dtype_is_floating(dt)) tpu__store_f64(dense + i * (int64_t)dsz, dt, op->scalar_d);
      else tpu__store_i64(dense + i * (int64_t)dsz, dt, op->scalar_i);
    }
    return;
  }
  if (dt == op->dtype) {
    int64_t dense_st[TPU_MAX_DIMS], st = 1;
    for (int d = nd - 1; d >= 0; --d) { dense_st[d] = st; st *= W.sizes[d]; }
    char* base = tpu__operand_ptr(op);
    if (to_dense) tpu__strided_copy(nd, W.sizes, dense, dense_st, base, W.strides, dsz);
    else tpu__strided_copy(nd, W.sizes, base, W.strides, dense, dense_st, dsz);
    return;
  }
  W.inner = nd ? W.sizes[nd - 1] : 1;
  W.ist = nd ? W.strides[nd - 1] : 0;
  W.op_dtype = op->dtype;
  W.dt = dt;
  W.base = tpu__operand_ptr(op);
  W.dense = dense;
  W.to_dense = to_dense;
  int64_t rows = numel / W.inner;
  W.piece = 0;
  if (rows == 1 && numel >= 4 * TPU_PARALLEL_MIN_WORK) {
    W.piece = 4 * TPU_PARALLEL_MIN_WORK;
    rows = (numel + W.piece - 1) / W.piece;
  }
  /* Conversions of large tensors split by rows; each row is written by one thread. */
  if (numel >= 4 * TPU_PARALLEL_MIN_WORK && rows > 1)
    tpu_status_free(tpu__parallel_for(rows, W.piece ? 1 : 4 * TPU_PARALLEL_MIN_WORK / W.inner + 1, walk_rows, &W));
  else
    walk_rows(&W, 0, rows, 0);
}

void tpu__pack(const tpu_operand_t* op, const int* perm, tpu_dtype_t dt, void* dst) {
  walk((tpu_operand_t*)op, perm, dt, dst, true);
}

void* tpu__pack_alloc(const tpu_operand_t* op, tpu_dtype_t dt) {
  uint64_t n;
  if (!tpu__mul_ok((uint64_t)tpu__operand_numel(op), tpu_dtype_size(dt), &n)) return NULL;
  void* p = tpu__malloc(n);
  if (p) tpu__pack(op, NULL, dt, p);
  return p;
}

void tpu__unpack(tpu_operand_t* op, const void* src, tpu_dtype_t dt) {
  walk(op, NULL, dt, (char*)src, false);
}

const void* tpu__dense_in(const tpu_operand_t* op, tpu_dtype_t dt, void** owned) {
  *owned = NULL;
  if (op->dtype == dt && tpu__operand_is_contiguous(op)) return tpu__operand_ptr(op);
  *owned = tpu__pack_alloc(op, dt);
  return *owned;
}

void* tpu__dense_out(const tpu_node_t* n, tpu_operand_t* op, tpu_dtype_t dt, bool zero, void** owned) {
  *owned = NULL;
  bool direct = op->dtype == dt && tpu__operand_is_contiguous(op);
  for (int i = 0; i < n->n_in && direct; ++i) direct = n->in[i].value != op->value;
  uint64_t bytes;
  if (direct) {
    if (zero && tpu__mul_ok((uint64_t)tpu__operand_numel(op), tpu_dtype_size(dt), &bytes) && bytes)
      memset(tpu__operand_ptr(op), 0, (size_t)bytes);
    return tpu__operand_ptr(op);
  }
  if (!tpu__mul_ok((uint64_t)tpu__operand_numel(op), tpu_dtype_size(dt), &bytes)) return NULL;
  *owned = tpu__calloc(1, (size_t)(bytes ? bytes : 1));
  return *owned;
}

void tpu__dense_out_done(tpu_operand_t* op, void* owned, tpu_dtype_t dt) {
  if (owned) tpu__unpack(op, owned, dt);
}
