/* Host kernels of the index and shape family.
 *
 * Every kernel first packs its inputs into dense row-major buffers and builds the
 * result densely before unpacking it into output 0. Packing before writing makes
 * in-place forms safe (output 0 aliases input 0) and lets the index arithmetic assume
 * row-major strides. Pure data movement copies elements of the output's dtype as bytes;
 * arithmetic (scatter reductions, index_add, index_put accumulate) runs in a working
 * type (double for floating dtypes, int64 otherwise) and rounds or wraps to the
 * output's dtype after every update, so repeated updates round exactly as PyTorch
 * CPU's sequential loops in the tensor's own dtype do.
 *
 * Node layouts (set by aten/index.c):
 *   GATHER        in: self, index                 ia[0] dim
 *   SCATTER       in: self, index, src|scalar     ia[0] dim, ia[1] reduce, ia[2] include_self
 *   INDEX_SELECT  in: self, index                 ia[0] dim
 *   INDEX_ACC     in: self, index, source         ia[0] dim, ia[1] add?, da[0]/ia[2] alpha
 *   INDEX         in: self, entries...            ilist: plan (see aten/index.c)
 *   INDEX_PUT     in: self, values, entries...    ia[1] accumulate, ilist: plan
 *   MASKED_SELECT in: self, mask                  ia[0] count, ilist: broadcast shape
 *   MASKED_SCATTER in: self, mask, source
 *   NONZERO       in: self                        ia[0] count
 *   BINCOUNT      in: self, weights?              out: counts (i64) or weight sums (compute)
 *   CAT           in: tensors...                  ia[0] dim
 *   FLIP          in: self                        ilist: 1 per flipped dim
 *   ROLL          in: self                        ilist: shift per dim; ia[0] flat, ia[1] shift
 *   REPEAT        in: self
 *   PAD           in: self, value                 ilist: padding before each dim
 *   TRIL          in: self                        ia[0] diagonal, ia[1] upper
 *   SORT          in: self                        ia[0] dim, ia[1] descending, ia[2] k or -1
 *   ARANGE        (none)                          da[0] start, da[1] step, ia[0..1] int forms
 *   EYE           (none)
 *   LINSPACE      (none)                          ia[0] steps, da[0..1]/ia[1..2] start, end
 *                                                 (ia[4] bit k: integer), ia[3] log, da[2] base
 *   SEARCHSORTED  in: boundaries, values, sorter|absent   ia[0] right, ia[1] compare dtype
 *   ISIN          in: elements, test elements     ia[0] invert, ia[1] compare dtype,
 *                                                 ia[2] sort-and-mark (assume_unique)
 *   REPEAT_INTERLEAVE in: repeats                 ia[0] output length */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "host/host.h"

enum { RED_NONE = 0, RED_SUM, RED_PROD, RED_MEAN, RED_AMAX, RED_AMIN };

/* ---- helpers ---------------------------------------------------------------------- */

static void* xalloc(int64_t count, size_t size) {
  uint64_t n;
  if (count < 0 || !tpu__mul_ok((uint64_t)count, size, &n)) return NULL;
  return tpu__malloc(n ? n : 1);
}

/* Packs op into a dense buffer; never NULL for an empty operand unless host OOM. */
static void* pack(const tpu_operand_t* op, tpu_dtype_t dt) {
  void* p = xalloc(tpu__operand_numel(op), tpu_dtype_size(dt));
  if (p) tpu__pack(op, NULL, dt, p);
  return p;
}

/* Packs op broadcast (right-aligned) to shape. */
static void* pack_bcast(const tpu_operand_t* op, int nd, const int64_t* shape, tpu_dtype_t dt) {
  tpu_operand_t t = *op;
  t.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    int sd = d - (nd - (op->is_scalar ? 0 : op->ndim));
    t.sizes[d] = shape[d];
    t.strides[d] = !op->is_scalar && sd >= 0 && op->sizes[sd] != 1 ? op->strides[sd] : 0;
  }
  return pack(&t, dt);
}

static void dense_strides(int nd, const int64_t* sizes, int64_t* st) {
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; --d) { st[d] = s; s *= sizes[d]; }
}

static void next_coord(int64_t* c, const int64_t* sizes, int nd) {
  for (int d = nd - 1; d >= 0; --d) {
    if (++c[d] < sizes[d]) return;
    c[d] = 0;
  }
}

static tpu_dtype_t work_dtype(tpu_dtype_t t) { return tpu_dtype_is_floating(t) ? TPU_DTYPE_F64 : TPU_DTYPE_I64; }

/* Rounds a double to the precision of dtype t (the value is then exact in t). */
static int64_t wrap_to(int64_t v, tpu_dtype_t t) {
  switch (t) {
    case TPU_DTYPE_U8: return (uint8_t)v;
    case TPU_DTYPE_I8: return (int8_t)v;
    case TPU_DTYPE_I16: return (int16_t)v;
    case TPU_DTYPE_I32: return (int32_t)v;
    case TPU_DTYPE_BOOL: return v != 0;
    default: return v;
  }
}

/* 0-dim operands act as 1-element 1-dim ones for gather/scatter/index_*. */
static int ne_shape(const tpu_operand_t* op, int64_t* sizes) {
  if (op->ndim == 0) { sizes[0] = 1; return 1; }
  memcpy(sizes, op->sizes, sizeof(int64_t) * (size_t)op->ndim);
  return op->ndim;
}

static tpu_status_t oob(const tpu_node_t* n, tpu_status_code_t code, int64_t v, int dim, int64_t size) {
  return tpu_status_make(code, "%s: index %lld is out of bounds for dimension %d with size %lld",
                         tpu__node_describe(n), (long long)v, dim, (long long)size);
}

/* ---- gather / scatter ------------------------------------------------------------ */

static tpu_status_t gather_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  int dim = (int)n->ia[0];
  int64_t ss[TPU_MAX_DIMS], is[TPU_MAX_DIMS], sst[TPU_MAX_DIMS];
  int nd = ne_shape(&n->in[0], ss);
  ne_shape(&n->in[1], is);
  dense_strides(nd, ss, sst);
  size_t es = tpu_dtype_size(out->dtype);
  int64_t ni = tpu__operand_numel(&n->in[1]);
  char* src = pack(&n->in[0], out->dtype);
  int64_t* idx = pack(&n->in[1], TPU_DTYPE_I64);
  char* res = xalloc(ni, es);
  tpu_status_t st = NULL;
  if (!src || !idx || !res) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t c[TPU_MAX_DIMS] = {0};
  for (int64_t k = 0; k < ni; ++k, next_coord(c, is, nd)) {
    int64_t v = idx[k];
    if (v < 0 || v >= ss[dim]) { st = oob(n, TPU_INVALID_ARGUMENT, v, dim, ss[dim]); goto done; }
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) off += (d == dim ? v : c[d]) * sst[d];
    memcpy(res + (size_t)k * es, src + (size_t)off * es, es);
  }
  tpu__unpack(out, res, out->dtype);
done:
  tpu__free(src); tpu__free(idx); tpu__free(res);
  return st;
}

/* One reduction step in the working type, rounded/wrapped to dtype t. */
static void reduce_f(double* a, double b, int red, tpu_dtype_t t) {
  switch (red) {
    case RED_NONE: *a = b; return;
    case RED_SUM: case RED_MEAN: *a = tpu__round_to_dtype(*a + b, t); return;
    case RED_PROD: *a = tpu__round_to_dtype(*a * b, t); return;
    case RED_AMAX: *a = isnan(b) || b > *a ? b : *a; return;
    case RED_AMIN: *a = isnan(b) || b < *a ? b : *a; return;
  }
}

static void reduce_i(int64_t* a, int64_t b, int red, tpu_dtype_t t) {
  switch (red) {
    case RED_NONE: *a = b; return;
    case RED_SUM: case RED_MEAN: *a = wrap_to((int64_t)((uint64_t)*a + (uint64_t)b), t); return;
    case RED_PROD: *a = wrap_to((int64_t)((uint64_t)*a * (uint64_t)b), t); return;
    case RED_AMAX: *a = b > *a ? b : *a; return;
    case RED_AMIN: *a = b < *a ? b : *a; return;
  }
}

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

