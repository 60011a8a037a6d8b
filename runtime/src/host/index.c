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
 *   CAT           in: tensors...                  ia[0] dim
 *   FLIP          in: self                        ilist: 1 per flipped dim
 *   ROLL          in: self                        ilist: shift per dim; ia[0] flat, ia[1] shift
 *   REPEAT        in: self
 *   PAD           in: self, value                 ilist: padding before each dim
 *   TRIL          in: self                        ia[0] diagonal, ia[1] upper
 *   SORT          in: self                        ia[0] dim, ia[1] descending, ia[2] k or -1
 *   ARANGE        (none)                          da[0] start, da[1] step, ia[0..1] int forms
 *   EYE           (none) */
#include <math.h>
#include <stdio.h>

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
static double round_to(double v, tpu_dtype_t t) {
  switch (t) {
    case TPU_DTYPE_F32: return (float)v;
    case TPU_DTYPE_F16: return (double)(_Float16)v;
    case TPU_DTYPE_BF16: return tpu__bf16_to_f32(tpu__f32_to_bf16((float)v));
    default: return v;
  }
}

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
    case RED_SUM: case RED_MEAN: *a = round_to(*a + b, t); return;
    case RED_PROD: *a = round_to(*a * b, t); return;
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
  double sv_f = round_to(srcop->scalar_d, t);
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
      if (flt) ((double*)work)[i] = round_to(((double*)work)[i] / (double)cnt[i], t);
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
          *a = add ? round_to(*a + af * b, t) : b;
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

/* ---- cat, flip, roll, repeat, pad, tril ---------------------------------------------- */

static tpu_status_t cat_kernel(tpu_node_t* n) {
  tpu_operand_t* out = &n->out[0];
  int dim = (int)n->ia[0];
  size_t es = tpu_dtype_size(out->dtype);
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

/* Stores a scalar operand's value as one element of dtype t. */
static void store_scalar(void* p, tpu_dtype_t t, const tpu_operand_t* s) {
  if (tpu_dtype_is_floating(t)) tpu__store_f64(p, t, s->scalar_d);
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
  char fill[8];
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

/* NaN orders above every number, as on PyTorch CPU. Ties keep their input order. */
static bool before_f(double a, double b, bool desc) {
  if (desc) return (isnan(a) && !isnan(b)) || a > b;
  return (!isnan(a) && isnan(b)) || a < b;
}
static bool before_i(int64_t a, int64_t b, bool desc) { return desc ? a > b : a < b; }

/* Stable bottom-up merge sort of the permutation perm by keys. */
static void merge_sort(int64_t* perm, int64_t* tmp, int64_t n, const void* keys, bool flt, bool desc) {
  const double* kf = keys;
  const int64_t* ki = keys;
  for (int64_t w = 1; w < n; w *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * w) {
      int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      int64_t i = lo, j = mid, o = lo;
      while (i < mid && j < hi) {
        bool take_right = flt ? before_f(kf[perm[j]], kf[perm[i]], desc) : before_i(ki[perm[j]], ki[perm[i]], desc);
        tmp[o++] = take_right ? perm[j++] : perm[i++];
      }
      while (i < mid) tmp[o++] = perm[i++];
      while (j < hi) tmp[o++] = perm[j++];
    }
    memcpy(perm, tmp, (size_t)n * sizeof(int64_t));
  }
}

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
      merge_sort(perm, tmp, size, keys, flt, desc);
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

void tpu__host_register_index(tpu_host_kernel_fn* table) {
  table[TPU_KIND_GATHER] = gather_kernel;
  table[TPU_KIND_SCATTER] = scatter_kernel;
  table[TPU_KIND_INDEX_SELECT] = index_select_kernel;
  table[TPU_KIND_INDEX_ACC] = index_acc_kernel;
  table[TPU_KIND_INDEX] = index_kernel;
  table[TPU_KIND_INDEX_PUT] = index_put_kernel;
  table[TPU_KIND_MASKED_SELECT] = masked_select_kernel;
  table[TPU_KIND_MASKED_SCATTER] = masked_scatter_kernel;
  table[TPU_KIND_NONZERO] = nonzero_kernel;
  table[TPU_KIND_CAT] = cat_kernel;
  table[TPU_KIND_FLIP] = flip_kernel;
  table[TPU_KIND_ROLL] = roll_kernel;
  table[TPU_KIND_REPEAT] = repeat_kernel;
  table[TPU_KIND_PAD] = pad_kernel;
  table[TPU_KIND_TRIL] = tril_kernel;
  table[TPU_KIND_SORT] = sort_kernel;
  table[TPU_KIND_ARANGE] = arange_kernel;
  table[TPU_KIND_EYE] = eye_kernel;
}
