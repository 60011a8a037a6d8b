/* Fused elementwise groups: k nodes with one output shape run as a single tile loop.
 *
 * Each tile (group_tile elements of one row of the coalesced iteration space) flows through
 * every node of the group while it sits in cache: a node reads its inputs from the
 * producing node's tile buffer when an earlier group member wrote that value (same
 * view, as the planner guarantees), from memory otherwise, and writes its output tile
 * to memory only when the value is needed outside the group (internal[i] == 0). An
 * output whose dtype is narrower than the compute dtype is rounded through it, so a
 * fused group computes exactly what the same ops compute one by one.
 *
 * A group may end with a row reduction over the last dim (tpu_row_end_t: softmax,
 * log_softmax, layer norm) that consumes a member's float32 output: the iteration space
 * then keeps the last dim as its rows, each row is computed tile by tile into a row
 * buffer, and the reduction runs on the row while it is in cache. */
#include "host/host.h"

#define MAX_OPS 256

typedef struct src_s {
  int kind;        /* 0 external operand, 1 scalar, 2 producer tile, 3 a scalar the tile
                      function reads from the node (inputs 1 and 2, host/elementwise.c) */
  int index;       /* external operand index, constant tile index or producer node index */
} src_t;

bool tpu__host_can_end_group(tpu_driver_t* d, const tpu_node_t* producer, const tpu_node_t* n) {
  (void)d;
  const tpu_operand_t* x = &n->in[0];
  if (producer->compute != TPU_DTYPE_F32 || producer->out[0].dtype != TPU_DTYPE_F32 || x->ndim < 1 ||
      x->sizes[x->ndim - 1] < 2)
    return false;
  return tpu__softmax_row_end_ok(n) || tpu__layer_norm_row_end_ok(n);
}

static tpu_status_t row_end_open(const tpu_node_t* n, tpu_row_end_t* e) {
  return n->kind == TPU_KIND_LAYER_NORM ? tpu__layer_norm_row_end_open(n, e) : tpu__softmax_row_end_open(n, e);
}

bool tpu__host_can_fuse(tpu_driver_t* d, const tpu_node_t* n) {
  (void)d;
  if (n->n_out != 1 || n->n_in > 8 || !tpu__elementwise_tile_fn(n)) return false;
  for (int i = 0; i < n->n_in; ++i)
    if (!n->in[i].is_scalar && !n->in[i].value) return false; /* absent optional input */
  return true;
}

/* Tile buffers are reused across groups on each thread: a group of 64 ops needs a few
 * MiB, and fresh pages for every group would cost more in page faults than the work. */
static _Thread_local char* tls_scratch;
static _Thread_local size_t tls_scratch_cap;

static char* thread_scratch(size_t n) {
  if (n > tls_scratch_cap) {
    char* p = tpu__realloc(tls_scratch, n);
    if (!p) return NULL;
    tls_scratch = p;
    tls_scratch_cap = n;
  }
  return tls_scratch;
}

typedef struct group_ctx_s {
  tpu_node_t* const* nodes;
  int k;
  const src_t* src;
  const int* out_ext;
  const tpu_dtype_t* cdt;
  const tpu_tile_fn* fns;
  const tpu_operand_t* const* ext;
  int n_ext;
  const uint8_t* direct; /* per member: computes straight into its stored output */
  const tpu_operand_t* const* consts; /* distinct scalar inputs (value and compute dtype) */
  const tpu_dtype_t* const_dt;
  int n_const;
  /* The iteration space after coalescing: dims that are contiguous in every external
   * operand are merged, so rows are as long as possible. strides[e][d]: element stride
   * of external operand e in dim d (0 where it broadcasts). */
  int nd;
  int64_t shape[TPU_MAX_DIMS];
  int64_t (*strides)[TPU_MAX_DIMS];
  const tpu_row_end_t* end; /* the ending row reduction, or NULL */
  int end_src;              /* the member whose output it reduces */
  int64_t tile;             /* elements per tile (group_tile) */
  size_t tile_bytes;        /* bytes of one tile buffer: tile x the widest element */
  int64_t span;             /* columns per work item: a tile, or the whole row with `end` */
  const int64_t* esize;     /* per external operand: element size in bytes */
  const int64_t* step;      /* per external operand: bytes between a row's elements */
  const uint8_t* in_place;  /* per member input (i * 8 + j) from memory: read it there
                               (dense, in the member's compute dtype), else convert */
} group_ctx_t;