static tpu_status_t scatter_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  const tpu_operand_t* srcop = &n->in[2];
  int dim = (int)n->ia[0], red = (int)n->ia[1];
  bool include_self = n->ia[2] != 0;
  tpu_dtype_t t = out->dtype, w = work_dtype(t);
  bool flt = w == TPU_DTYPE_F64;
  int64_t ss[TPU_MAX_DIMS], is[TPU_MAX_DIMS], rs[TPU_MAX_DIMS], sst[TPU_MAX_DIMS], rst[TPU_MAX_DIMS];
  int nd = ne_shape(&n->in[0], ss);
  ne_shape(&n->in[1], is);
  dense_strides(nd, ss, sst);
  if (!srcop->is_scalar) { ne_shape(srcop, rs); dense_strides(nd, rs, rst); }
  int64_t ns = tpu__operand_numel(&n->in[0]), ni = tpu__operand_numel(&n->in[1]);
  void* work = pack(&n->in[0], w);
  int64_t* idx = pack(&n->in[1], TPU_DTYPE_I64);
  void* src = srcop->is_scalar ? NULL : pack(srcop, w);
  int64_t* cnt = red == RED_MEAN ? xalloc(ns, sizeof(int64_t)) : NULL;
  uint8_t* touched = !include_self ? tpu__calloc((size_t)(ns ? ns : 1), 1) : NULL;
  tpu_status_t st = NULL;
  if (!work || !idx || (!srcop->is_scalar && !src) || (red == RED_MEAN && !cnt) || (!include_self && !touched)) {
    st = TPU_HOST_NOMEM();
    goto done;
  }
  if (cnt) for (int64_t i = 0; i < ns; ++i) cnt[i] = include_self ? 1 : 0;
  double sv_f = tpu__round_to_dtype(srcop->scalar_d, t);
  int64_t sv_i = wrap_to(srcop->scalar_i, t);
  if (srcop->is_scalar && t == TPU_DTYPE_BOOL) sv_i = srcop->scalar_d != 0;
  int64_t c[TPU_MAX_DIMS] = {0};
  for (int64_t k = 0; k < ni; ++k, next_coord(c, is, nd)) {
    int64_t v = idx[k];
    if (v < 0 || v >= ss[dim]) { st = oob(n, TPU_INVALID_ARGUMENT, v, dim, ss[dim]); goto done; }
    int64_t o = 0, so = 0;
    for (int d = 0; d < nd; ++d) {
      o += (d == dim ? v : c[d]) * sst[d];
      if (src) so += c[d] * rst[d];
    }
    int r = red;
    if (touched && !touched[o]) { touched[o] = 1; r = RED_NONE; }
    if (flt) reduce_f((double*)work + o, src ? ((double*)src)[so] : sv_f, r, t);
    else reduce_i((int64_t*)work + o, src ? ((int64_t*)src)[so] : sv_i, r, t);
    if (cnt) cnt[o]++;
  }
  if (cnt)
    for (int64_t i = 0; i < ns; ++i) {
      if (cnt[i] <= 1) continue;
      if (flt) ((double*)work)[i] = tpu__round_to_dtype(((double*)work)[i] / (double)cnt[i], t);
      else ((int64_t*)work)[i] = floor_div(((int64_t*)work)[i], cnt[i]);
    }
  tpu__unpack(out, work, w);
done:
  tpu__free(work); tpu__free(idx); tpu__free(src); tpu__free(cnt); tpu__free(touched);
  return st;
}

/* ---- index_select / index_add / index_copy ---------------------------------------- */

/* Splits a dense shape at dim into (outer, size, inner). */
static void split_at(const tpu_operand_t* op, int dim, int64_t* outer, int64_t* size, int64_t* inner) {
  *outer = 1; *inner = 1; *size = op->ndim ? op->sizes[dim] : 1;
  for (int d = 0; d < op->ndim; ++d) {
    if (d < dim) *outer *= op->sizes[d];
    if (d > dim) *inner *= op->sizes[d];
  }
}

typedef struct isel_s {
  const char* src;
  char* res;
  const int64_t* idx;
  int64_t ni, size, inner;
  size_t es;
} isel_t;

/* Units are (outer, j) row copies, checked indices only. */
static tpu_status_t isel_rows(void* arg, int64_t b, int64_t e, int tid) {
  isel_t* S = arg;
  for (int64_t u = b; u < e; ++u) {
    int64_t o = u / S->ni, j = u % S->ni;
    memcpy(S->res + (size_t)(u * S->inner) * S->es, S->src + (size_t)((o * S->size + S->idx[j]) * S->inner) * S->es,
           (size_t)S->inner * S->es);
  }
  return NULL;
}

static tpu_status_t index_select_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  int dim = (int)n->ia[0];
  size_t es = tpu_dtype_size(out->dtype);
  int64_t outer, size, inner;
  split_at(&n->in[0], dim, &outer, &size, &inner);
  int64_t ni = tpu__operand_numel(&n->in[1]);
  char* src = pack(&n->in[0], out->dtype);
  int64_t* idx = pack(&n->in[1], TPU_DTYPE_I64);
  char* res = xalloc(outer * ni * inner, es);
  tpu_status_t st = NULL;
  if (!src || !idx || !res) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t j = 0; j < ni; ++j)
    if (idx[j] < 0 || idx[j] >= size) {
      st = tpu_status_make(TPU_INDEX_ERROR, "%s: index out of range in self (index %lld, size %lld)",
                           tpu__node_describe(n), (long long)idx[j], (long long)size);
      goto done;
    }
  {
    isel_t S = {src, res, idx, ni, size, inner, es};
    int64_t units = outer * ni;
    if (units > 1 && units * inner >= TPU_PARALLEL_MIN_WORK)
      tpu_status_free(tpu__parallel_for(units, TPU_PARALLEL_MIN_WORK / (inner > 0 ? inner : 1) + 1, isel_rows, &S));
    else
      isel_rows(&S, 0, units, 0);
  }
  tpu__unpack(out, res, out->dtype);
done:
  tpu__free(src); tpu__free(idx); tpu__free(res);
  return st;
}

static tpu_status_t index_acc_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  int dim = (int)n->ia[0];
  bool add = n->ia[1] != 0;
  tpu_dtype_t t = out->dtype, w = work_dtype(t);
  bool flt = w == TPU_DTYPE_F64;
  int64_t outer, size, inner;
  split_at(&n->in[0], dim, &outer, &size, &inner);
  int64_t ni = tpu__operand_numel(&n->in[1]);
  void* work = pack(&n->in[0], w);
  int64_t* idx = pack(&n->in[1], TPU_DTYPE_I64);
  void* src = pack(&n->in[2], w);
  tpu_status_t st = NULL;
  if (!work || !idx || !src) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t j = 0; j < ni; ++j)
    if (idx[j] < 0 || idx[j] >= size) {
      st = add ? oob(n, TPU_INVALID_ARGUMENT, idx[j], dim, size)
               : tpu_status_make(TPU_INDEX_ERROR, "index_copy_(): index %lld is out of bounds for dimension %d "
                                 "with size %lld", (long long)idx[j], dim, (long long)size);
      goto done;
    }
  double af = n->da[0];
  int64_t ai = n->ia[2];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < ni; ++j) {
      int64_t d0 = (o * size + idx[j]) * inner, s0 = (o * ni + j) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        if (flt) {
          double* a = (double*)work + d0 + i;
          double b = ((double*)src)[s0 + i];
          *a = add ? tpu__round_to_dtype(*a + af * b, t) : b;
        } else {
          int64_t* a = (int64_t*)work + d0 + i;
          int64_t b = ((int64_t*)src)[s0 + i];
          *a = add ? wrap_to((int64_t)((uint64_t)*a + (uint64_t)ai * (uint64_t)b), t) : b;
        }
      }
    }
  tpu__unpack(out, work, w);
done:
  tpu__free(work); tpu__free(idx); tpu__free(src);
  return st;
}

/* ---- advanced indexing ------------------------------------------------------------ */

/* The resolved plan: for each element of the broadcast index shape B, the offset it
 * selects in dense self (off_b), and the offsets of the sliced dims placed before B
 * (pre) and after it (post) in the result. Result element (a, p, c) is
 * self[pre[a] + off_b[p] + post[c]]. */
typedef struct resolved_s {
  int64_t nb, npre, npost;
  int64_t *off_b, *pre, *post;
} resolved_t;

static void resolved_free(resolved_t* r) {
  tpu__free(r->off_b); tpu__free(r->pre); tpu__free(r->post);
}

static bool is_mask(tpu_dtype_t t) { return t == TPU_DTYPE_BOOL || t == TPU_DTYPE_U8; }

