/* defer_and_fuse: per-device pending graphs, cuts, planning with a plan cache, and the
 * executor that runs a cut graph on the queue thread. docs/modes.md describes the
 * behaviour; this file is the mechanism.
 *
 * Append: a node joins its device's pending graph. Its *shape hash* (kind, variant,
 * dtypes, shapes, strides, integer attributes; no scalar values) feeds loop detection;
 * its *flow hash* adds the graph-local ids of the values it touches, so two graphs with
 * equal keys have the same structure and data flow.
 * Cut: at host reads and synchronize (tpu_flush), a mode change, TORCHTPU_GRAPH_MAX_NODES,
 * and when the op stream repeats (the pending ops are two copies of a period of at least
 * MIN_PERIOD ops: the first copy is cut off; or the pending ops equal the previous graph).
 * Plan: the driver says which nodes it can fuse; consecutive fusable nodes with one
 * output shape and no aliasing hazard form a group; a group output that no one outside
 * the group can see (its only references are the group's operands: no live tensor, no
 * later op) is internal and never materialized. Plans are cached by key (flow hash plus
 * which values are dead), so a repeated training step does no planning.
 * Run: groups run in graph order; each node is freed right after it runs, so values die
 * as early as their last use and their memory goes back to the pool for the next value
 * (liveness-based reuse through the caching pool). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/internal.h"

#define MAX_DEVICES 64
#define MIN_PERIOD 16
#define LOOP_WINDOW 16 /* ops hashed together to place an op for loop detection */
#define WB 0x100000001b3ull           /* the window hash's base (odd) */
#define WB_POW 0x4efe15c813151841ull  /* WB^LOOP_WINDOW mod 2^64 */
#define MAX_GROUP 64
#define EXPLAIN_CAP 4096
#define PLAN_CACHE_CAP 512

typedef struct tpu_graph_s {
  int device;
  tpu_node_t** nodes;
  int n;
  int* order;         /* execution order: node indices, groups contiguous */
  int* glen;          /* per position in order: length of the kernel starting there, else 0 */
  uint8_t* internal;  /* per node: output 0 is internal to its group */
  int explain_index;  /* record to fill with run time, or -1 */
} tpu_graph_t;

typedef struct plan_s {
  uint64_t key;
  int n;
  int* order;
  int* glen;
  uint8_t* internal;
  struct plan_s* next;
} plan_t;

typedef struct vmap_s { const tpu_value_t** keys; int* ids; int cap, count; } vmap_t;

typedef struct pending_s {
  tpu_node_t** nodes;
  uint64_t* shape_h;   /* per node */
  int n, cap;
  uint64_t flow;       /* running flow hash */
  uint64_t shape_chain;/* running hash of shape hashes */
  uint64_t window;     /* rolling hash of the last LOOP_WINDOW shape hashes */
  int period, run;     /* candidate repetition period (0: none) and how many ops in a
                          row have equalled the op one period earlier */
  uint64_t* seen_h;    /* window hash -> last position (open addressing), for periods */
  int* seen_pos;
  int seen_cap, seen_n;
  vmap_t vmap;
  int* vrefs;          /* per value id: references by the pending ops' operands */
  int vrefs_cap;
  int* out0;           /* per node: value id of its output 0, -1 if none is bound */
  bool unkeyed;        /* host OOM while hashing: these ops must not use the plan cache */
  int last_site;       /* the last pending node with a call site (debug mode), or -1 */
  uint64_t last_chain; /* previous graph's shape chain and length */
  int last_len;
  bool cut_due;        /* the pending ops repeat the previous graph: cut before the next
                          op, or run here if a synchronize comes first */
  double work;         /* multiply-adds of the pending GEMM-class ops (node_macs) */
} pending_t;

#define SAME_AS_PREVIOUS "loop detected: same ops as the previous graph"
#define GEMM_CUT "work to start on: a product after TORCHTPU_GRAPH_CUT_MACS of recorded ones"

static pending_t pend[MAX_DEVICES];
static pthread_mutex_t graph_mu = PTHREAD_MUTEX_INITIALIZER;
static int max_nodes = 0;
static double cut_macs = -1;

static plan_t* plan_cache[PLAN_CACHE_CAP];
static uint64_t plans_built, plan_hits;

static tpu_cut_record_t explain_log[EXPLAIN_CAP];
static int explain_n;
static uint64_t explain_gen; /* bumped by each clear: indexes of older records are stale */
/* This thread's records still without a call site: [unsited_first, unsited_last] of
 * generation unsited_gen, or unsited_first < 0. */
static _Thread_local int unsited_first = -1, unsited_last;
static _Thread_local uint64_t unsited_gen;
static _Thread_local bool appending; /* cuts made while appending an op are heuristic */
static pthread_mutex_t explain_mu = PTHREAD_MUTEX_INITIALIZER;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static inline uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

/* ---- value ids ------------------------------------------------------------------------ */
static int vmap_id(vmap_t* m, const tpu_value_t* v) {
  if (m->count * 2 >= m->cap) {
    int cap = m->cap ? m->cap * 2 : 256;
    const tpu_value_t** keys = tpu__calloc((size_t)cap, sizeof(*keys));
    int* ids = tpu__calloc((size_t)cap, sizeof(int));
    if (!keys || !ids) { tpu__free(keys); tpu__free(ids); return -1; }
    for (int i = 0; i < m->cap; ++i)
      if (m->keys[i]) {
        size_t h = ((uintptr_t)m->keys[i] >> 4) & (size_t)(cap - 1);
        while (keys[h]) h = (h + 1) & (size_t)(cap - 1);
        keys[h] = m->keys[i];
        ids[h] = m->ids[i];
      }
    tpu__free(m->keys);
    tpu__free(m->ids);
    m->keys = keys;
    m->ids = ids;
    m->cap = cap;
  }
  size_t h = ((uintptr_t)v >> 4) & (size_t)(m->cap - 1);
  while (m->keys[h] && m->keys[h] != v) h = (h + 1) & (size_t)(m->cap - 1);
  if (!m->keys[h]) { m->keys[h] = v; m->ids[h] = m->count++; }
  return m->ids[h];
}

static void vmap_clear(vmap_t* m) {
  if (m->keys) memset(m->keys, 0, sizeof(*m->keys) * (size_t)m->cap);
  m->count = 0;
}