/* Work items [i0, i1) of the group's iteration space, with this chunk's own tile
 * buffers: chunks never share scratch, so a group runs in parallel over items and every
 * element is computed by the same sequence of operations. An item is `span` columns of
 * one row (one row = the last dimension): a whole row when the group ends with a row
 * reduction, else one tile, so that a group over few rows (an optimizer's update of one
 * parameter is a single row) still runs on every thread. A member whose stored output is
 * dense in its compute dtype computes straight into memory, and later members read that
 * tile from there. Scratch: the members' output tiles side by side (what a tile touches
 * stays compact), the rounding tile, the constant tiles, then conversion tiles per
 * member input (touched only by inputs that convert) and the row buffers. */
static tpu_status_t group_rows(void* vctx, int64_t i0, int64_t i1, int tid) {
  (void)tid;
  const group_ctx_t* c = vctx;
  tpu_node_t* const* nodes = c->nodes;
  const src_t* src = c->src;
  const tpu_dtype_t* cdt = c->cdt;
  const tpu_operand_t* const* ext = c->ext;
  int k = c->k, nd = c->nd;
  const int64_t* shape = c->shape;
  const int64_t tile = c->tile;
  const size_t tile_bytes = c->tile_bytes;
  int64_t row_k = c->end ? c->end->k : 0;
  char* scratch = thread_scratch(tile_bytes * (size_t)(9 * k + 1 + c->n_const) + (size_t)row_k * 3 * 8);
  if (!scratch) return TPU_HOST_NOMEM();
  char* round_buf = scratch + tile_bytes * (size_t)k;
  char* const_buf = round_buf + tile_bytes;
  char* conv_buf = const_buf + tile_bytes * (size_t)c->n_const;
  float* row_buf = (float*)(conv_buf + tile_bytes * (size_t)(8 * k)); /* the reduced member's row */
  double* row_scratch = (double*)(row_buf + 2 * row_k);              /* 8-byte aligned */
  /* constant tiles for scalar first inputs, as long as a tile of this group gets */
  int64_t fill = nd && shape[nd - 1] < tile ? shape[nd - 1] : tile;
  for (int q = 0; q < c->n_const; ++q) {
    const tpu_operand_t* sc = c->consts[q];
    char* buf = const_buf + tile_bytes * (size_t)q;
    for (int64_t t = 0; t < fill; ++t) {
      if (c->const_dt[q] == TPU_DTYPE_F32) ((float*)buf)[t] = (float)sc->scalar_d;
      else if (c->const_dt[q] == TPU_DTYPE_F64) ((double*)buf)[t] = sc->scalar_d;
      else ((int64_t*)buf)[t] = sc->scalar_i;
    }
  }
  int64_t inner = nd ? shape[nd - 1] : 1;
  int64_t per_row = (inner + c->span - 1) / c->span;
  const char* tile_at[MAX_OPS]; /* this tile of each member's output */
  char* row_at[MAX_OPS];        /* this item's row of each external operand */
  const char* conv_at[MAX_OPS]; /* this tile of an external input, once converted ... */
  tpu_dtype_t conv_dt[MAX_OPS]; /* ... to this dtype */
  int64_t row = -1; /* the row row_at points into */
  for (int64_t item = i0; item < i1; ++item) {
    int64_t r = item / per_row, c0 = item % per_row * c->span;
    int64_t c1 = c0 + c->span < inner ? c0 + c->span : inner;
    if (r != row) { /* an item is often one tile: the next item is mostly in the same row */
      row = r;
      int64_t idx[TPU_MAX_DIMS] = {0};
      for (int64_t q = r, d = nd - 2; d >= 0; --d) { idx[d] = q % shape[d]; q /= shape[d]; }
      for (int e = 0; e < c->n_ext; ++e) {
        int64_t off = ext[e]->offset;
        for (int d = 0; d < nd - 1; ++d) off += idx[d] * c->strides[e][d];
        row_at[e] = (char*)ext[e]->value->data + off * c->esize[e];
      }
    }
    for (int64_t t0 = c0; t0 < c1; t0 += tile) {
      int64_t len = c1 - t0 < tile ? c1 - t0 : tile;
      for (int e = 0; e < c->n_ext; ++e) conv_at[e] = NULL;
      for (int i = 0; i < k; ++i) {
        const tpu_node_t* n = nodes[i];
        char* nbuf = scratch + tile_bytes * (size_t)i;
        const void* ins[8] = {0};
        for (int j = 0; j < n->n_in; ++j) {
          const src_t* s = &src[i * 8 + j];
          char* conv = conv_buf + tile_bytes * (size_t)(i * 8 + j);
          if (s->kind == 3) continue;
          if (s->kind == 1) { ins[j] = const_buf + tile_bytes * (size_t)s->index; continue; }
          if (s->kind == 2) {
            const char* pb = tile_at[s->index];
            if (cdt[s->index] == cdt[i]) ins[j] = pb;
            else { tpu__convert_run(conv, cdt[i], 1, pb, cdt[s->index], 1, len); ins[j] = conv; }
            continue;
          }
          const char* p = row_at[s->index] + t0 * c->step[s->index];
          if (c->in_place[i * 8 + j]) ins[j] = p;
          else if (conv_at[s->index] && conv_dt[s->index] == cdt[i]) ins[j] = conv_at[s->index];
          else {
            const tpu_operand_t* op = ext[s->index];
            tpu__convert_run(conv, cdt[i], 1, p, op->dtype, c->step[s->index] / c->esize[s->index], len);
            ins[j] = conv_at[s->index] = conv;
            conv_dt[s->index] = cdt[i];
          }
        }
        tpu_dtype_t od = n->out[0].dtype;
        int oe = c->out_ext[i];
        char* out = c->direct[i] ? row_at[oe] + t0 * c->step[oe] : nbuf;
        c->fns[i](len, out, ins, n);
        bool store = oe >= 0 && !c->direct[i];
        if (od != cdt[i]) { /* round through the output dtype, exactly as a store would */
          if (cdt[i] == TPU_DTYPE_F32 && od == TPU_DTYPE_BF16 && store && c->step[oe] == 2) {
            tpu__round_store_bf16((float*)nbuf, (uint16_t*)(row_at[oe] + t0 * 2), len);
            store = false; /* (stored as it was rounded) */
          } else if (cdt[i] == TPU_DTYPE_F32 && (od == TPU_DTYPE_BF16 || od == TPU_DTYPE_F16)) {
            tpu__round_f32_run((float*)nbuf, len, od);
          } else {
            tpu__convert_run(round_buf, od, 1, nbuf, cdt[i], 1, len);
            tpu__convert_run(nbuf, cdt[i], 1, round_buf, od, 1, len);
          }
        }
        if (store)
          tpu__convert_run(row_at[oe] + t0 * c->step[oe], od, c->step[oe] / c->esize[oe], nbuf, cdt[i], 1, len);
        tile_at[i] = out;
        if (i == c->end_src && c->end) memcpy(row_buf + t0, out, sizeof(float) * (size_t)len);
      }
    }
    if (c->end) c->end->row(c->end, row_buf, r, row_scratch);
  }
  return NULL;
}