/* Offsets of every coordinate of the listed dims, row-major over the list. */
static int64_t* dim_offsets(const int* dims, int k, const int64_t* sizes, const int64_t* st, int64_t* out_n) {
  int64_t n = 1, sz[TPU_MAX_DIMS];
  for (int i = 0; i < k; ++i) { sz[i] = sizes[dims[i]]; n *= sz[i]; }
  int64_t* r = xalloc(n, sizeof(int64_t));
  if (!r) return NULL;
  int64_t c[TPU_MAX_DIMS] = {0};
  for (int64_t j = 0; j < n; ++j, next_coord(c, sz, k)) {
    int64_t o = 0;
    for (int i = 0; i < k; ++i) o += c[i] * st[dims[i]];
    r[j] = o;
  }
  *out_n = n;
  return r;
}

static tpu_status_t resolve(const tpu_node_t* n, int first_entry, resolved_t* r) {
  memset(r, 0, sizeof *r);
  const tpu_operand_t* self = &n->in[0];
  int nd = self->ndim, n_entries = n->n_in - first_entry;
  const int64_t* il = n->ilist;
  int nB = (int)il[0];
  const int64_t* B = il + 1;
  const int64_t* codes = B + nB;
  const int64_t* counts = codes + nd;
  int64_t sst[TPU_MAX_DIMS];
  dense_strides(nd, self->sizes, sst);
  int64_t* bufs[TPU_MAX_DIMS] = {0};
  tpu_status_t st = NULL;
  r->nb = 1;
  for (int i = 0; i < nB; ++i) r->nb *= B[i];
  r->off_b = xalloc(r->nb, sizeof(int64_t));
  if (!r->off_b) { st = TPU_HOST_NOMEM(); goto done; }
  memset(r->off_b, 0, (size_t)r->nb * sizeof(int64_t));
  /* expand entries: long indices as packed, masks into coordinate lists */
  for (int e = 0; e < n_entries; ++e) {
    const tpu_operand_t* op = &n->in[first_entry + e];
    if (!op->value) continue;
    int64_t* v = pack(op, TPU_DTYPE_I64);
    if (!v) { st = TPU_HOST_NOMEM(); goto done; }
    if (!is_mask(op->dtype)) { bufs[e] = v; continue; }
    int64_t m = tpu__operand_numel(op), cnt = 0;
    for (int64_t i = 0; i < m; ++i) cnt += v[i] != 0;
    if (cnt != counts[e]) {
      tpu__free(v);
      st = tpu_status_make(TPU_INVALID_ARGUMENT, "%s: the mask changed between building and running the op",
                           tpu__node_describe(n));
      goto done;
    }
    int k = op->ndim;
    int64_t* coords = xalloc(cnt * k, sizeof(int64_t));
    if (!coords) { tpu__free(v); st = TPU_HOST_NOMEM(); goto done; }
    int64_t c[TPU_MAX_DIMS] = {0}, j = 0;
    for (int64_t i = 0; i < m; ++i, next_coord(c, op->sizes, k))
      if (v[i]) { for (int q = 0; q < k; ++q) coords[q * cnt + j] = c[q]; ++j; }
    tpu__free(v);
    bufs[e] = coords;
  }
  int idx_dims[TPU_MAX_DIMS], slice_pre[TPU_MAX_DIMS], slice_post[TPU_MAX_DIMS];
  int n_idx = 0, n_pre = 0, n_post = 0;
  for (int d = 0; d < nd; ++d) if (codes[d] >= 0) idx_dims[n_idx++] = d;
  bool adjacent = n_idx == 0 || idx_dims[n_idx - 1] - idx_dims[0] + 1 == n_idx;
  for (int d = 0; d < nd; ++d) {
    if (codes[d] >= 0) continue;
    if (adjacent && (n_idx == 0 || d < idx_dims[0])) slice_pre[n_pre++] = d;
    else slice_post[n_post++] = d;
  }
  for (int q = 0; q < n_idx; ++q) {
    int d = idx_dims[q];
    int e = (int)(codes[d] / TPU_MAX_DIMS), comp = (int)(codes[d] % TPU_MAX_DIMS);
    const tpu_operand_t* op = &n->in[first_entry + e];
    const int64_t* a;
    int and_;
    int64_t asz[TPU_MAX_DIMS], ast[TPU_MAX_DIMS];
    if (is_mask(op->dtype)) {
      a = bufs[e] + comp * counts[e];
      and_ = 1;
      asz[0] = counts[e];
    } else {
      a = bufs[e];
      and_ = op->ndim;
      memcpy(asz, op->sizes, sizeof(int64_t) * (size_t)and_);
    }
    dense_strides(and_, asz, ast);
    /* strides of this index array inside B (0 on broadcast dims) */
    int64_t bst[TPU_MAX_DIMS];
    for (int i = 0; i < nB; ++i) {
      int ai = i - (nB - and_);
      bst[i] = ai >= 0 && asz[ai] != 1 ? ast[ai] : 0;
    }
    int64_t size = self->sizes[d], c[TPU_MAX_DIMS] = {0};
    for (int64_t p = 0; p < r->nb; ++p, next_coord(c, B, nB)) {
      int64_t o = 0;
      for (int i = 0; i < nB; ++i) o += c[i] * bst[i];
      int64_t v = a[o];
      if (v < -size || v >= size) { st = oob(n, TPU_INDEX_ERROR, v, d, size); goto done; }
      r->off_b[p] += (v < 0 ? v + size : v) * sst[d];
    }
  }
  r->pre = dim_offsets(slice_pre, n_pre, self->sizes, sst, &r->npre);
  r->post = dim_offsets(slice_post, n_post, self->sizes, sst, &r->npost);
  if (!r->pre || !r->post) st = TPU_HOST_NOMEM();
done:
  for (int e = 0; e < TPU_MAX_DIMS; ++e) tpu__free(bufs[e]);
  if (st) resolved_free(r);
  return st;
}

static tpu_status_t index_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  size_t es = tpu_dtype_size(out->dtype);
  resolved_t r;
  TPU_RETURN_IF_ERROR(resolve(n, 1, &r));
  char* src = pack(&n->in[0], out->dtype);
  char* res = xalloc(r.npre * r.nb * r.npost, es);
  tpu_status_t st = NULL;
  if (!src || !res) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t k = 0;
  for (int64_t a = 0; a < r.npre; ++a)
    for (int64_t p = 0; p < r.nb; ++p)
      for (int64_t c = 0; c < r.npost; ++c, ++k)
        memcpy(res + (size_t)k * es, src + (size_t)(r.pre[a] + r.off_b[p] + r.post[c]) * es, es);
  tpu__unpack(out, res, out->dtype);
done:
  tpu__free(src); tpu__free(res); resolved_free(&r);
  return st;
}

static tpu_status_t index_put_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  tpu_dtype_t t = out->dtype, w = work_dtype(t);
  bool flt = w == TPU_DTYPE_F64, acc = n->ia[1] != 0;
  resolved_t r;
  TPU_RETURN_IF_ERROR(resolve(n, 2, &r));
  /* The indexing result shape, rebuilt the way aten/index.c laid it out, to broadcast
   * values: pre dims, B, post dims flattened are enough since values broadcast
   * right-aligned over the full result shape; use the real shape for that. */
  const tpu_operand_t* self = &n->in[0];
  const int64_t* il = n->ilist;
  int nB = (int)il[0];
  const int64_t* codes = il + 1 + nB;
  int64_t shape[TPU_MAX_DIMS];
  int o = 0, first = -1, last = -1, n_idx = 0;
  for (int d = 0; d < self->ndim; ++d)
    if (codes[d] >= 0) { if (first < 0) first = d; last = d; ++n_idx; }
  bool adjacent = n_idx == 0 || last - first + 1 == n_idx;
  if (!adjacent) {
    for (int i = 0; i < nB; ++i) shape[o++] = il[1 + i];
    for (int d = 0; d < self->ndim; ++d) if (codes[d] < 0) shape[o++] = self->sizes[d];
  } else {
    for (int d = 0; d < self->ndim; ++d) {
      if (d == first) for (int i = 0; i < nB; ++i) shape[o++] = il[1 + i];
      if (codes[d] < 0) shape[o++] = self->sizes[d];
    }
  }
  void* work = pack(self, w);
  void* vals = pack_bcast(&n->in[1], o, shape, w);
  tpu_status_t st = NULL;
  if (!work || !vals) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t k = 0;
  for (int64_t a = 0; a < r.npre; ++a)
    for (int64_t p = 0; p < r.nb; ++p)
      for (int64_t c = 0; c < r.npost; ++c, ++k) {
        int64_t off = r.pre[a] + r.off_b[p] + r.post[c];
        if (flt) reduce_f((double*)work + off, ((double*)vals)[k], acc ? RED_SUM : RED_NONE, t);
        else reduce_i((int64_t*)work + off, ((int64_t*)vals)[k], acc ? RED_SUM : RED_NONE, t);
      }
  tpu__unpack(out, work, w);