static uint64_t operand_shape_hash(uint64_t h, const tpu_operand_t* op) {
  h = mix(h, (uint64_t)op->dtype * 131 + (uint64_t)op->is_scalar * 7 + (uint64_t)(op->value != NULL));
  h = mix(h, (uint64_t)(int64_t)op->ndim);
  for (int d = 0; d < op->ndim; ++d) h = mix(mix(h, (uint64_t)op->sizes[d]), (uint64_t)op->strides[d]);
  return mix(h, (uint64_t)op->offset);
}

static uint64_t node_shape_hash(const tpu_node_t* n) {
  uint64_t h = mix(mix(mix(0, (uint64_t)n->kind), (uint64_t)n->aten_index), (uint64_t)n->variant);
  h = mix(mix(h, (uint64_t)n->compute), (uint64_t)(n->n_in * 16 + n->n_out));
  for (int i = 0; i < TPU_NODE_NUM_IATTR; ++i)
    if (!(n->runtime_ia >> i & 1u)) h = mix(h, (uint64_t)n->ia[i]);
  for (int i = 0; i < n->ilist_len; ++i) h = mix(h, (uint64_t)n->ilist[i]);
  for (int i = 0; i < n->n_in; ++i) h = operand_shape_hash(h, &n->in[i]);
  for (int i = 0; i < n->n_out; ++i) h = operand_shape_hash(h, &n->out[i]);
  return h;
}

/* ---- mode ----------------------------------------------------------------------------- */
static tpu_status_t flush_locked(int device, const char* reason, int upto);

tpu_status_t tpu_set_eager_mode(tpu_eager_mode_t mode) {
  if (mode != TPU_EAGER_STRICT && mode != TPU_EAGER_DEBUG && mode != TPU_EAGER_DEFER)
    return tpu_status_make(TPU_VALUE_ERROR, "unknown eager mode %d", (int)mode);
  pthread_mutex_lock(&graph_mu);
  tpu_status_t st = NULL;
  for (int d = 0; d < MAX_DEVICES && !st; ++d)
    if (pend[d].n) st = flush_locked(d, "eager mode change", pend[d].n);
  if (!st) atomic_store(&tpu__eager_mode, (int)mode);
  pthread_mutex_unlock(&graph_mu);
  return st;
}

tpu_eager_mode_t tpu_get_eager_mode(void) { return (tpu_eager_mode_t)atomic_load(&tpu__eager_mode); }

/* ---- append and cut --------------------------------------------------------------------- */
static double numel_of(const tpu_operand_t* op) { return (double)tpu__operand_numel(op); }

/* Multiply-adds of a GEMM-class node (products, convolutions, attention), 0 for others:
 * the work that makes it worth starting a graph before all of a step is recorded. */
static double node_macs(const tpu_node_t* n) {
  switch (n->kind) {
    case TPU_KIND_GEMM: /* [batch, M, K] x [batch, K, N] */
      if (n->n_in < 2 || n->in[0].ndim < 1) return 0;
      return numel_of(&n->out[0]) * (double)n->in[0].sizes[n->in[0].ndim - 1];
    case TPU_KIND_CONV: case TPU_KIND_CONV_BWD: {
      /* CONV: x, w; CONV_BWD: grad_out, x, w. Each element of the side with Cout channels
       * (the output, or x of a transposed convolution) meets Cin/groups * kernel weights. */
      bool fwd = n->kind == TPU_KIND_CONV, transposed = n->ia[2] != 0;
      int wi = fwd ? 1 : 2;
      if (n->n_in <= wi || n->in[wi].ndim < 1 || !n->in[wi].sizes[0]) return 0;
      const tpu_operand_t* wide = transposed ? &n->in[fwd ? 0 : 1] : fwd ? &n->out[0] : &n->in[0];
      return (fwd ? 1 : 2) * numel_of(wide) * numel_of(&n->in[wi]) / (double)n->in[wi].sizes[0];
    }
    case TPU_KIND_SDPA: case TPU_KIND_SDPA_BACKWARD: { /* q [..., Tq, E], k [..., Tk, E] */
      int qi = n->kind == TPU_KIND_SDPA ? 0 : 1;
      if (n->n_in <= qi + 1 || n->in[qi + 1].ndim < 2) return 0;
      double passes = n->kind == TPU_KIND_SDPA ? 2 : 5;
      return passes * numel_of(&n->in[qi]) * (double)n->in[qi + 1].sizes[n->in[qi + 1].ndim - 2];
    }
    default: return 0;
  }
}

/* TORCHTPU_GRAPH_CUT_MACS: a GEMM-class op cuts the pending graph before it once the
 * graph holds that many multiply-adds of GEMM-class ops (0: never), so the queue thread
 * starts on a model's forward while Python records the rest of it instead of waiting for
 * loop detection in the backward pass. Fusion is lost only for an elementwise chain whose
 * ops lie on both sides of the product. */
static double graph_cut_macs(void) {
  if (cut_macs < 0) {
    const char* e = getenv("TORCHTPU_GRAPH_CUT_MACS");
    double v = e && *e ? atof(e) : 8e6; /* 16 MFLOP */
    cut_macs = v > 0 ? v : 0;
  }
  return cut_macs;
}

static int graph_max_nodes(void) {
  if (!max_nodes) {
    const char* e = getenv("TORCHTPU_GRAPH_MAX_NODES");
    int v = e && *e ? atoi(e) : 0;
    max_nodes = v >= 2 ? v : 4096;
  }
  return max_nodes;
}

/* The graph-local id of v, counted as one more operand reference (-1: host OOM). */
static int ref_value(pending_t* p, const tpu_value_t* v) {
  int id = vmap_id(&p->vmap, v);
  if (id >= 0 && id >= p->vrefs_cap) {
    int cap = p->vrefs_cap ? p->vrefs_cap * 2 : 256;
    while (cap <= id) cap *= 2;
    int* r = tpu__realloc(p->vrefs, sizeof(int) * (size_t)cap);
    if (!r) id = -1;
    else {
      memset(r + p->vrefs_cap, 0, sizeof(int) * (size_t)(cap - p->vrefs_cap));
      p->vrefs = r;
      p->vrefs_cap = cap;
    }
  }
  if (id < 0) p->unkeyed = true;
  else p->vrefs[id]++;
  return id;
}