/* Elements per tile. A group over a large shape streams its operands from memory: its
 * tiles keep every buffer they touch (the operands it streams, member outputs kept in
 * scratch, constants) within half of one core's L2 cache, at least TILE_MIN elements.
 * Long tiles cost fewer passes of the per-tile loop over the members and read each
 * stream in long runs, while a member's output tile is still in L2 when the next member
 * reads it. Measured on a Zen 5 machine (2 threads, 1 MiB L2 per core), medians of
 * three alternated processes per build, defer_and_fuse: AdamW's foreach chain of 8 ops
 * over 16 x 1024x1024 parameters 11.3-12.0 ms with the rule before (a quarter of L1, at
 * most 1,024 elements: 256 here) -> 9.0-9.3 ms with this one (10,880); PyTorch's
 * hand-fused `_fused_adamw_` takes 7.8-8.1. ((x * 1.5 + b).relu() * c).sum() over 16M
 * floats 11.1-11.3 -> 7.7-8.0 ms, gelu(x * b + c) * 0.5 9.0-10.1 -> 7.9-8.0. A fixed
 * sweep of the AdamW chain: 2,048 elements 9.7-10.1 ms, 16,384 7.7-9.6. (Stop 15, on
 * another machine, compared tiles up to 640 elements only, where 128 was fastest.) A
 * group over a small shape works in cache, where per-tile costs dominate: TILE_MAX
 * (200 parameters of 64x64: 1.9 ms with 640-element tiles, 2.4 with 128, stop 15).
 * Long tiles never leave a thread without work: a group has at least four tiles per
 * thread (or tiles of TILE_MAX). */