done:
  tpu__free(work); tpu__free(vals); resolved_free(&r);
  return st;
}

/* ---- masked ops, nonzero ------------------------------------------------------------ */

static tpu_status_t count_changed(const tpu_node_t* n) {
  return tpu_status_make(TPU_INVALID_ARGUMENT, "%s: the input changed between building and running the op",
                         tpu__node_describe(n));
}

static tpu_status_t masked_select_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  size_t es = tpu_dtype_size(out->dtype);
  int nd = n->ilist_len;
  int64_t total = 1;
  for (int d = 0; d < nd; ++d) total *= n->ilist[d];
  char* src = pack_bcast(&n->in[0], nd, n->ilist, out->dtype);
  int64_t* m = pack_bcast(&n->in[1], nd, n->ilist, TPU_DTYPE_I64);
  char* res = xalloc(n->ia[0], es);
  tpu_status_t st = NULL;
  if (!src || !m || !res) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t k = 0;
  for (int64_t i = 0; i < total; ++i) {
    if (!m[i]) continue;
    if (k >= n->ia[0]) { st = count_changed(n); goto done; }
    memcpy(res + (size_t)k++ * es, src + (size_t)i * es, es);
  }
  if (k != n->ia[0]) { st = count_changed(n); goto done; }
  tpu__unpack(out, res, out->dtype);
done:
  tpu__free(src); tpu__free(m); tpu__free(res);
  return st;
}

static tpu_status_t masked_scatter_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  const tpu_operand_t* self = &n->in[0];
  size_t es = tpu_dtype_size(out->dtype);
  int64_t total = tpu__operand_numel(self), ns = tpu__operand_numel(&n->in[2]);
  char* work = pack(self, out->dtype);
  int64_t* m = pack_bcast(&n->in[1], self->ndim, self->sizes, TPU_DTYPE_I64);
  char* src = pack(&n->in[2], out->dtype);
  tpu_status_t st = NULL;
  if (!work || !m || !src) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t k = 0;
  for (int64_t i = 0; i < total; ++i) {
    if (!m[i]) continue;
    if (k >= ns) {
      st = tpu_status_make(TPU_INVALID_ARGUMENT, "%s: Number of elements of source < number of ones in mask",
                           tpu__node_describe(n));
      goto done;
    }
    memcpy(work + (size_t)i * es, src + (size_t)k++ * es, es);
  }
  tpu__unpack(out, work, out->dtype);
done:
  tpu__free(work); tpu__free(m); tpu__free(src);
  return st;
}

static tpu_status_t nonzero_kernel(tpu_node_t* n) {
  const tpu_operand_t* self = &n->in[0];
  int nd = self->ndim;
  int64_t total = tpu__operand_numel(self), count = n->ia[0];
  tpu_dtype_t w = work_dtype(self->dtype);
  void* v = pack(self, w);
  int64_t* res = xalloc(count * (nd ? nd : 1), sizeof(int64_t));
  tpu_status_t st = NULL;
  if (!v || !res) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t c[TPU_MAX_DIMS] = {0}, k = 0;
  for (int64_t i = 0; i < total; ++i, next_coord(c, self->sizes, nd)) {
    bool nz = w == TPU_DTYPE_F64 ? ((double*)v)[i] != 0 : ((int64_t*)v)[i] != 0;
    if (!nz) continue;
    if (k >= count) { st = count_changed(n); goto done; }
    for (int d = 0; d < nd; ++d) res[k * nd + d] = c[d];
    ++k;
  }
  if (k != count) { st = count_changed(n); goto done; }
  tpu__unpack(&n->out[0], res, TPU_DTYPE_I64);
done:
  tpu__free(v); tpu__free(res);
  return st;
}

/* Counts, or weight sums in the output dtype, added in input order as ATen's CPU kernel
 * does. The builder sized the output from the input's maximum. */
static tpu_status_t bincount_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  const tpu_operand_t* w = n->in[1].value ? &n->in[1] : NULL;
  int64_t len = tpu__operand_numel(&n->in[0]), nbins = out->sizes[0];
  tpu_dtype_t dt = out->dtype;
  int64_t* v = len ? pack(&n->in[0], TPU_DTYPE_I64) : NULL;
  void* wv = w && len ? pack(w, dt) : NULL;
  void* acc = xalloc(nbins, tpu_dtype_size(dt));
  tpu_status_t st = NULL;
  if ((len && !v) || (w && len && !wv) || !acc) { st = TPU_HOST_NOMEM(); goto done; }
  memset(acc, 0, (size_t)nbins * tpu_dtype_size(dt));
  for (int64_t i = 0; i < len; ++i) {
    int64_t k = v[i];
    if (k < 0 || k >= nbins) { st = count_changed(n); goto done; }
    if (dt == TPU_DTYPE_I64) ((int64_t*)acc)[k] += 1;
    else if (dt == TPU_DTYPE_F32) ((float*)acc)[k] += ((const float*)wv)[i];
    else ((double*)acc)[k] += ((const double*)wv)[i];
  }
  tpu__unpack(out, acc, dt);
done:
  tpu__free(v); tpu__free(wv); tpu__free(acc);
  return st;
}

/* ---- cat, flip, roll, repeat, pad, tril ---------------------------------------------- */

/* Every input has out's dtype and rank and none shares out's buffer: each input is
 * copied straight into its slice of out. */
static bool cat_direct(const tpu_node_t* n, int dim) {
  const tpu_operand_t* out = &n->out[0];
  for (int i = 0; i < n->n_in; ++i) {
    const tpu_operand_t* op = &n->in[i];
    if (op->is_scalar || op->dtype != out->dtype || op->ndim != out->ndim || op->value == out->value)
      return false;
    for (int d = 0; d < out->ndim; ++d)
      if (d != dim && op->sizes[d] != out->sizes[d]) return false;
  }
  return out->ndim > 0;
}

static tpu_status_t cat_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  int dim = (int)n->ia[0];
  size_t es = tpu_dtype_size(out->dtype);
  if (cat_direct(n, dim)) {
    char* base = tpu__operand_ptr(out);
    int64_t at = 0;
    for (int i = 0; i < n->n_in; ++i) {
      const tpu_operand_t* op = &n->in[i];
      if (tpu__operand_numel(op) > 0)
        tpu__strided_copy(op->ndim, op->sizes, base + (size_t)(at * out->strides[dim]) * es, out->strides,
                          tpu__operand_ptr(op), op->strides, es);
      at += op->sizes[dim];
    }
    return NULL;
  }
  int64_t outer, size, inner;
  split_at(out, dim, &outer, &size, &inner);
  char* res = xalloc(tpu__operand_numel(out), es);
  if (!res) return TPU_HOST_NOMEM();
  int64_t at = 0;
  for (int i = 0; i < n->n_in; ++i) {
    const tpu_operand_t* op = &n->in[i];
    char* src = pack(op, out->dtype);
    if (!src) { tpu__free(res); return TPU_HOST_NOMEM(); }
    int64_t chunk = op->sizes[dim] * inner;
    for (int64_t o = 0; o < outer; ++o)
      memcpy(res + (size_t)(o * size * inner + at) * es, src + (size_t)(o * chunk) * es, (size_t)chunk * es);
    at += chunk;
    tpu__free(src);
  }
  tpu__unpack(out, res, out->dtype);
  tpu__free(res);
  return NULL;
}

/* A flip is a copy through a view with negated strides. */
static tpu_status_t flip_kernel(tpu_node_t* n) {
  tpu_operand_t t = n->in[0];
  for (int d = 0; d < t.ndim; ++d)
    if (n->ilist[d] && t.sizes[d] > 0) {
      t.offset += (t.sizes[d] - 1) * t.strides[d];
      t.strides[d] = -t.strides[d];
    }
  void* buf = pack(&t, n->out[0].dtype);
  if (!buf) return TPU_HOST_NOMEM();
  tpu__unpack(&n->out[0], buf, n->out[0].dtype);
  tpu__free(buf);
  return NULL;
}