/* Node m's flow hash; also counts its operand references and records its output 0. */
static uint64_t flow_hash(pending_t* p, int m, uint64_t shape_h) {
  const tpu_node_t* n = p->nodes[m];
  uint64_t h = shape_h;
  for (int i = 0; i < n->n_in; ++i)
    h = mix(h, n->in[i].value ? (uint64_t)ref_value(p, n->in[i].value) + 1 : 0);
  p->out0[m] = -1;
  for (int i = 0; i < n->n_out; ++i) {
    int id = n->out_bound[i] ? ref_value(p, n->out[i].value) : -1;
    if (i == 0) p->out0[m] = id;
    h = mix(h, (uint64_t)(id + 1));
  }
  return h;
}

static void ids_clear(pending_t* p) {
  if (p->vrefs) memset(p->vrefs, 0, sizeof(int) * (size_t)(p->vmap.count < p->vrefs_cap ? p->vmap.count : p->vrefs_cap));
  vmap_clear(&p->vmap);
  p->unkeyed = false;
}

/* Last position of window hash h among the pending ops (-1: none); then records m. */
static int seen_swap(pending_t* p, uint64_t h, int m) {
  if (p->seen_n * 2 >= p->seen_cap) {
    int cap = p->seen_cap ? p->seen_cap * 2 : 512;
    uint64_t* hs = tpu__calloc((size_t)cap, sizeof(uint64_t));
    int* ps = tpu__malloc(sizeof(int) * (size_t)cap);
    if (!hs || !ps) { tpu__free(hs); tpu__free(ps); return -1; }
    for (int i = 0; i < cap; ++i) ps[i] = -1;
    for (int i = 0; i < p->seen_cap; ++i)
      if (p->seen_pos[i] >= 0) {
        size_t k = (size_t)(p->seen_h[i] & (uint64_t)(cap - 1));
        while (ps[k] >= 0) k = (k + 1) & (size_t)(cap - 1);
        hs[k] = p->seen_h[i];
        ps[k] = p->seen_pos[i];
      }
    tpu__free(p->seen_h);
    tpu__free(p->seen_pos);
    p->seen_h = hs;
    p->seen_pos = ps;
    p->seen_cap = cap;
  }
  size_t k = (size_t)(h & (uint64_t)(p->seen_cap - 1));
  while (p->seen_pos[k] >= 0 && p->seen_h[k] != h) k = (k + 1) & (size_t)(p->seen_cap - 1);
  int last = p->seen_pos[k];
  if (last < 0) p->seen_n++;
  p->seen_h[k] = h;
  p->seen_pos[k] = m;
  return last;
}

static tpu_status_t push_node(pending_t* p, tpu_node_t* n) {
  if (p->n == p->cap) {
    int cap = p->cap ? p->cap * 2 : 256;
    tpu_node_t** nodes = tpu__realloc(p->nodes, sizeof(*nodes) * (size_t)cap);
    if (!nodes) return tpu_status_make(TPU_OUT_OF_MEMORY, "host OOM growing the pending graph");
    p->nodes = nodes;
    uint64_t* sh = tpu__realloc(p->shape_h, sizeof(*sh) * (size_t)cap);
    if (!sh) return tpu_status_make(TPU_OUT_OF_MEMORY, "host OOM growing the pending graph");
    p->shape_h = sh;
    int* o0 = tpu__realloc(p->out0, sizeof(*o0) * (size_t)cap);
    if (!o0) return tpu_status_make(TPU_OUT_OF_MEMORY, "host OOM growing the pending graph");
    p->out0 = o0;
    p->cap = cap;
  }
  uint64_t sh = node_shape_hash(n);
  int m = p->n;
  p->nodes[m] = n;
  p->shape_h[m] = sh;
  p->n++;
  p->work += node_macs(n);
  if (n->site) p->last_site = m;
  p->flow = mix(p->flow, flow_hash(p, m, sh));
  p->shape_chain = mix(p->shape_chain, sh);
  /* Repetition: the distance to the previous occurrence of the last LOOP_WINDOW ops is a
   * candidate period; it holds while each op equals the one a period earlier. (A window,
   * not the op alone: an optimizer issues the same op for hundreds of tensors in a row,
   * so one op's previous occurrence says nothing about where the step began.) */
  if (p->period) {
    if (sh == p->shape_h[m - p->period]) p->run++;
    else p->period = p->run = 0;
  }
  /* rolling: window = sum of shape_h[i] * WB^(m - i) over the last LOOP_WINDOW ops */
  p->window = p->window * WB + sh;
  if (m >= LOOP_WINDOW) p->window -= p->shape_h[m - LOOP_WINDOW] * WB_POW;
  if (m + 1 < LOOP_WINDOW) return NULL;
  int last = seen_swap(p, p->window, m);
  if (!p->period && last >= 0 && m - last >= MIN_PERIOD) {
    p->period = m - last;
    p->run = 1;
  }
  return NULL;
}

/* Restarts the pending graph with nodes[from..n) (after a cut of the prefix). */
static tpu_status_t restart_with(pending_t* p, tpu_node_t** rest, int count) {
  p->n = 0;
  p->work = 0;
  p->flow = 0;
  p->shape_chain = 0;
  p->window = 0;
  p->period = p->run = 0;
  if (p->seen_pos) for (int i = 0; i < p->seen_cap; ++i) p->seen_pos[i] = -1;
  p->seen_n = 0;
  p->last_site = -1;
  ids_clear(p);
  for (int i = 0; i < count; ++i) TPU_RETURN_IF_ERROR(push_node(p, rest[i]));
  return NULL;
}

tpu_status_t tpu__graph_append(int device, tpu_node_t* n) {
  if (device < 0 || device >= MAX_DEVICES) {
    tpu__node_free(n);
    return tpu_status_make(TPU_INVALID_ARGUMENT, "bad device %d", device);
  }
  pthread_mutex_lock(&graph_mu);
  pending_t* p = &pend[device];
  appending = true;
  tpu_status_t st = p->cut_due ? flush_locked(device, SAME_AS_PREVIOUS, p->n) : NULL;
  if (!st && p->n && graph_cut_macs() && p->work >= graph_cut_macs() && node_macs(n) > 0)
    st = flush_locked(device, GEMM_CUT, p->n);
  if (!st) st = push_node(p, n);
  if (st) { appending = false; pthread_mutex_unlock(&graph_mu); tpu__node_free(n); return st; }
  if (p->period && p->run >= p->period) {
    /* The last 2P ops are two copies of one period: cut any warm-up before them, then
     * each copy as its own graph; later copies are cut by the previous-graph rule. */
    int period = p->period, start = p->n - 2 * period;
    if (start > 0) st = flush_locked(device, "ops before a detected loop", start);
    if (!st) st = flush_locked(device, "loop detected: the op stream repeated", period);
    if (!st) st = flush_locked(device, SAME_AS_PREVIOUS, period);
  } else if (p->last_len && p->n == p->last_len && p->shape_chain == p->last_chain)
    /* Cut when the next op comes. A host read usually comes first (a loop reading its
     * loss each step): then the graph runs on the reading thread (tpu__flush_for_sync)
     * instead of waking the queue thread, which would then wake the reader. */
    p->cut_due = true;
  else if (p->n >= graph_max_nodes())
    st = flush_locked(device, "size limit (TORCHTPU_GRAPH_MAX_NODES)", p->n);
  appending = false;
  pthread_mutex_unlock(&graph_mu);
  return st;
}