#define TILE_MIN 128
#define TILE_MAX 1024

static int64_t l2_bytes;
static pthread_once_t l2_once = PTHREAD_ONCE_INIT;
static void read_l2(void) {
  int64_t v = tpu__cache_bytes(2);
  l2_bytes = v >= 65536 ? v : 262144; /* unknown: a small L2 */
}

static int64_t group_tile(const group_ctx_t* c, size_t widest, int64_t numel) {
  if (numel <= TPU_GROUP_SMALL_NUMEL) return TILE_MAX;
  pthread_once(&l2_once, read_l2);
  size_t per_elem = widest * (size_t)c->n_const;
  for (int e = 0; e < c->n_ext; ++e) per_elem += (size_t)c->esize[e];
  for (int i = 0; i < c->k; ++i)
    if (!c->direct[i]) per_elem += (size_t)tpu_dtype_size(c->cdt[i]);
  int64_t t = per_elem ? l2_bytes / 2 / (int64_t)per_elem / 64 * 64 : TILE_MAX;
  int64_t share = numel / (4 * (int64_t)tpu__num_threads()) / 64 * 64;
  if (t > share) t = share > TILE_MAX ? share : TILE_MAX;
  return t < TILE_MIN ? TILE_MIN : t;
}

tpu_status_t tpu__host_run_group(tpu_driver_t* drv, tpu_node_t* const* nodes, int k,
                                 const uint8_t* internal) {
  (void)drv;
  const tpu_operand_t* shape_op = &nodes[0]->out[0];
  int nd = shape_op->ndim;
  int64_t numel = tpu__operand_numel(shape_op);
  /* A last member without a tile function is the ending row reduction. */
  tpu_row_end_t end_op = {0};
  const tpu_node_t* end = tpu__elementwise_tile_fn(nodes[k - 1]) ? NULL : nodes[k - 1];
  int end_src = -1;
  if (end) {
    for (int q = k - 2; q >= 0 && end_src < 0; --q)
      if (tpu__operand_same_view(&nodes[q]->out[0], &end->in[0])) end_src = q;
    if (end_src < 0 || nodes[end_src]->compute != TPU_DTYPE_F32)
      return tpu_status_make(TPU_INTERNAL, "fused group ends with %s but no member produces its input",
                             tpu__node_describe(end));
    TPU_RETURN_IF_ERROR(row_end_open(end, &end_op));
    k--; /* the tile loop runs the elementwise members */
  }
  /* Gather external operands: inputs read from memory and outputs written to it. An
   * input reads the tile of the member that last wrote its value (the planner keeps one
   * view per value written in a group); a write that a later member overwrites is never
   * stored; a scalar first input gets a constant tile (equal ones share it), while tile
   * functions read a scalar second or third input from the node. */
  const tpu_operand_t* ext[MAX_OPS];
  int n_ext = 0;
  src_t* src = tpu__calloc((size_t)k * 8, sizeof(src_t));
  int* out_ext = tpu__malloc(sizeof(int) * (size_t)k);
  tpu_dtype_t* cdt = tpu__malloc(sizeof(tpu_dtype_t) * (size_t)k);
  tpu_tile_fn* fns = tpu__malloc(sizeof(tpu_tile_fn) * (size_t)k);
  uint8_t* direct = tpu__calloc((size_t)k, 1);
  uint8_t* overwritten = tpu__calloc((size_t)k, 1);
  const tpu_operand_t** consts = tpu__malloc(sizeof(*consts) * (size_t)k * 8);
  tpu_dtype_t* const_dt = tpu__malloc(sizeof(tpu_dtype_t) * (size_t)k * 8);
  tpu_vmark_t* writer = tpu__malloc(sizeof(*writer));
  tpu_vmark_t* readers = tpu__malloc(sizeof(*readers)); /* value -> its first external index */
  int n_const = 0;
  tpu_status_t st = NULL;
  int64_t (*strides)[TPU_MAX_DIMS] = NULL;
  int64_t* esize = NULL; /* and step, after it */
  uint8_t* in_place = NULL;
  if (!src || !out_ext || !cdt || !fns || !direct || !overwritten || !consts || !const_dt || !writer || !readers) {
    st = TPU_HOST_NOMEM();
    goto done;
  }
  tpu__vmark_clear(writer);
  for (int i = k - 1; i >= 0; --i) {
    const tpu_operand_t* o = &nodes[i]->out[0];
    int* later = tpu__vmark_slot(writer, o->value);
    overwritten[i] = *later >= 0 && tpu__operand_same_view(&nodes[*later]->out[0], o);
    *later = i;
  }
  tpu__vmark_clear(writer);
  tpu__vmark_clear(readers);
  for (int i = 0; i < k; ++i) {
    const tpu_node_t* n = nodes[i];
    fns[i] = tpu__elementwise_tile_fn(n);
    cdt[i] = n->compute;
    for (int j = 0; j < n->n_in; ++j) {
      const tpu_operand_t* op = &n->in[j];
      src_t* s = &src[i * 8 + j];
      if (op->is_scalar && j > 0) { s->kind = 3; continue; } /* no constant tile */
      if (op->is_scalar) {
        int q = 0;
        while (q < n_const && !(const_dt[q] == cdt[i] && consts[q]->scalar_i == op->scalar_i &&
                                !memcmp(&consts[q]->scalar_d, &op->scalar_d, sizeof(double))))
          ++q;
        if (q == n_const) { consts[q] = op; const_dt[q] = cdt[i]; n_const++; }
        s->kind = 1;
        s->index = q;
        continue;
      }
      int p = tpu__vmark_get(writer, op->value);
      if (p >= 0 && tpu__operand_same_view(&nodes[p]->out[0], op)) { s->kind = 2; s->index = p; continue; }
      /* A value read again through the same view shares its external index, so a tile
       * converts it once (AdamW's chain reads the gradient three times). Values are
       * immutable and a later write of the memory is a new value, read from its tile. */
      int* seen = tpu__vmark_slot(readers, op->value);
      s->kind = 0;
      if (*seen >= 0 && tpu__operand_same_view(ext[*seen], op)) { s->index = *seen; continue; }
      if (n_ext == MAX_OPS) { st = tpu_status_make(TPU_INTERNAL, "fused group too wide"); goto done; }
      if (*seen < 0) *seen = n_ext;
      s->index = n_ext;
      ext[n_ext++] = op;
    }
    *tpu__vmark_slot(writer, n->out[0].value) = i;
    out_ext[i] = -1;
    if (!internal[i] && !overwritten[i]) {
      if (n_ext == MAX_OPS) { st = tpu_status_make(TPU_INTERNAL, "fused group too wide"); goto done; }
      out_ext[i] = n_ext;
      ext[n_ext++] = &n->out[0];
    }
  }
  if (numel == 0) goto done;
  strides = tpu__malloc(sizeof(*strides) * (size_t)(n_ext ? n_ext : 1));
  if (!strides) { st = TPU_HOST_NOMEM(); goto done; }
  group_ctx_t ctx = {nodes, k, src, out_ext, cdt, fns, ext, n_ext, direct, consts, const_dt, n_const,
                     0, {0}, strides, end ? &end_op : NULL, end_src, 0};
  /* Broadcast-align every operand's strides, drop size-1 dims, merge contiguous dims. */
  for (int d = 0; d < nd; ++d) {
    if (shape_op->sizes[d] == 1) continue;
    int m = ctx.nd;
    bool merge = m > 0 && !(end && d == nd - 1); /* rows of the reduction stay rows */
    for (int e = 0; e < n_ext; ++e) {
      const tpu_operand_t* op = ext[e];
      int sd = d - (nd - op->ndim);
      strides[e][m] = sd >= 0 && op->sizes[sd] != 1 ? op->strides[sd] : 0;
      if (merge && strides[e][m - 1] != strides[e][m] * shape_op->sizes[d]) merge = false;
    }
    if (merge) {
      ctx.shape[m - 1] *= shape_op->sizes[d];
      for (int e = 0; e < n_ext; ++e) strides[e][m - 1] = strides[e][m];
    } else {
      ctx.shape[m] = shape_op->sizes[d];
      ctx.nd = m + 1;
    }
  }
  if (ctx.nd == 0) { ctx.nd = 1; ctx.shape[0] = 1; for (int e = 0; e < n_ext; ++e) strides[e][0] = 0; }
  for (int i = 0; i < k; ++i)
    direct[i] = out_ext[i] >= 0 && nodes[i]->out[0].dtype == cdt[i] && strides[out_ext[i]][ctx.nd - 1] == 1;
  esize = tpu__malloc(sizeof(int64_t) * 2 * (size_t)(n_ext ? n_ext : 1));
  in_place = tpu__calloc((size_t)k * 8, 1);
  if (!esize || !in_place) { st = TPU_HOST_NOMEM(); goto done; }
  int64_t* step = esize + n_ext;
  size_t widest = 1;
  for (int e = 0; e < n_ext; ++e) {
    esize[e] = (int64_t)tpu_dtype_size(ext[e]->dtype);
    step[e] = strides[e][ctx.nd - 1] * esize[e];
  }
  for (int i = 0; i < k; ++i) {
    size_t w = tpu_dtype_size(cdt[i]), o = tpu_dtype_size(nodes[i]->out[0].dtype);
    widest = w > widest ? w : widest;
    widest = o > widest ? o : widest;
    for (int j = 0; j < nodes[i]->n_in; ++j) {
      const src_t* s = &src[i * 8 + j];
      in_place[i * 8 + j] = s->kind == 0 && ext[s->index]->dtype == cdt[i] && step[s->index] == esize[s->index];
    }
  }
  for (int q = 0; q < n_const; ++q) widest = tpu_dtype_size(const_dt[q]) > widest ? tpu_dtype_size(const_dt[q]) : widest;
  ctx.esize = esize;
  ctx.step = step;
  ctx.in_place = in_place;
  ctx.tile = group_tile(&ctx, widest, numel);
  ctx.tile_bytes = (size_t)ctx.tile * widest;
  int64_t inner = ctx.shape[ctx.nd - 1];
  ctx.span = end || inner <= ctx.tile ? inner : ctx.tile;
  int64_t items = numel / inner * ((inner + ctx.span - 1) / ctx.span);
  int64_t work = ctx.span * k; /* element-ops per item */
  int64_t grain = work >= TPU_PARALLEL_MIN_WORK ? 1 : TPU_PARALLEL_MIN_WORK / work;
  st = tpu__parallel_for(items, grain, group_rows, &ctx);
done:
  tpu__free(end_op.state);
  tpu__free(strides);
  tpu__free(esize);
  tpu__free(in_place);
  tpu__free(src);
  tpu__free(out_ext);
  tpu__free(cdt);
  tpu__free(fns);
  tpu__free(direct);
  tpu__free(overwritten);
  tpu__free(consts);
  tpu__free(const_dt);
  tpu__free(writer);
  tpu__free(readers);
  return st;
}