static tpu_status_t roll_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  const tpu_operand_t* self = &n->in[0];
  size_t es = tpu_dtype_size(out->dtype);
  int64_t total = tpu__operand_numel(self);
  char* src = pack(self, out->dtype);
  char* res = xalloc(total, es);
  tpu_status_t st = NULL;
  if (!src || !res) { st = TPU_HOST_NOMEM(); goto done; }
  if (n->ia[0]) {
    int64_t s = n->ia[1];
    for (int64_t i = 0; i < total; ++i) memcpy(res + (size_t)((i + s) % total) * es, src + (size_t)i * es, es);
  } else {
    int nd = self->ndim;
    int64_t sst[TPU_MAX_DIMS], c[TPU_MAX_DIMS] = {0};
    dense_strides(nd, self->sizes, sst);
    for (int64_t i = 0; i < total; ++i, next_coord(c, self->sizes, nd)) {
      int64_t o = 0;
      for (int d = 0; d < nd; ++d) o += ((c[d] + n->ilist[d]) % self->sizes[d]) * sst[d];
      memcpy(res + (size_t)o * es, src + (size_t)i * es, es);
    }
  }
  tpu__unpack(out, res, out->dtype);
done:
  tpu__free(src); tpu__free(res);
  return st;
}

static tpu_status_t repeat_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  const tpu_operand_t* self = &n->in[0];
  size_t es = tpu_dtype_size(out->dtype);
  int nd = out->ndim;
  int64_t ps[TPU_MAX_DIMS], pst[TPU_MAX_DIMS], c[TPU_MAX_DIMS] = {0};
  for (int d = 0; d < nd; ++d) {
    int sd = d - (nd - self->ndim);
    ps[d] = sd >= 0 ? self->sizes[sd] : 1;
  }
  dense_strides(nd, ps, pst);
  int64_t total = tpu__operand_numel(out);
  char* src = pack(self, out->dtype);
  char* res = xalloc(total, es);
  tpu_status_t st = NULL;
  if (!src || !res) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t i = 0; i < total; ++i, next_coord(c, out->sizes, nd)) {
    int64_t o = 0;
    for (int d = 0; d < nd; ++d) o += (c[d] % ps[d]) * pst[d];
    memcpy(res + (size_t)i * es, src + (size_t)o * es, es);
  }
  tpu__unpack(out, res, out->dtype);
done:
  tpu__free(src); tpu__free(res);
  return st;
}

/* unfold_backward as ATen's CPU kernel sums: each input position adds the windows that
 * cover it in increasing window order, from zero, rounding to the tensor's dtype after
 * every addition (integers wrap, bool becomes "any"). */
static tpu_status_t unfold_backward_kernel(tpu_node_t* n) {
  const tpu_operand_t* g = &n->in[0];
  tpu_operand_t* out = &n->out[0];
  int dim = (int)n->ia[0];
  int64_t size = n->ia[1], step = n->ia[2];
  int64_t outer = 1, inner = 1, len = out->sizes[dim], nw = g->sizes[dim];
  for (int d = 0; d < dim; ++d) outer *= out->sizes[d];
  for (int d = dim + 1; d < out->ndim; ++d) inner *= out->sizes[d];
  int64_t total = tpu__operand_numel(out);
  if (total == 0) return NULL;
  tpu_dtype_t t = out->dtype, w = work_dtype(t);
  bool flt = w == TPU_DTYPE_F64;
  void* src = pack(g, w);
  void* res = xalloc(total, 8);
  tpu_status_t st = NULL;
  if (!src || !res) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t p = 0; p < len; ++p) {
      int64_t lo = p >= size ? (p - size) / step + 1 : 0, hi = p / step < nw - 1 ? p / step : nw - 1;
      for (int64_t i = 0; i < inner; ++i) {
        int64_t at = (o * len + p) * inner + i;
        double af = 0;
        int64_t ai = 0;
        for (int64_t k = lo; k <= hi; ++k) {
          int64_t from = ((o * nw + k) * inner + i) * size + (p - k * step);
          if (flt) af = tpu__round_to_dtype(af + ((const double*)src)[from], t);
          else ai = (int64_t)((uint64_t)ai + (uint64_t)((const int64_t*)src)[from]);
        }
        if (flt) ((double*)res)[at] = af;
        else ((int64_t*)res)[at] = t == TPU_DTYPE_BOOL ? ai != 0 : ai;
      }
    }
  tpu__unpack(out, res, w);
done:
  tpu__free(src); tpu__free(res);
  return st;
}

/* Stores a scalar operand's value as one element of dtype t. */
static void store_scalar(void* p, tpu_dtype_t t, const tpu_operand_t* s) {
  if (t == TPU_DTYPE_C64) { float v[2] = {(float)s->scalar_d, (float)s->scalar_im}; memcpy(p, v, 8); }
  else if (t == TPU_DTYPE_C128) { double v[2] = {s->scalar_d, s->scalar_im}; memcpy(p, v, 16); }
  else if (tpu_dtype_is_floating(t)) tpu__store_f64(p, t, s->scalar_d);
  else if (t == TPU_DTYPE_BOOL) tpu__store_i64(p, t, s->scalar_d != 0);
  else tpu__store_i64(p, t, tpu_dtype_is_floating(s->dtype) ? (int64_t)s->scalar_d : s->scalar_i);
}

static tpu_status_t pad_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  const tpu_operand_t* self = &n->in[0];
  size_t es = tpu_dtype_size(out->dtype);
  int nd = self->ndim;
  int64_t total = tpu__operand_numel(out), ns = tpu__operand_numel(self);
  char* src = pack(self, out->dtype);
  char* res = xalloc(total, es);
  tpu_status_t st = NULL;
  if (!src || !res) { st = TPU_HOST_NOMEM(); goto done; }
  char fill[16];
  store_scalar(fill, out->dtype, &n->in[1]);
  for (int64_t i = 0; i < total; ++i) memcpy(res + (size_t)i * es, fill, es);
  int64_t ost[TPU_MAX_DIMS], c[TPU_MAX_DIMS] = {0};
  dense_strides(nd, out->sizes, ost);
  for (int64_t i = 0; i < ns; ++i, next_coord(c, self->sizes, nd)) {
    int64_t o = 0;
    bool inside = true;
    for (int d = 0; d < nd && inside; ++d) {
      int64_t oc = c[d] + n->ilist[d];
      inside = oc >= 0 && oc < out->sizes[d];
      o += oc * ost[d];
    }
    if (inside) memcpy(res + (size_t)o * es, src + (size_t)i * es, es);
  }
  tpu__unpack(out, res, out->dtype);
done:
  tpu__free(src); tpu__free(res);
  return st;
}

static tpu_status_t tril_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  size_t es = tpu_dtype_size(out->dtype);
  int nd = out->ndim;
  int64_t rows = out->sizes[nd - 2], cols = out->sizes[nd - 1];
  int64_t plane = rows * cols;
  int64_t mats = plane > 0 ? tpu__operand_numel(out) / plane : 0;
  int64_t k = n->ia[0];
  bool upper = n->ia[1] != 0;
  char* buf = pack(&n->in[0], out->dtype);
  if (!buf) return TPU_HOST_NOMEM();
  for (int64_t m = 0; m < mats; ++m)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          bool keep = upper ? j - i >= k : j - i <= k;
          if (!keep) memset(buf + (size_t)((m * rows + i) * cols + j) * es, 0, es);
        }
  tpu__unpack(out, buf, out->dtype);
  tpu__free(buf);
  return NULL;
}

/* ---- sort / topk -------------------------------------------------------------------- */

