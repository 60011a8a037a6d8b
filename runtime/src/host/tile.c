/* The tile engine and dtype conversions of the host driver.
 *
 * Elementwise nodes run row by row over their (coalesced) iteration space, in tiles of
 * TILE elements. An input already dense in the compute dtype is read in place; others
 * are converted into a small per-input tile buffer, so every kernel sees dense tiles of
 * one dtype. The same loop is the building block the fused interpreter of
 * defer_and_fuse will chain (docs/architecture.md). */
#include "host/host.h"

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

void tpu__convert_run(void* dst, tpu_dtype_t dt, int64_t ds, const void* src,
                      tpu_dtype_t st, int64_t ss, int64_t n) {
  char* d = dst;
  const char* s = src;
  if (dt == st && ds == 1 && ss == 1) {
    memcpy(d, s, (size_t)n * tpu_dtype_size(dt));
    return;
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
  if (c == TPU_DTYPE_F32) { float v = (float)s->scalar_d; for (int64_t i = 0; i < n; ++i) ((float*)buf)[i] = v; }
  else if (c == TPU_DTYPE_F64) { for (int64_t i = 0; i < n; ++i) ((double*)buf)[i] = s->scalar_d; }
  else { for (int64_t i = 0; i < n; ++i) ((int64_t*)buf)[i] = s->scalar_i; }
}

tpu_status_t tpu__tile_run_ops(const tpu_node_t* node, tpu_operand_t* out,
                               const tpu_operand_t* const* ins, int n_in,
                               tpu_dtype_t c, tpu_tile_fn fn) {
  if (n_in > 8) return tpu_status_make(TPU_INTERNAL, "tile engine: too many inputs");
  if (tpu__operand_numel(out) == 0) return NULL;
  iter_t it;
  iter_build(&it, out, ins, n_in);
  size_t csz = tpu_dtype_size(c);
  char* scratch = tpu__malloc((size_t)(n_in + 1) * TILE * csz);
  if (!scratch) return TPU_HOST_NOMEM();
  for (int j = 0; j < n_in; ++j)
    if (ins[j]->is_scalar) fill_const(scratch + (size_t)(j + 1) * TILE * csz, c, ins[j], TILE);

  int nd = it.ndim;
  int64_t inner = it.sizes[nd - 1];
  int64_t rows = 1;
  for (int d = 0; d < nd - 1; ++d) rows *= it.sizes[d];
  int64_t idx[TPU_MAX_DIMS] = {0};
  const void* inp[8] = {0}; /* absent inputs stay NULL for the tile functions */
  size_t osz = tpu_dtype_size(out->dtype);
  char* obase = tpu__operand_ptr(out);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off[9];
    for (int o = 0; o < it.nops; ++o) {
      off[o] = 0;
      for (int d = 0; d < nd - 1; ++d) off[o] += idx[d] * it.strides[o][d];
    }
    for (int64_t t0 = 0; t0 < inner; t0 += TILE) {
      int64_t len = inner - t0 < TILE ? inner - t0 : TILE;
      for (int j = 0; j < n_in; ++j) {
        const tpu_operand_t* op = ins[j];
        char* buf = scratch + (size_t)(j + 1) * TILE * csz;
        if (op->is_scalar) { inp[j] = buf; continue; }
        if (!op->value) { inp[j] = NULL; continue; } /* absent optional input */
        int64_t st = it.strides[j + 1][nd - 1];
        size_t isz = tpu_dtype_size(op->dtype);
        const char* p = tpu__operand_ptr(op) + (off[j + 1] + t0 * st) * (int64_t)isz;
        if (op->dtype == c && st == 1) inp[j] = p;
        else { tpu__convert_run(buf, c, 1, p, op->dtype, st, len); inp[j] = buf; }
      }
      int64_t ost = it.strides[0][nd - 1];
      char* op_ = obase + (off[0] + t0 * ost) * (int64_t)osz;
      if (out->dtype == c && ost == 1) {
        fn(len, op_, inp, node);
      } else {
        fn(len, scratch, inp, node);
        tpu__convert_run(op_, out->dtype, ost, scratch, c, 1, len);
      }
    }
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < it.sizes[d]) break;
      idx[d] = 0;
    }
  }
  tpu__free(scratch);
  return NULL;
}

tpu_status_t tpu__tile_run(tpu_node_t* node, tpu_dtype_t c, tpu_tile_fn fn) {
  const tpu_operand_t* ins[8];
  if (node->n_in > 8) return tpu_status_make(TPU_INTERNAL, "tile engine: too many inputs");
  for (int j = 0; j < node->n_in; ++j) ins[j] = &node->in[j];
  return tpu__tile_run_ops(node, &node->out[0], ins, node->n_in, c, fn);
}

/* ---- pack / unpack ------------------------------------------------------------------ */

static void walk(tpu_operand_t* op, const int* perm, tpu_dtype_t dt, char* dense, bool to_dense) {
  int nd = op->ndim;
  int64_t sizes[TPU_MAX_DIMS], strides[TPU_MAX_DIMS];
  for (int d = 0; d < nd; ++d) {
    int s = perm ? perm[d] : d;
    sizes[d] = op->sizes[s];
    strides[d] = op->strides[s];
  }
  int64_t numel = 1;
  for (int d = 0; d < nd; ++d) numel *= sizes[d];
  if (numel == 0) return;
  size_t dsz = tpu_dtype_size(dt);
  if (op->is_scalar) {
    if (!to_dense) return;
    for (int64_t i = 0; i < numel; ++i) {
      if (tpu_dtype_is_floating(dt)) tpu__store_f64(dense + i * (int64_t)dsz, dt, op->scalar_d);
      else tpu__store_i64(dense + i * (int64_t)dsz, dt, op->scalar_i);
    }
    return;
  }
  int64_t inner = nd ? sizes[nd - 1] : 1, ist = nd ? strides[nd - 1] : 0;
  int64_t rows = numel / inner;
  size_t osz = tpu_dtype_size(op->dtype);
  char* base = tpu__operand_ptr(op);
  int64_t idx[TPU_MAX_DIMS] = {0};
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; ++d) off += idx[d] * strides[d];
    char* p = base + off * (int64_t)osz;
    char* q = dense + r * inner * (int64_t)dsz;
    if (to_dense) tpu__convert_run(q, dt, 1, p, op->dtype, ist, inner);
    else tpu__convert_run(p, op->dtype, ist, q, dt, 1, inner);
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
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