tpu_status_t tpu_flush(int device, const char* reason) {
  if (device < 0 || device >= MAX_DEVICES) return NULL;
  pthread_mutex_lock(&graph_mu);
  tpu_status_t st = pend[device].n ? flush_locked(device, reason, pend[device].n) : NULL;
  pthread_mutex_unlock(&graph_mu);
  return st;
}

/* While set, flush_locked hands its graph node here instead of queueing it. */
static _Thread_local tpu_node_t** held_graph;

tpu_status_t tpu__flush_for_sync(int device, const char* reason) {
  if (device < 0 || device >= MAX_DEVICES) return NULL;
  tpu_node_t* gn = NULL;
  pthread_mutex_lock(&graph_mu);
  held_graph = &gn;
  tpu_status_t st = pend[device].n ? flush_locked(device, reason, pend[device].n) : NULL;
  held_graph = NULL;
  if (!gn) { pthread_mutex_unlock(&graph_mu); return st; }
  /* graph_mu is released once the graph has its place in the queue (a graph another
   * thread cuts next runs after it), and not held while it runs */
  tpu_status_t qs = tpu__queue_run_here(device, gn, &graph_mu);
  if (st) { tpu_status_free(qs); return st; }
  return qs;
}

/* ---- planning ----------------------------------------------------------------------------- */
static bool same_shape(const tpu_operand_t* a, const tpu_operand_t* b) {
  if (a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; ++d) if (a->sizes[d] != b->sizes[d]) return false;
  return true;
}

/* A set of value pointers (open addressing; cleared per group). */
typedef struct vset_s { const tpu_value_t** keys; int cap, n; } vset_t;

static bool vset_has(const vset_t* v, const tpu_value_t* x) {
  if (!v->cap) return false;
  size_t h = ((uintptr_t)x >> 4) & (size_t)(v->cap - 1);
  while (v->keys[h]) {
    if (v->keys[h] == x) return true;
    h = (h + 1) & (size_t)(v->cap - 1);
  }
  return false;
}

static bool vset_add(vset_t* v, const tpu_value_t* x) {
  if ((v->n + 1) * 2 > v->cap) {
    int cap = v->cap ? v->cap * 2 : 64;
    const tpu_value_t** k = tpu__calloc((size_t)cap, sizeof(*k));
    if (!k) return false;
    for (int i = 0; i < v->cap; ++i)
      if (v->keys[i]) {
        size_t h = ((uintptr_t)v->keys[i] >> 4) & (size_t)(cap - 1);
        while (k[h]) h = (h + 1) & (size_t)(cap - 1);
        k[h] = v->keys[i];
      }
    tpu__free(v->keys);
    v->keys = k;
    v->cap = cap;
  }
  size_t h = ((uintptr_t)x >> 4) & (size_t)(v->cap - 1);
  while (v->keys[h] && v->keys[h] != x) h = (h + 1) & (size_t)(v->cap - 1);
  if (!v->keys[h]) { v->keys[h] = x; v->n++; }
  return true;
}

static void vset_clear(vset_t* v) {
  if (v->keys) memset(v->keys, 0, sizeof(*v->keys) * (size_t)v->cap);
  v->n = 0;
}

/* Adding c to the group is safe when every value written in the group is accessed
 * through one view only (so element i of every access is the same memory). */
static bool hazard_free(tpu_node_t** nodes, const int* members, int m, const tpu_node_t* c) {
  const tpu_operand_t* cw = &c->out[0];
  for (int g = 0; g < m; ++g) {
    const tpu_node_t* n = nodes[members[g]];
    const tpu_operand_t* nw = &n->out[0];
    if (nw->value == cw->value && !tpu__operand_same_view(nw, cw)) return false;
    for (int j = 0; j < c->n_in; ++j)
      if (c->in[j].value == nw->value && !tpu__operand_same_view(&c->in[j], nw)) return false;
    for (int j = 0; j < n->n_in; ++j)
      if (n->in[j].value == cw->value && !tpu__operand_same_view(&n->in[j], cw)) return false;
  }
  return true;
}

/* References to v held by operands of the group's nodes. */
static int refs_in(tpu_node_t** nodes, const int* members, int m, const tpu_value_t* v) {
  int r = 0;
  for (int g = 0; g < m; ++g) {
    const tpu_node_t* n = nodes[members[g]];
    for (int j = 0; j < n->n_in; ++j) r += n->in[j].value == v;
    for (int j = 0; j < n->n_out; ++j) r += n->out_bound[j] && n->out[j].value == v;
  }
  return r;
}

/* Node j may move up past the skipped nodes (those it is scheduled before) when it
 * writes nothing they touch and reads nothing they write. */
static bool independent_of(const tpu_node_t* j, const vset_t* skipped_reads, const vset_t* skipped_writes) {
  for (int k = 0; k < j->n_out; ++k)
    if (j->out_bound[k] && (vset_has(skipped_reads, j->out[k].value) || vset_has(skipped_writes, j->out[k].value)))
      return false;
  for (int k = 0; k < j->n_in; ++k)
    if (j->in[k].value && vset_has(skipped_writes, j->in[k].value)) return false;
  return true;
}

static bool note_skipped(const tpu_node_t* k, vset_t* reads, vset_t* writes) {
  bool ok = true;
  for (int i = 0; i < k->n_in; ++i) if (k->in[i].value) ok &= vset_add(reads, k->in[i].value);
  for (int i = 0; i < k->n_out; ++i) if (k->out_bound[i]) ok &= vset_add(writes, k->out[i].value);
  return ok;
}

/* Value -> first candidate touching it, for the components: the graph's value ids
 * (vmap_t) index a growable array. */