/* (stable merge sort: tpu__merge_sort, core/runs.c) */
static tpu_status_t sort_kernel(tpu_node_t* n) {
  const tpu_operand_t* self = &n->in[0];
  int dim = (int)n->ia[0];
  bool desc = n->ia[1] != 0;
  int64_t outer, size, inner;
  split_at(self, dim, &outer, &size, &inner);
  int64_t k = n->ia[2] < 0 ? size : n->ia[2];
  tpu_dtype_t w = work_dtype(self->dtype);
  bool flt = w == TPU_DTYPE_F64;
  void* src = pack(self, w);
  void* vals = xalloc(outer * k * inner, 8);
  int64_t* idx = xalloc(outer * k * inner, sizeof(int64_t));
  void* keys = xalloc(size, 8);
  int64_t* perm = xalloc(size, sizeof(int64_t));
  int64_t* tmp = xalloc(size, sizeof(int64_t));
  tpu_status_t st = NULL;
  if (!src || !vals || !idx || !keys || !perm || !tmp) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      for (int64_t j = 0; j < size; ++j) {
        memcpy((char*)keys + j * 8, (char*)src + ((o * size + j) * inner + i) * 8, 8);
        perm[j] = j;
      }
      tpu__merge_sort(perm, tmp, size, keys, flt, desc);
      for (int64_t j = 0; j < k; ++j) {
        int64_t at = (o * k + j) * inner + i;
        memcpy((char*)vals + at * 8, (char*)keys + perm[j] * 8, 8);
        idx[at] = perm[j];
      }
    }
  tpu__unpack(&n->out[0], vals, w);
  tpu__unpack(&n->out[1], idx, TPU_DTYPE_I64);
done:
  tpu__free(src); tpu__free(vals); tpu__free(idx); tpu__free(keys); tpu__free(perm); tpu__free(tmp);
  return st;
}

/* ---- factories ------------------------------------------------------------------------ */

static tpu_status_t arange_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  int64_t total = tpu__operand_numel(out);
  tpu_dtype_t t = out->dtype, w = work_dtype(t);
  void* res = xalloc(total, 8);
  if (!res) return TPU_HOST_NOMEM();
  /* CPU accumulates in double for f32/f64, float for f16/bf16, int64 for integers. */
  bool half = t == TPU_DTYPE_F16 || t == TPU_DTYPE_BF16;
  for (int64_t i = 0; i < total; ++i) {
    if (w == TPU_DTYPE_I64) ((int64_t*)res)[i] = (int64_t)((uint64_t)n->ia[0] + (uint64_t)n->ia[1] * (uint64_t)i);
    else if (half) ((double*)res)[i] = (float)n->da[0] + (float)n->da[1] * (float)i;
    else ((double*)res)[i] = n->da[0] + n->da[1] * (double)i;
  }
  tpu__unpack(out, res, w);
  tpu__free(res);
  return NULL;
}

static tpu_status_t eye_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  int64_t r = out->sizes[0], c = out->sizes[1];
  int64_t* res = xalloc(r * c, sizeof(int64_t));
  if (!res) return TPU_HOST_NOMEM();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) res[i * c + j] = i == j;
  tpu__unpack(out, res, TPU_DTYPE_I64);
  tpu__free(res);
  return NULL;
}

/* ---- linspace / logspace -------------------------------------------------------------- */

/* Rounds a float result to dtype t, as c10's Half/BFloat16 arithmetic stores it. */
static float round_f(float v, tpu_dtype_t t) { return (float)tpu__round_to_dtype(v, t); }

/* Start (k = 0) or end (k = 1) as Scalar::to<T>() gives it for dtype t: a floating t as
 * a double holding the t value, an integer t (and bool) as int64. */
static double lin_f(const tpu_node_t* n, int k, tpu_dtype_t t) {
  bool is_int = n->ia[4] >> k & 1;
  if (t == TPU_DTYPE_F64) return is_int ? (double)n->ia[1 + k] : n->da[k];
  return round_f(is_int ? (float)n->ia[1 + k] : (float)n->da[k], t);
}
static int64_t lin_i(const tpu_node_t* n, int k, tpu_dtype_t t) {
  bool is_int = n->ia[4] >> k & 1;
  if (t == TPU_DTYPE_BOOL) return is_int ? n->ia[1 + k] != 0 : n->da[k] != 0;
  return wrap_to(is_int ? n->ia[1 + k] : (int64_t)n->da[k], t);
}

/* static_cast of a double to integer dtype t as x86 does it: narrow types convert
 * through int32, and a value out of range (or NaN) becomes the lowest int32 / int64. */
static int64_t trunc_x86(double v, tpu_dtype_t t) {
  if (t == TPU_DTYPE_I64) return v >= -0x1p63 && v < 0x1p63 ? (int64_t)v : INT64_MIN;
  return wrap_to(v > -0x1p31 - 1 && v < 0x1p31 ? (int32_t)v : INT32_MIN, t);
}

/* CPU's linspace kernel (RangeFactoriesKernel.cpp): the first half counts up from start,
 * the second half down from end. It is compiled for AVX2/AVX512, where `a + step * i`
 * contracts to one fused multiply-add: fma() reproduces it bit for bit. Half and
 * BFloat16 round every operation to their precision instead (c10's operators). */
static void linspace_fill(const tpu_node_t* n, tpu_dtype_t t, int64_t steps, void* res) {
  int64_t half = steps / 2;
  if (tpu_dtype_is_floating(t)) {
    double* r = res;
    double s = lin_f(n, 0, t), e = lin_f(n, 1, t);
    if (t == TPU_DTYPE_F64) {
      double step = (e - s) / (double)(steps - 1);
      for (int64_t i = 0; i < steps; ++i)
        r[i] = i < half ? fma(step, (double)i, s) : fma(-step, (double)(steps - i - 1), e);
    } else if (t == TPU_DTYPE_F32) {
      float fs = (float)s, fe = (float)e, step = (fe - fs) / (float)(steps - 1);
      for (int64_t i = 0; i < steps; ++i)
        r[i] = i < half ? fmaf(step, (float)i, fs) : fmaf(-step, (float)(steps - i - 1), fe);
    } else {
      float fs = (float)s, fe = (float)e;
      float step = round_f(round_f(fe - fs, t) / round_f((float)(steps - 1), t), t);
      for (int64_t i = 0; i < steps; ++i)
        r[i] = i < half ? round_f(fs + round_f(step * round_f((float)i, t), t), t)
                        : round_f(fe - round_f(step * round_f((float)(steps - i - 1), t), t), t);
    }
  } else { /* integers: a double step, the result truncated */
    int64_t* r = res;
    double s = (double)lin_i(n, 0, t), e = (double)lin_i(n, 1, t);
    double step = (e - s) / (double)(steps - 1);
    for (int64_t i = 0; i < steps; ++i)
      r[i] = trunc_x86(i < half ? fma(step, (double)i, s) : fma(-step, (double)(steps - i - 1), e), t);
  }
}

/* CPU's logspace (RangeFactories.cpp, built without FMA): base ** (start + step * i),
 * halves as linspace, the exponent in double; integer outputs use a float base. */
static void logspace_fill(const tpu_node_t* n, tpu_dtype_t t, int64_t steps, void* res) {
  int64_t half = steps / 2;
  if (tpu_dtype_is_floating(t)) {
    double* r = res;
    double s = lin_f(n, 0, t), e = lin_f(n, 1, t), base = n->da[2];
    double diff = t == TPU_DTYPE_F64 ? e - s : t == TPU_DTYPE_F32 ? (double)((float)e - (float)s)
                                                                   : round_f((float)e - (float)s, t);
    double step = diff / (double)(steps - 1);
    for (int64_t i = 0; i < steps; ++i) {
      double v = i < half ? pow(base, s + step * (double)i) : pow(base, e - step * (double)(steps - i - 1));
      r[i] = t == TPU_DTYPE_F64 ? v : round_f((float)v, t);
    }
  } else {
    int64_t* r = res;
    int64_t s = lin_i(n, 0, t), e = lin_i(n, 1, t);
    double base = (float)n->da[2];
    /* scalar_end - scalar_start in C++ arithmetic: int for the narrow types */
    int64_t diff = t == TPU_DTYPE_I32 ? (int32_t)((uint32_t)e - (uint32_t)s) : (int64_t)((uint64_t)e - (uint64_t)s);
    double step = (double)diff / (double)(steps - 1);
    for (int64_t i = 0; i < steps; ++i)
      r[i] = trunc_x86(i < half ? pow(base, (double)s + step * (double)i)
                                : pow(base, (double)e - step * (double)(steps - i - 1)), t);
  }
}

