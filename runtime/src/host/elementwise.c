/* Elementwise kernels of the host driver: tile functions per op kind and compute dtype.
 * Inputs arrive as dense tiles in node->compute; attributes: da[0] = alpha (add/sub). */
#include <tgmath.h>

#include "host/host.h"

/* Generates name_f32/_f64/_i64 tile functions from one expression over a, b (and c). */
#define TILE3(name, EXPR_F, EXPR_I)                                                     \
  static void name##_f32(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    float* r = o; const float* A = in[0]; const float* B = in[1]; const float* C = in[2];  \
    float alpha = (float)nd->da[0]; (void)alpha; (void)B; (void)C;                       \
    for (int64_t i = 0; i < n; ++i) { float a = A[i]; float b = B ? B[i] : 0; float c = C ? C[i] : 0; (void)b; (void)c; r[i] = (EXPR_F); } \
  }                                                                                     \
  static void name##_f64(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    double* r = o; const double* A = in[0]; const double* B = in[1]; const double* C = in[2]; \
    double alpha = nd->da[0]; (void)alpha;                                              \
    for (int64_t i = 0; i < n; ++i) { double a = A[i]; double b = B ? B[i] : 0; double c = C ? C[i] : 0; (void)b; (void)c; r[i] = (EXPR_F); } \
  }                                                                                     \
  static void name##_i64(int64_t n, void* o, const void* const* in, const tpu_node_t* nd) { \
    int64_t* r = o; const int64_t* A = in[0]; const int64_t* B = in[1]; const int64_t* C = in[2]; \
    int64_t alpha = nd->ia[0]; (void)alpha;                                             \
    for (int64_t i = 0; i < n; ++i) { int64_t a = A[i]; int64_t b = B ? B[i] : 0; int64_t c = C ? C[i] : 0; (void)b; (void)c; r[i] = (EXPR_I); } \
  }

TILE3(add, a + alpha * b, (int64_t)((uint64_t)a + (uint64_t)alpha * (uint64_t)b))
TILE3(sub, a - alpha * b, (int64_t)((uint64_t)a - (uint64_t)alpha * (uint64_t)b))
TILE3(mul, a * b, (int64_t)((uint64_t)a * (uint64_t)b))
TILE3(div, a / b, b ? a / b : 0)
TILE3(eq, a == b, a == b)
TILE3(ne, a != b, a != b)
TILE3(lt, a < b, a < b)
TILE3(le, a <= b, a <= b)
TILE3(gt, a > b, a > b)
TILE3(ge, a >= b, a >= b)
TILE3(neg, -a, (int64_t)(0 - (uint64_t)a))
TILE3(exp, exp(a), a)
TILE3(fill, a, a)
TILE3(where, a != 0 ? b : c, a != 0 ? b : c)

typedef struct { tpu_tile_fn f32, f64, i64; } tiles_t;
static tiles_t tiles[TPU_KIND_COUNT];

static tpu_status_t run_tiles(tpu_node_t* n) {
  const tiles_t* t = &tiles[n->kind];
  tpu_tile_fn fn = n->compute == TPU_DTYPE_F32 ? t->f32 : n->compute == TPU_DTYPE_F64 ? t->f64 : t->i64;
  if (!fn) return tpu_status_make(TPU_UNIMPLEMENTED, "%s: no host kernel for %s",
                                  tpu__node_describe(n), tpu_dtype_name(n->compute));
  return tpu__tile_run(n, n->compute, fn);
}

#define REG(K, name) tiles[TPU_KIND_##K] = (tiles_t){name##_f32, name##_f64, name##_i64}; table[TPU_KIND_##K] = run_tiles;

void tpu__host_register_elementwise(tpu_host_kernel_fn* table) {
  REG(ADD, add) REG(SUB, sub) REG(MUL, mul) REG(DIV, div) REG(EQ, eq) REG(NE, ne) REG(LT, lt)
  REG(LE, le) REG(GT, gt) REG(GE, ge) REG(NEG, neg) REG(EXP, exp) REG(FILL, fill) REG(WHERE, where)
}