typedef struct owners_s { vmap_t ids; int* node; int cap; } owners_t;

static int* owner_slot(owners_t* o, const tpu_value_t* v) {
  int id = vmap_id(&o->ids, v);
  if (id < 0) return NULL;
  if (id >= o->cap) {
    int cap = o->cap ? o->cap * 2 : 256;
    while (cap <= id) cap *= 2;
    int* nd = tpu__realloc(o->node, sizeof(int) * (size_t)cap);
    if (!nd) return NULL;
    for (int i = o->cap; i < cap; ++i) nd[i] = -1;
    o->node = nd;
    o->cap = cap;
  }
  return &o->node[id];
}

static int uf_find(int* parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

/* Candidates of a group started at node i: the unassigned fusable nodes of i's output
 * shape within the window, joined into components by the values they touch (an
 * optimizer's per-parameter chain is one component even when its ops lie hundreds of
 * ops apart, issued op-major over the parameters). comp[j - i] is j's component root
 * (-1: not a candidate), size[root] its candidate count. */
static bool components(tpu_graph_t* g, int i, int limit, const uint8_t* fusable, const uint8_t* assigned,
                       int* comp, int* size, owners_t* vm) {
  const tpu_operand_t* shape = &g->nodes[i]->out[0];
  for (int k = 0; k < vm->ids.count && k < vm->cap; ++k) vm->node[k] = -1;
  vmap_clear(&vm->ids);
  for (int j = i; j < limit; ++j) {
    int r = j - i;
    comp[r] = -1;
    if (assigned[j] && j != i) continue;
    const tpu_node_t* c = g->nodes[j];
    if (!fusable[j] || !same_shape(&c->out[0], shape)) continue;
    comp[r] = r;
    size[r] = 1;
    for (int k = 0; k < c->n_in + c->n_out; ++k) {
      const tpu_value_t* v = k < c->n_in ? c->in[k].value : c->out[k - c->n_in].value;
      if (!v) continue;
      int* slot = owner_slot(vm, v);
      if (!slot) return false;
      if (*slot < 0) { *slot = r; continue; }
      int a = uf_find(comp, *slot), b = uf_find(comp, r);
      if (a == b) continue;
      if (a > b) { int t = a; a = b; b = t; }
      comp[b] = a; /* the earlier node is the root */
      size[a] += size[b];
    }
  }
  for (int r = 0; r < limit - i; ++r) if (comp[r] >= 0) comp[r] = uf_find(comp, r);
  return true;
}

/* c reads, as its input 0 and through the same view, the output of a group member
 * (the latest one writing that value), has the group's shape there, reads nothing else
 * the group writes, and the driver can run it on the rows the group computes. */
static bool ends_group(tpu_driver_t* drv, tpu_node_t** nodes, const int* members, int m, const tpu_node_t* c) {
  if (!drv->vt->can_end_group || c->n_in < 1 || !c->in[0].value) return false;
  /* its other inputs (weight, bias) must come from memory, not from the group */
  for (int j = 1; j < c->n_in; ++j)
    for (int q = 0; q < m && c->in[j].value; ++q)
      if (nodes[members[q]]->out[0].value == c->in[j].value) return false;
  for (int q = m - 1; q >= 0; --q) {
    const tpu_node_t* p = nodes[members[q]];
    if (p->out[0].value != c->in[0].value) continue;
    return tpu__operand_same_view(&p->out[0], &c->in[0]) && same_shape(&c->in[0], &nodes[members[0]]->out[0]) &&
           drv->vt->can_end_group(drv, p, c);
  }
  return false;
}

/* Groups fusable nodes of one output shape, also across independent ops in between,
 * within a window of LOOKAHEAD ops. Whole components are taken (the start node's first,
 * then each further component met in program order while it fits in MAX_GROUP), so a
 * group holds complete chains whose temporaries stay internal, rather than the same op
 * over many unrelated tensors. A member joins only if it is independent of every node it
 * moves up past. Nodes that cannot fuse keep their program order; a group runs where its
 * first op was. Further components join only groups of at most TPU_GROUP_SMALL_NUMEL
 * elements: for small tensors (an optimizer's many small parameters) sharing a group
 * saves each chain's per-group costs; for large ones it saves nothing and adds streams
 * that a tile must hold in L1, so the driver's tiles shrink (host/fuse.c). */
#define LOOKAHEAD 2048

/* Reorders a merged group's members component by component, each in program order: the
 * chains of different components share no value, so this computes the same, and the
 * driver's tile loop then runs each chain's ops one after another on a tile while its
 * operands are in cache, instead of one op over every chain's tile (op-major, as an
 * optimizer's foreach ops issue them). A row reduction ending the group stays last. */
static void chain_major(int* members, int m, const int* comp, int i, const uint8_t* fusable) {
  int n = m > 0 && !fusable[members[m - 1]] ? m - 1 : m;
  int sorted[MAX_GROUP];
  uint8_t done[MAX_GROUP] = {0};
  int k = 0;
  for (int q = 0; q < n; ++q) {
    if (done[q]) continue;
    int root = comp[members[q] - i];
    for (int r = q; r < n; ++r)
      if (!done[r] && comp[members[r] - i] == root) { sorted[k++] = members[r]; done[r] = 1; }
  }
  memcpy(members, sorted, sizeof(int) * (size_t)n);
}

static tpu_status_t partition(tpu_graph_t* g) {
  tpu_driver_t* drv = tpu__driver();
  bool fusion = drv->vt->can_fuse && drv->vt->run_group;
  uint8_t* assigned = tpu__calloc((size_t)g->n, 1);
  uint8_t* fusable = tpu__calloc((size_t)g->n, 1);
  int* members = tpu__malloc(sizeof(int) * MAX_GROUP);
  int win = g->n < LOOKAHEAD ? g->n : LOOKAHEAD;
  int* comp = tpu__malloc(sizeof(int) * (size_t)(win ? win : 1));
  int* size = tpu__malloc(sizeof(int) * (size_t)(win ? win : 1));
  uint8_t* taken = tpu__calloc((size_t)(win ? win : 1), 1); /* per root: accepted */
  vset_t sr = {0}, sw = {0};
  owners_t vm = {0};
  tpu_status_t st = NULL;
  if (!assigned || !fusable || !members || !comp || !size || !taken) goto oom;
  for (int i = 0; fusion && i < g->n; ++i) fusable[i] = drv->vt->can_fuse(drv, g->nodes[i]);
  int pos = 0;
  for (int i = 0; i < g->n; ++i) {
    if (assigned[i]) continue;
    int m = 0;
    members[m++] = i;
    assigned[i] = 1;
    if (fusable[i]) {
      int limit = g->n < i + LOOKAHEAD ? g->n : i + LOOKAHEAD;
      if (!components(g, i, limit, fusable, assigned, comp, size, &vm)) goto oom;
      memset(taken, 0, (size_t)(limit - i));
      taken[0] = 1;
      int left = size[0] - 1; /* members of accepted components not yet placed */
      bool merge = tpu__operand_numel(&g->nodes[i]->out[0]) <= TPU_GROUP_SMALL_NUMEL;
      vset_clear(&sr);
      vset_clear(&sw);
      bool sets_ok = true;
      for (int j = i + 1; j < limit && m < MAX_GROUP && sets_ok; ++j) {
        if (assigned[j]) continue;
        int root = comp[j - i];
        if (root >= 0 && !taken[root] && merge && m + left + size[root] <= MAX_GROUP) {
          taken[root] = 1;
          left += size[root];
        }
        tpu_node_t* c = g->nodes[j];
        if (root >= 0 && taken[root]) {
          left--;
          if (hazard_free(g->nodes, members, m, c) && independent_of(c, &sr, &sw)) {
            members[m++] = j;
            assigned[j] = 1;
            continue;
          }
        }
        /* A row reduction of a member's output ends the group. */
        if (!fusable[j] && ends_group(drv, g->nodes, members, m, c) && independent_of(c, &sr, &sw)) {
          members[m++] = j;
          assigned[j] = 1;
          break;
        }
        sets_ok = note_skipped(c, &sr, &sw);
      }
      if (merge) chain_major(members, m, comp, i, fusable);
    }
    g->glen[pos] = m;
    for (int k = 0; k < m; ++k) {
      int idx = members[k];
      g->order[pos + k] = idx;
      const tpu_node_t* nk = g->nodes[idx];
      const tpu_operand_t* o = &nk->out[0];
      /* Internal: every reference to the value is an operand of this group (no tensor
       * holds it, no op outside the group reads it), each read uses the producing view,
       * and the value is born in the group: a functional member creates it (an in-place
       * member writes a value some earlier internal member created). */
      bool born = nk->variant == TPU_VARIANT_FUNCTIONAL;
      for (int q = 0; q < k && !born; ++q)
        born = g->internal[members[q]] && g->nodes[members[q]]->variant == TPU_VARIANT_FUNCTIONAL &&
               g->nodes[members[q]]->out[0].value == o->value;
      /* (an ending row reduction writes memory, never tile buffers: not internal) */
      bool internal = m > 1 && born && fusable[idx] &&
                      atomic_load(&o->value->refs) == refs_in(g->nodes, members, m, o->value);
      for (int r = 0; internal && r < m; ++r) {
        if (r == k) continue;
        const tpu_node_t* rn = g->nodes[members[r]];
        for (int j = 0; j < rn->n_in; ++j)
          if (rn->in[j].value == o->value && !tpu__operand_same_view(&rn->in[j], o)) internal = false;
        if (rn->out[0].value == o->value && !tpu__operand_same_view(&rn->out[0], o)) internal = false;
      }
      /* A value read by a group member *before* its producer in the member order would
       * read memory, so it must be stored: each component's members are in program order
       * (chain_major), and components share no value, so this holds. */
      g->internal[idx] = internal;
    }
    pos += m;
  }
  goto done;
oom:
  st = tpu_status_make(TPU_OUT_OF_MEMORY, "host OOM planning a graph");
done:
  tpu__free(assigned);
  tpu__free(fusable);
  tpu__free(members);
  tpu__free(comp);
  tpu__free(size);
  tpu__free(taken);
  tpu__free(sr.keys);
  tpu__free(sw.keys);
  tpu__free(vm.ids.keys);
  tpu__free(vm.ids.ids);
  tpu__free(vm.node);
  return st;
}

/* The key adds, to the flow hash, which values are referenced only by the graph: a
 * value's refcount equals the operand references counted while appending. */
static uint64_t plan_key(const pending_t* p, int n, uint64_t flow) {
  uint64_t h = mix(flow, (uint64_t)n);
  for (int i = 0; i < n; ++i) {
    int id = p->out0[i];
    if (id >= 0) h = mix(h, (uint64_t)(atomic_load(&p->nodes[i]->out[0].value->refs) == p->vrefs[id]));
  }
  return h;
}

static tpu_status_t flush_locked(int device, const char* reason, int upto) {
  pending_t* p = &pend[device];
  if (p->cut_due && upto == p->n) reason = SAME_AS_PREVIOUS; /* the cut the ops asked for */
  p->cut_due = false;
  double t0 = now_us();
  int n = upto;
  /* Flow hash and key of the prefix: recomputed (ids, reference counts) when cutting
   * before the end. */
  uint64_t flow = p->flow, key;
  bool keyed;
  if (upto == p->n) {
    key = plan_key(p, n, flow);
    keyed = !p->unkeyed;
  } else {
    pending_t whole = *p;
    p->vmap = (vmap_t){0};
    p->vrefs = NULL;
    p->vrefs_cap = 0;
    p->unkeyed = false;
    flow = 0;
    for (int i = 0; i < n; ++i) flow = mix(flow, flow_hash(p, i, p->shape_h[i]));
    key = plan_key(p, n, flow);
    keyed = !p->unkeyed;
    tpu__free(p->vmap.keys);
    tpu__free(p->vmap.ids);
    tpu__free(p->vrefs);
    /* out0 of the prefix's nodes is the same in both numberings, unless an id could not
     * be made (host OOM): then the whole graph's key is not trusted either */
    whole.unkeyed |= !keyed;
    *p = whole;
  }
  uint64_t chain = 0;
  for (int i = 0; i < n; ++i) chain = mix(chain, p->shape_h[i]);
  tpu_graph_t* g = tpu__calloc(1, sizeof(*g));
  tpu_node_t* gn = tpu__node_create();
  if (g) {
    g->nodes = tpu__malloc(sizeof(tpu_node_t*) * (size_t)n);
    g->order = tpu__malloc(sizeof(int) * (size_t)n);
    g->glen = tpu__calloc((size_t)n, sizeof(int));
    g->internal = tpu__calloc((size_t)n, 1);
  }
  if (!g || !gn || !g->nodes || !g->order || !g->glen || !g->internal) {
    tpu__graph_free(g);
    tpu__node_free(gn);
    return tpu_status_make(TPU_OUT_OF_MEMORY, "host OOM cutting the pending graph");
  }
  g->device = device;
  g->n = n;
  memcpy(g->nodes, p->nodes, sizeof(tpu_node_t*) * (size_t)n);
  plan_t* hit = NULL;
  for (plan_t* c = keyed ? plan_cache[key % PLAN_CACHE_CAP] : NULL; c; c = c->next)
    if (c->key == key && c->n == n) { hit = c; break; }
  if (hit) {
    memcpy(g->order, hit->order, sizeof(int) * (size_t)n);
    memcpy(g->glen, hit->glen, sizeof(int) * (size_t)n);
    memcpy(g->internal, hit->internal, (size_t)n);
    plan_hits++;
  } else {
    tpu_status_t pst = partition(g);
    if (pst) {
      tpu__graph_free(g);
      tpu__node_free(gn);
      return pst;
    }
    plans_built++;
    plan_t* c = keyed ? tpu__calloc(1, sizeof(*c)) : NULL;
    if (c) {
      c->order = tpu__malloc(sizeof(int) * (size_t)n);
      c->glen = tpu__malloc(sizeof(int) * (size_t)n);
      c->internal = tpu__malloc((size_t)n);
      if (c->order && c->glen && c->internal) {
        c->key = key;
        c->n = n;
        memcpy(c->order, g->order, sizeof(int) * (size_t)n);
        memcpy(c->glen, g->glen, sizeof(int) * (size_t)n);
        memcpy(c->internal, g->internal, (size_t)n);
        c->next = plan_cache[key % PLAN_CACHE_CAP];
        plan_cache[key % PLAN_CACHE_CAP] = c;
      } else {
        tpu__free(c->order); tpu__free(c->glen); tpu__free(c->internal); tpu__free(c);
      }
    }
  }
  /* The explain record. */
  tpu_cut_record_t rec = {0};
  snprintf(rec.reason, sizeof rec.reason, "%s", reason);
  const char* site = NULL; /* (nodes carry sites only in debug mode or at a host read) */
  if (p->last_site >= 0 && p->last_site < n) site = g->nodes[p->last_site]->site;
  for (int i = p->last_site >= n ? n - 1 : -1; i >= 0 && !site; --i) site = g->nodes[i]->site;
  const char* cur = tpu__current_site();
  snprintf(rec.site, sizeof rec.site, "%s", cur ? cur : site ? site : "");
  if (n > 0) snprintf(rec.last_op, sizeof rec.last_op, "%s", tpu__node_describe(g->nodes[n - 1]));
  rec.device = device;
  rec.nodes = n;
  rec.key = key;
  rec.cache_hit = hit != NULL;
  for (int pos = 0; pos < n;) {
    int len = g->glen[pos];
    rec.kernels++;
    if (len > 1) {
      rec.fused_groups++;
      rec.fused_nodes += len;
      rec.fused_reductions += !tpu__driver()->vt->can_fuse(tpu__driver(), g->nodes[g->order[pos + len - 1]]);
      for (int k = pos; k < pos + len; ++k) rec.internal_values += g->internal[g->order[k]];
    }
    pos += len;
  }
  rec.plan_us = now_us() - t0;
  pthread_mutex_lock(&explain_mu);
  g->explain_index = explain_n < EXPLAIN_CAP ? explain_n : -1;
  if (explain_n < EXPLAIN_CAP) {
    if (!rec.site[0] && appending) {
      if (unsited_first < 0 || unsited_gen != explain_gen) unsited_first = explain_n;
      unsited_last = explain_n;
      unsited_gen = explain_gen;
    }
    explain_log[explain_n++] = rec;
  }
  pthread_mutex_unlock(&explain_mu);
  /* Keep the remainder (after a loop cut) as the new pending graph. */
  p->last_chain = chain;
  p->last_len = n;
  tpu_status_t st = restart_with(p, p->nodes + n, p->n - n);
  gn->kind = TPU_KIND_GRAPH;
  gn->graph = g;
  if (held_graph) { *held_graph = gn; return st; }
  tpu_status_t qs = tpu__queue_push(device, gn, false);
  if (st) { tpu_status_free(qs); return st; }
  return qs;
}

/* ---- execution (queue thread) --------------------------------------------------------------- */
/* Buffer donation: an elementwise node whose input dies with it (no tensor, no later op
 * references the value) and is viewed exactly as the output writes its output into that
 * input's buffer, as an in-place op would; the output takes no new memory. Returns 1 if
 * it donated. */
static bool same_layout(const tpu_operand_t* a, const tpu_operand_t* b) {
  tpu_operand_t c = *a;
  c.value = b->value;
  return tpu__operand_same_view(&c, b);
}

static int donate_dead_input(tpu_node_t* n) {
  tpu_operand_t* o = &n->out[0];
  if (n->n_out != 1 || !n->out_bound[0] || o->value->data) return 0;
  for (int j = 0; j < n->n_in; ++j) {
    tpu_operand_t* in = &n->in[j];
    tpu_value_t* v = in->value;
    if (!v || !v->data || v == o->value || v->nbytes != o->value->nbytes || !same_layout(in, o)) continue;
    int r = 0;
    for (int k = 0; k < n->n_in; ++k) r += n->in[k].value == v;
    if (atomic_load(&v->refs) != r) continue;
    /* The buffer moves to the output value; the node's reads of v now go through it. */
    o->value->data = v->data;
    v->data = NULL;
    for (int k = 0; k < n->n_in; ++k)
      if (n->in[k].value == v) {
        tpu__value_retain(o->value);
        n->in[k].value = o->value;
        tpu__value_release(v);
      }
    return 1;
  }
  return 0;
}

/* From position pos, the single-kernel steps the driver may run at once
 * (run_independent) into run[]: small streaming nodes (a fused optimizer's step of one
 * parameter each) of which none writes a value another one reads or writes, all of
 * whose values hold memory already (two threads never materialize one value). Returns
 * how many (0 or 1: run pos alone). */
static bool may_join(const tpu_graph_t* g, int q) {
  if (q >= g->n || g->glen[q] != 1) return false;
  const tpu_node_t* n = g->nodes[g->order[q]];
  return (n->flags & TPU_NODE_STREAMING) && tpu__node_is_small(n);
}

static int independent_run(const tpu_graph_t* g, int pos, tpu_node_t** run) {
  /* the common cases (no streaming node, or one alone) without building the sets */
  if (!may_join(g, pos) || !may_join(g, pos + 1)) return 0;
  vset_t reads = {0}, writes = {0};
  int k = 0;
  for (int q = pos; k < TPU_MAX_INDEPENDENT && (q < pos + 2 || may_join(g, q)); ++q) { /* pos, pos+1: checked */
    tpu_node_t* n = g->nodes[g->order[q]];
    bool clash = false, ok = true;
    for (int i = 0; i < n->n_out && !clash; ++i)
      clash = n->out_bound[i] && (!n->out[i].value->data || vset_has(&reads, n->out[i].value) ||
                                  vset_has(&writes, n->out[i].value));
    for (int i = 0; i < n->n_in && !clash; ++i)
      clash = n->in[i].value && (!n->in[i].value->data || vset_has(&writes, n->in[i].value));
    if (clash) break;
    for (int i = 0; i < n->n_out && ok; ++i) ok = !n->out_bound[i] || vset_add(&writes, n->out[i].value);
    for (int i = 0; i < n->n_in && ok; ++i) ok = !n->in[i].value || vset_add(&reads, n->in[i].value);
    if (!ok) break; /* host OOM: run them one at a time */
    run[k++] = n;
  }
  tpu__free(reads.keys);
  tpu__free(writes.keys);
  return k;
}

tpu_status_t tpu__graph_run(int device, tpu_graph_t* g) {
  double t0 = now_us();
  int donated = 0;
  tpu_driver_t* drv = tpu__driver();
  tpu_status_t first = NULL;
  tpu_node_t* members[MAX_GROUP];
  uint8_t internal[MAX_GROUP];
  tpu_vmark_t inside;
  tpu_node_t* run[TPU_MAX_INDEPENDENT];
  for (int pos = 0; pos < g->n;) {
    int len = g->glen[pos];
    tpu_status_t st = NULL;
    int nrun = drv->vt->run_independent ? independent_run(g, pos, run) : 0;
    if (nrun > 1) {
      st = drv->vt->run_independent(drv, device, run, nrun);
      len = nrun;
    } else if (len == 1) {
      tpu_node_t* n = g->nodes[g->order[pos]];
      if (drv->vt->can_fuse && drv->vt->can_fuse(drv, n)) donated += donate_dead_input(n);
      st = tpu__node_run(device, n);
    } else {
      for (int k = 0; k < len; ++k) {
        members[k] = g->nodes[g->order[pos + k]];
        internal[k] = g->internal[g->order[pos + k]];
      }
      tpu__vmark_clear(&inside); /* values produced inside the group, never stored */
      for (int k = 0; k < len && !st; ++k) {
        tpu_node_t* n = members[k];
        for (int j = 0; j < n->n_in && !st; ++j)
          if (n->in[j].value && tpu__vmark_get(&inside, n->in[j].value) < 0)
            st = tpu__value_materialize(n->in[j].value);
        if (!st && !internal[k]) st = tpu__value_materialize(n->out[0].value);
        if (internal[k]) *tpu__vmark_slot(&inside, n->out[0].value) = k;
        /* an ending row reduction: every output is stored */
        for (int j = 1; j < n->n_out && !st && k == len - 1 && !drv->vt->can_fuse(drv, n); ++j)
          if (n->out_bound[j]) st = tpu__value_materialize(n->out[j].value);
      }
      if (!st) st = drv->vt->run_group(drv, members, len, internal);
      if (st)
        st = tpu_status_annotate(st, "error in a fused group of %d ops starting with %s", len,
                                 tpu__node_describe(members[0]));
    }
    if (st) { if (!first) first = st; else tpu_status_free(st); }
    /* Free the kernel's nodes now: values die at their last use and their memory
     * returns to the pool for the next value. */
    for (int k = pos; k < pos + len; ++k) {
      tpu__node_free(g->nodes[g->order[k]]);
      g->nodes[g->order[k]] = NULL;
    }
    pos += len;
  }
  if (g->explain_index >= 0) {
    pthread_mutex_lock(&explain_mu);
    if (g->explain_index < explain_n) {
      explain_log[g->explain_index].run_us = now_us() - t0;
      explain_log[g->explain_index].donated = donated;
    }
    pthread_mutex_unlock(&explain_mu);
  }
  return first;
}

void tpu__graph_free(tpu_graph_t* g) {
  if (!g) return;
  for (int i = 0; g->nodes && i < g->n; ++i) tpu__node_free(g->nodes[i]);
  tpu__free(g->nodes);
  tpu__free(g->order);
  tpu__free(g->glen);
  tpu__free(g->internal);
  tpu__free(g);
}

/* ---- explain ----------------------------------------------------------------------------------- */
int tpu_explain_count(void) {
  pthread_mutex_lock(&explain_mu);
  int n = explain_n;
  pthread_mutex_unlock(&explain_mu);
  return n;
}

bool tpu_explain_get(int i, tpu_cut_record_t* out) {
  pthread_mutex_lock(&explain_mu);
  bool ok = i >= 0 && i < explain_n;
  if (ok) *out = explain_log[i];
  pthread_mutex_unlock(&explain_mu);
  return ok;
}

bool tpu_explain_needs_site(void) { return unsited_first >= 0; }

void tpu_explain_fill_site(const char* site) {
  if (unsited_first < 0) return;
  pthread_mutex_lock(&explain_mu);
  for (int i = unsited_first; unsited_gen == explain_gen && i <= unsited_last && i < explain_n; ++i)
    if (!explain_log[i].site[0]) snprintf(explain_log[i].site, sizeof explain_log[i].site, "%s", site ? site : "");
  pthread_mutex_unlock(&explain_mu);
  unsited_first = -1;
}

void tpu_explain_clear(void) {
  pthread_mutex_lock(&explain_mu);
  explain_gen++;
  explain_n = 0;
  pthread_mutex_unlock(&explain_mu);
  pthread_mutex_lock(&graph_mu);
  plans_built = plan_hits = 0;
  pthread_mutex_unlock(&graph_mu);
}

void tpu_plan_cache_stats(uint64_t* out_plans, uint64_t* out_hits) {
  pthread_mutex_lock(&graph_mu);
  *out_plans = plans_built;
  *out_hits = plan_hits;
  pthread_mutex_unlock(&graph_mu);
}