static tpu_status_t linspace_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  tpu_dtype_t t = out->dtype, w = tpu_dtype_is_floating(t) ? TPU_DTYPE_F64 : TPU_DTYPE_I64;
  int64_t steps = n->ia[0];
  void* res = xalloc(steps, 8);
  if (!res) return TPU_HOST_NOMEM();
  if (steps == 1) { /* fill_(start), or fill_(pow(base, start)) */
    bool is_int = n->ia[4] & 1;
    double s = is_int ? (double)n->ia[1] : n->da[0];
    if (n->ia[3]) s = pow(n->da[2], s);
    if (w == TPU_DTYPE_F64) *(double*)res = t == TPU_DTYPE_F64 ? s : round_f((float)s, t);
    else if (n->ia[3] || !is_int) *(int64_t*)res = t == TPU_DTYPE_BOOL ? s != 0 : wrap_to((int64_t)s, t);
    else *(int64_t*)res = lin_i(n, 0, t);
  } else if (steps > 1) {
    (n->ia[3] ? logspace_fill : linspace_fill)(n, t, steps, res);
  }
  tpu__unpack(out, res, w);
  tpu__free(res);
  return NULL;
}

/* ---- searchsorted, isin ------------------------------------------------------------------ */

/* Packs op as PyTorch's op.to(via) then widened to via's work dtype (double or int64),
 * so comparisons see exactly the values of dtype via. */
static void* pack_via(const tpu_operand_t* op, tpu_dtype_t via) {
  tpu_dtype_t w = work_dtype(via);
  int64_t n = tpu__operand_numel(op);
  if (via == w || via == op->dtype) return pack(op, w);
  void* tmp = pack(op, via);
  void* res = tmp ? xalloc(n, 8) : NULL;
  if (res) tpu__convert_run(res, w, 1, tmp, via, 1, n);
  tpu__free(tmp);
  return res;
}

/* CPU's cus_lower_bound / cus_upper_bound (Bucketization.cpp), comparisons and all, so
 * NaN and unsorted boundaries place values where CPU places them. */
#define SS_SEARCH(T)                                                                     \
  static int64_t ss_search_##T(const T* bd, const int64_t* sorter, int64_t start, int64_t end, \
                               T val, bool right) {                                      \
    int64_t orig = start;                                                                \
    while (start < end) {                                                                \
      int64_t mid = start + ((end - start) >> 1);                                        \
      T mv = sorter ? bd[sorter[mid] + orig] : bd[mid];                                  \
      if (right ? !(mv > val) : !(mv >= val)) start = mid + 1;                           \
      else end = mid;                                                                    \
    }                                                                                    \
    return start - orig;                                                                 \
  }
SS_SEARCH(double)
SS_SEARCH(int64_t)
#undef SS_SEARCH

static tpu_status_t searchsorted_kernel(tpu_node_t* n) {
  const tpu_operand_t *bdo = &n->in[0], *vo = &n->in[1], *so = &n->in[2];
  tpu_dtype_t c = (tpu_dtype_t)n->ia[1];
  bool right = n->ia[0] != 0, flt = work_dtype(c) == TPU_DTYPE_F64;
  int64_t nv = tpu__operand_numel(vo), last = bdo->sizes[bdo->ndim - 1];
  int64_t idim = vo->ndim ? vo->sizes[vo->ndim - 1] : 1;
  bool one_d = bdo->ndim == 1;
  void* bd = pack_via(bdo, c);
  void* v = pack_via(vo, c);
  int64_t* sorter = so->value ? pack(so, TPU_DTYPE_I64) : NULL;
  int64_t* res = xalloc(nv, sizeof(int64_t));
  tpu_status_t st = NULL;
  if (!bd || !v || !res || (so->value && !sorter)) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t i = 0, ns = sorter ? tpu__operand_numel(so) : 0; i < ns; ++i)
    if (sorter[i] < 0 || sorter[i] >= last) {
      st = tpu_status_make(TPU_INVALID_ARGUMENT, "%s: torch.searchsorted(): sorter index out of range",
                           tpu__node_describe(n));
      goto done;
    }
  for (int64_t i = 0; i < nv; ++i) {
    int64_t start = one_d ? 0 : i / idim * last;
    res[i] = flt ? ss_search_double(bd, sorter, start, start + last, ((double*)v)[i], right)
                 : ss_search_int64_t(bd, sorter, start, start + last, ((int64_t*)v)[i], right);
  }
  tpu__unpack(&n->out[0], res, TPU_DTYPE_I64);
done:
  tpu__free(bd); tpu__free(v); tpu__free(sorter); tpu__free(res);
  return st;
}

static int cmp_f64(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}
static int cmp_i64(const void* a, const void* b) {
  int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return (x > y) - (x < y);
}

static tpu_status_t isin_kernel(tpu_node_t* n) {
  const tpu_operand_t *eo = &n->in[0], *to = &n->in[1];
  tpu_dtype_t c = (tpu_dtype_t)n->ia[1];
  bool invert = n->ia[0] != 0, flt = work_dtype(c) == TPU_DTYPE_F64;
  int64_t ne = tpu__operand_numel(eo), nt = tpu__operand_numel(to), total = ne + nt;
  /* elements then test elements in one buffer: the sorting emulation sorts them together */
  char* all = xalloc(total, 8);
  void* e = pack_via(eo, c);
  void* te = pack_via(to, c);
  uint8_t* res = xalloc(total, 1);
  int64_t *perm = NULL, *tmp = NULL;
  tpu_status_t st = NULL;
  if (!all || !e || !te || !res) { st = TPU_HOST_NOMEM(); goto done; }
  memcpy(all, e, (size_t)ne * 8);
  memcpy(all + ne * 8, te, (size_t)nt * 8);
  if (n->ia[2]) {
    /* isin_sorting with assume_unique: stable sort, mark each value equal to its right
     * neighbour, scatter the marks back to input order */
    perm = xalloc(total, sizeof(int64_t));
    tmp = xalloc(total, sizeof(int64_t));
    if (!perm || !tmp) { st = TPU_HOST_NOMEM(); goto done; }
    for (int64_t i = 0; i < total; ++i) perm[i] = i;
    tpu__merge_sort(perm, tmp, total, all, flt, false);
    for (int64_t k = 0; k < total; ++k) {
      bool eq = false;
      if (k + 1 < total)
        eq = flt ? ((double*)all)[perm[k + 1]] == ((double*)all)[perm[k]]
                 : ((int64_t*)all)[perm[k + 1]] == ((int64_t*)all)[perm[k]];
      res[perm[k]] = k + 1 < total ? eq != invert : invert;
    }
  } else {
    /* membership with ==: NaN matches nothing, -0.0 matches 0.0 */
    int64_t m = 0;
    for (int64_t j = 0; j < nt; ++j) {
      if (flt && isnan(((double*)te)[j])) continue;
      memcpy((char*)te + m++ * 8, (char*)te + j * 8, 8);
    }
    qsort(te, (size_t)m, 8, flt ? cmp_f64 : cmp_i64);
    for (int64_t i = 0; i < ne; ++i) {
      bool found = !(flt && isnan(((double*)e)[i])) &&
                   bsearch((char*)e + i * 8, te, (size_t)m, 8, flt ? cmp_f64 : cmp_i64) != NULL;
      res[i] = found != invert;
    }
  }
  tpu__unpack(&n->out[0], res, TPU_DTYPE_BOOL);
done:
  tpu__free(all); tpu__free(e); tpu__free(te); tpu__free(res); tpu__free(perm); tpu__free(tmp);
  return st;
}

/* ---- repeat_interleave ---------------------------------------------------------------------- */

static tpu_status_t repeat_interleave_kernel(tpu_node_t* n) {
  int64_t nr = tpu__operand_numel(&n->in[0]), total = n->ia[0], sum = 0;
  int64_t* r = pack(&n->in[0], TPU_DTYPE_I64);
  int64_t* res = xalloc(total, sizeof(int64_t));
  tpu_status_t st = NULL;
  if (!r || !res) { st = TPU_HOST_NOMEM(); goto done; }
  for (int64_t i = 0; i < nr; ++i) sum += r[i];
  if (nr > 0 && sum != total) {
    st = tpu_status_make(TPU_INVALID_ARGUMENT, "%s: allocated size does not match required size",
                         tpu__node_describe(n));
    goto done;
  }
  for (int64_t i = 0; i < nr; ++i)
    if (r[i] < 0) {
      st = tpu_status_make(TPU_INVALID_ARGUMENT, "%s: repeats can not be negative", tpu__node_describe(n));
      goto done;
    }
  for (int64_t i = 0, k = 0; i < nr; ++i)
    for (int64_t j = 0; j < r[i]; ++j) res[k++] = i;
  tpu__unpack(&n->out[0], res, TPU_DTYPE_I64);
done:
  tpu__free(r); tpu__free(res);
  return st;
}

/* UNIQUE_CONSECUTIVE (aten/index.c): self packed with dim first (dim None: flattened), so
 * each of the `slices` slices is dense; the runs found again must be the count the
 * builder sized the outputs with. */
static tpu_status_t unique_consecutive_kernel(tpu_node_t* node) {
  const tpu_operand_t* xo = &node->in[0];
  const int64_t n = tpu__operand_numel(xo), runs = node->ia[0];
  const int dim = (int)node->ia[1];
  const tpu_dtype_t t = xo->dtype;
  const size_t es = tpu_dtype_size(t);
  if (n == 0) return NULL;
  int perm[TPU_MAX_DIMS];
  int nd = xo->ndim;
  if (dim >= 0) {
    perm[0] = dim;
    for (int d = 0, k = 1; d < nd; ++d) if (d != dim) perm[k++] = d;
  }
  const int64_t slices = dim >= 0 ? xo->sizes[dim] : n, len = n / slices;
  uint8_t* x = tpu__malloc((size_t)n * es);
  uint8_t* starts = tpu__malloc((size_t)slices);
  int64_t* inv = tpu__malloc((size_t)slices * sizeof(int64_t));
  int64_t* cnt = tpu__malloc((size_t)(runs > 0 ? runs : 1) * sizeof(int64_t));
  uint8_t* vals = tpu__malloc((size_t)(runs > 0 ? runs : 1) * (size_t)len * es);
  tpu_status_t st = NULL;
  if (!x || !starts || !inv || !cnt || !vals) {
    st = TPU_HOST_NOMEM();
    goto done;
  }
  tpu__pack(xo, dim >= 0 ? perm : NULL, t, x);
  if (tpu__runs(x, t, slices, len, starts) != runs) {
    st = tpu_status_make(TPU_INVALID_ARGUMENT,
                         "unique_consecutive: the input changed between the call and the run "
                         "(another thread wrote it while the op was queued)");
    goto done;
  }
  int64_t r = -1;
  for (int64_t s = 0; s < slices; ++s) {
    if (starts[s]) {
      ++r;
      cnt[r] = 0;
      memcpy(vals + (size_t)r * (size_t)len * es, x + (size_t)s * (size_t)len * es, (size_t)len * es);
    }
    cnt[r]++;
    inv[s] = r;
  }
  tpu_operand_t vo = node->out[0];
  if (dim >= 0)
    for (int i = 0; i < nd; ++i) { vo.sizes[i] = node->out[0].sizes[perm[i]]; vo.strides[i] = node->out[0].strides[perm[i]]; }
  tpu__unpack(&vo, vals, t);
  if (node->ia[2]) tpu__unpack(&node->out[1], inv, TPU_DTYPE_I64);
  if (node->ia[3]) tpu__unpack(&node->out[2], cnt, TPU_DTYPE_I64);
done:
  tpu__free(x);
  tpu__free(starts);
  tpu__free(inv);
  tpu__free(cnt);
  tpu__free(vals);
  return st;
}

/* UNIQUE (aten/index.c, _unique2): self's groups of equal values in ascending order. */
static tpu_status_t unique_kernel(tpu_node_t* node) {
  const tpu_operand_t* xo = &node->in[0];
  const int64_t n = tpu__operand_numel(xo), groups = node->ia[0];
  const tpu_dtype_t t = xo->dtype;
  const size_t es = tpu_dtype_size(t);
  if (n == 0) return NULL;
  uint8_t* x = tpu__malloc((size_t)n * es);
  int64_t* order = tpu__malloc((size_t)n * sizeof(int64_t));
  uint8_t* starts = tpu__malloc((size_t)n);
  int64_t* inv = tpu__malloc((size_t)n * sizeof(int64_t));
  int64_t* cnt = tpu__malloc((size_t)(groups > 0 ? groups : 1) * sizeof(int64_t));
  uint8_t* vals = tpu__malloc((size_t)(groups > 0 ? groups : 1) * es);
  tpu_status_t st = NULL;
  if (!x || !order || !starts || !inv || !cnt || !vals) { st = TPU_HOST_NOMEM(); goto done; }
  tpu__pack(xo, NULL, t, x);
  int64_t found = tpu__unique_groups(x, t, n, order, starts);
  if (found < 0) { st = TPU_HOST_NOMEM(); goto done; }
  if (found != groups) {
    st = tpu_status_make(TPU_INVALID_ARGUMENT, "_unique2: the input changed between the call and the run "
                                               "(another thread wrote it while the op was queued)");
    goto done;
  }
  int64_t g = -1;
  for (int64_t k = 0; k < n; ++k) {
    int64_t i = order[k];
    if (starts[k]) {
      ++g;
      cnt[g] = 0;
      memcpy(vals + (size_t)g * es, x + (size_t)i * es, es);
    }
    cnt[g]++;
    inv[i] = g;
  }
  tpu__unpack(&node->out[0], vals, t);
  if (node->ia[1]) tpu__unpack(&node->out[1], inv, TPU_DTYPE_I64);
  if (node->ia[2]) tpu__unpack(&node->out[2], cnt, TPU_DTYPE_I64);
done:
  tpu__free(x); tpu__free(order); tpu__free(starts); tpu__free(inv); tpu__free(cnt); tpu__free(vals);
  return st;
}

/* ASSERT_NONZERO (aten/index.c): one element, nonzero as bits (floats ignore the sign
 * bit, so -0.0 is zero and NaN nonzero; a complex value is nonzero if either part is). */
static tpu_status_t assert_nonzero_kernel(tpu_node_t* node) {
  const tpu_operand_t* xo = &node->in[0];
  const uint8_t* p = (const uint8_t*)tpu__operand_ptr(xo);
  tpu_dtype_t t = xo->dtype;
  bool cplx = tpu_dtype_is_complex(t);
  size_t es = tpu_dtype_size(t), part = cplx ? es / 2 : es;
  bool fl = cplx || tpu_dtype_is_floating(t);
  bool nonzero = false;
  for (size_t o = 0; o < es; o += part) {
    uint64_t v = 0;
    memcpy(&v, p + o, part);
    if (fl) v &= ~(1ull << (8 * part - 1));
    nonzero |= v != 0;
  }
  if (nonzero) return NULL;
  return tpu_status_make(TPU_INVALID_ARGUMENT, "%s", (const char*)node->ilist);
}

void tpu__host_register_index(tpu_host_kernel_fn* table) {
  table[TPU_KIND_UNIQUE_CONSECUTIVE] = unique_consecutive_kernel;
  table[TPU_KIND_UNIQUE] = unique_kernel;
  table[TPU_KIND_ASSERT_NONZERO] = assert_nonzero_kernel;
  table[TPU_KIND_GATHER] = gather_kernel;
  table[TPU_KIND_SCATTER] = scatter_kernel;
  table[TPU_KIND_INDEX_SELECT] = index_select_kernel;
  table[TPU_KIND_INDEX_ACC] = index_acc_kernel;
  table[TPU_KIND_INDEX] = index_kernel;
  table[TPU_KIND_INDEX_PUT] = index_put_kernel;
  table[TPU_KIND_MASKED_SELECT] = masked_select_kernel;
  table[TPU_KIND_MASKED_SCATTER] = masked_scatter_kernel;
  table[TPU_KIND_NONZERO] = nonzero_kernel;
  table[TPU_KIND_BINCOUNT] = bincount_kernel;
  table[TPU_KIND_CAT] = cat_kernel;
  table[TPU_KIND_FLIP] = flip_kernel;
  table[TPU_KIND_ROLL] = roll_kernel;
  table[TPU_KIND_REPEAT] = repeat_kernel;
  table[TPU_KIND_UNFOLD_BACKWARD] = unfold_backward_kernel;
  table[TPU_KIND_PAD] = pad_kernel;
  table[TPU_KIND_TRIL] = tril_kernel;
  table[TPU_KIND_SORT] = sort_kernel;
  table[TPU_KIND_ARANGE] = arange_kernel;
  table[TPU_KIND_EYE] = eye_kernel;
  table[TPU_KIND_LINSPACE] = linspace_kernel;
  table[TPU_KIND_SEARCHSORTED] = searchsorted_kernel;
  table[TPU_KIND_ISIN] = isin_kernel;
  table[TPU_KIND_REPEAT_INTERLEAVE] = repeat_interleave_kernel;
}
