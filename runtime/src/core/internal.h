/* Internal contract of libtpurt: values, nodes, the op-kind table, the driver vtable and
 * the helpers that kernels and ATen builders share. Not installed. */
#ifndef TPURT_CORE_INTERNAL_H_
#define TPURT_CORE_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "tpurt/runtime.h"

/* ---- host allocation: every host allocation of the runtime goes through these, so
 * tests can count them and make the Nth one fail (tpu__alloc_fail_after). */
void* tpu__malloc(size_t n);
void* tpu__calloc(size_t count, size_t n);
void* tpu__realloc(void* p, size_t n);
void tpu__free(void* p);
void tpu__alloc_fail_after(int64_t n); /* -1 disables */
/* Large freed blocks are kept for the next allocation that fits (base/alloc.c); these
 * free them all and say how many bytes are kept. */
void tpu__scratch_release(void);
size_t tpu__scratch_kept_bytes(void);
char* tpu__strdup(const char* s);
/* a*b with overflow check; returns false on overflow. */
static inline bool tpu__mul_ok(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

/* ---- op kinds: what a driver executes. One X-macro file per family. */
typedef enum tpu_kind_e {
#define TPU_KIND(name) TPU_KIND_##name,
#include "core/kinds.def"
#undef TPU_KIND
  TPU_KIND_COUNT
} tpu_kind_t;
const char* tpu__kind_name(tpu_kind_t kind);

/* ---- values: immutable refcounted device buffers (docs/architecture.md). */
typedef struct tpu_value_s {
  atomic_int refs;
  int device;
  uint64_t nbytes;
  void* data; /* device memory; for the host driver, host-addressable */
} tpu_value_t;

/* Creates a value. In defer_and_fuse mode no device memory is taken yet (data NULL);
 * tpu__value_materialize allocates it when a kernel first touches the value. */
tpu_status_t tpu__value_create(int device, uint64_t nbytes, tpu_value_t** out_value);
tpu_status_t tpu__value_materialize(tpu_value_t* v);
void tpu__value_retain(tpu_value_t* v);
void tpu__value_release(tpu_value_t* v); /* accepts NULL */

struct tpu_storage_s {
  atomic_int refs;
  int device;
  uint64_t nbytes;
  tpu_value_t* value; /* current value; changed only by the thread that owns the tensor */
};

/* ---- operands and nodes. An operand is a strided window of a value, or a scalar. */
typedef struct tpu_operand_s {
  tpu_value_t* value; /* retained by the node; NULL for scalars and absent inputs */
  tpu_dtype_t dtype;
  int32_t ndim;
  int64_t offset;
  int64_t sizes[TPU_MAX_DIMS];
  int64_t strides[TPU_MAX_DIMS];
  bool is_scalar;
  double scalar_d;  /* scalar value as double and as int64 (both always set) */
  int64_t scalar_i;
  double scalar_im; /* imaginary part of a complex scalar (0 for real ones) */
} tpu_operand_t;

#define TPU_NODE_MAX_OUT 5
#define TPU_NODE_NUM_IATTR 16
#define TPU_NODE_NUM_DATTR 8

struct tpu_node_s {
  int aten_index;       /* which ATen entry built it (for messages) */
  tpu_kind_t kind;      /* what runs */
  tpu_variant_t variant;
  tpu_dtype_t compute;  /* compute dtype chosen by the builder (elementwise/reductions) */
  int n_in, cap_in;
  tpu_operand_t* in;
  int n_out;
  tpu_operand_t out[TPU_NODE_MAX_OUT];
  bool out_bound[TPU_NODE_MAX_OUT];
  struct tpu_then_s* then;        /* owned, NULL: a follow-up op (tpu__build_then) */
  int64_t ia[TPU_NODE_NUM_IATTR]; /* integer attributes: meaning per kind */
  double da[TPU_NODE_NUM_DATTR];  /* float attributes */
  int64_t* ilist;                 /* one owned int-list attribute (dims, sizes, ...) */
  int ilist_len;
  char* site;                     /* caller description for messages, owned */
  uint32_t flags;                 /* TPU_NODE_* */
  uint32_t runtime_ia;            /* bit i: ia[i] is a run-time value (a seed), like a
                                     scalar operand: not part of a graph's structure */
  struct tpu_graph_s* graph;      /* kind GRAPH: the cut graph this node runs */
  struct tpu_event_s* event;      /* kind MARKER: the event it completes (a reference) */
  uint64_t event_seq;             /* ... as of this record of it */
  struct tpu_node_s* next;        /* queue link */
  int64_t queue_bytes;            /* its outputs' bytes while it waits in the queue */
};

/* Runs a MARKER node: completes its event (core/event.c). */
void tpu__marker_run(tpu_node_t* n);
void tpu__event_unref(struct tpu_event_s* e);

#define TPU_NODE_DEBUG 1u /* debug mode: check outputs, record in the trace */
/* Set by the builder of an op whose cost is a few streaming passes over its operands
 * (like a fusable elementwise op's): the queue runs it inline up to INLINE_EW_BYTES. */
#define TPU_NODE_STREAMING 2u

tpu_node_t* tpu__node_create(void); /* NULL on host OOM */

/* A follow-up op of a composite ATen op (aten/table.c, tpu__build_then): the table entry
 * `index` runs in place on the node's output 0 right after the node, with args[1..nargs)
 * as its remaining arguments (args[0] becomes output 0's view). tpu_node_bind_output
 * records that view (its storage borrowed until submit, as the caller keeps the tensor
 * alive); tpu_node_submit builds the follow-up from it and queues both, in order. */
#define TPU_THEN_MAX_ARGS 4
typedef struct tpu_then_s {
  int index;
  int nargs;
  tpu_arg_t args[TPU_THEN_MAX_ARGS];
  tpu_view_t out_view;
  bool bound;
} tpu_then_t;
/* This thread's call site set by tpu_set_call_site (borrowed; NULL if none). */
const char* tpu__current_site(void);
/* Adds an input that reads view's storage's current value. */
tpu_status_t tpu__node_add_input(tpu_node_t* n, const tpu_view_t* view);
tpu_status_t tpu__node_add_scalar(tpu_node_t* n, double d, int64_t i, tpu_dtype_t dtype);
tpu_status_t tpu__node_add_absent(tpu_node_t* n); /* an optional input that is None */
/* Declares output metadata (bound later). Returns its index, or -1 if too many.
 * ndim < 0 declares an absent output (an undefined tensor, e.g. a gradient that
 * output_mask did not ask for): it is never bound and kernels must skip it. */
int tpu__node_add_output(tpu_node_t* n, tpu_dtype_t dtype, int32_t ndim, const int64_t* sizes);
tpu_status_t tpu__node_set_ilist(tpu_node_t* n, const int64_t* v, int len);
/* Creates and binds a fresh contiguous output value (used by runtime-internal nodes). */
tpu_status_t tpu__node_bind_new_output(tpu_node_t* n, int i, int device);

/* Pointer to operand element 0 (value data + offset). Only for device-side code. */
static inline bool tpu__output_absent(const tpu_operand_t* op) { return op->ndim < 0; }
static inline char* tpu__operand_ptr(const tpu_operand_t* op) {
  return (char*)op->value->data + op->offset * (int64_t)tpu_dtype_size(op->dtype);
}
int64_t tpu__operand_numel(const tpu_operand_t* op);
/* Same value, dtype, offset, sizes and strides (strides of size-1 dims ignored): element i
 * of both operands is the same memory. */
static inline bool tpu__operand_same_view(const tpu_operand_t* a, const tpu_operand_t* b) {
  if (a->value != b->value || a->dtype != b->dtype || a->ndim != b->ndim || a->offset != b->offset)
    return false;
  for (int d = 0; d < a->ndim; ++d)
    if (a->sizes[d] != b->sizes[d] || (a->sizes[d] != 1 && a->strides[d] != b->strides[d])) return false;
  return true;
}
/* PyTorch's is_contiguous: row-major dense, strides of size-1 dims ignored, true when
 * there are no elements. For views: tpu__is_contiguous(v->ndim, v->sizes, v->strides). */
bool tpu__is_contiguous(int ndim, const int64_t* sizes, const int64_t* strides);
bool tpu__operand_is_contiguous(const tpu_operand_t* op);

/* A small map from value pointers to ints, for bookkeeping inside one fused group (which
 * member last wrote a value): at most TPU_VMARK_KEYS / 2 keys, the caller's bound. */
#define TPU_VMARK_KEYS 512
typedef struct tpu_vmark_s {
  const tpu_value_t* key[TPU_VMARK_KEYS];
  int val[TPU_VMARK_KEYS];
} tpu_vmark_t;

static inline void tpu__vmark_clear(tpu_vmark_t* m) { memset(m->key, 0, sizeof m->key); }
static inline int* tpu__vmark_slot(tpu_vmark_t* m, const tpu_value_t* v) {
  size_t h = ((uintptr_t)v >> 4) & (TPU_VMARK_KEYS - 1);
  while (m->key[h] && m->key[h] != v) h = (h + 1) & (TPU_VMARK_KEYS - 1);
  if (!m->key[h]) { m->key[h] = v; m->val[h] = -1; }
  return &m->val[h];
}
/* The int stored for v, or -1. */
static inline int tpu__vmark_get(const tpu_vmark_t* m, const tpu_value_t* v) {
  size_t h = ((uintptr_t)v >> 4) & (TPU_VMARK_KEYS - 1);
  while (m->key[h] && m->key[h] != v) h = (h + 1) & (TPU_VMARK_KEYS - 1);
  return m->key[h] ? m->val[h] : -1;
}

/* ---- execution */
/* Mode-aware submission: strict/debug queue the node, defer_and_fuse appends it to the
 * device's pending graph. Consumes node. */
tpu_status_t tpu__queue_submit(int device, tpu_node_t* node);
/* Queues on the device's worker; wait: block until it ran and return its error. */
tpu_status_t tpu__queue_push(int device, tpu_node_t* node, bool wait);
/* The device memory the pool models (TORCHTPU_HBM_BYTES or the driver's figure). */
uint64_t tpu__pool_hbm(int device);
/* For a node the caller waits for next (a graph cut at a host read): runs it on the
 * calling thread when the queue is idle, else queues it. ordered_by, held by the caller
 * (or NULL), is released once the node has its place in the queue's order. */
tpu_status_t tpu__queue_run_here(int device, tpu_node_t* node, pthread_mutex_t* ordered_by);
/* tpu_flush for a caller that synchronizes next: the cut graph runs on the calling thread
 * when the queue is idle (two thread wake-ups saved per host read). */
tpu_status_t tpu__flush_for_sync(int device, const char* reason);
/* Whether a node touches at most the inline limit of distinct memory (streaming ops:
 * the larger limit), so running it alone costs little more than handing it to a thread. */
bool tpu__node_is_small(const tpu_node_t* n);
/* Runs one node through the driver with debug checks and the trace (queue thread). */
tpu_status_t tpu__node_run(int device, tpu_node_t* node);
extern _Atomic int tpu__eager_mode; /* tpu_eager_mode_t */
/* Pending graphs (core/graph.c). */
tpu_status_t tpu__graph_append(int device, tpu_node_t* node);
tpu_status_t tpu__graph_run(int device, struct tpu_graph_s* graph); /* queue thread */
void tpu__graph_free(struct tpu_graph_s* graph);
/* Debug-mode records (core/debug.c). */
void tpu__debug_after_run(tpu_node_t* node, double us, tpu_status_t* inout_status);
void tpu__node_free(tpu_node_t* node);
const char* tpu__node_describe(const tpu_node_t* node);  /* "aten::add.Tensor" */

/* ---- drivers: a vtable at offset 0 of every driver object. */
typedef struct tpu_driver_s tpu_driver_t;
typedef struct tpu_driver_vtable_s {
  const char* name;
  int (*device_count)(tpu_driver_t* d);
  tpu_status_t (*props)(tpu_driver_t* d, int device, tpu_device_props_t* out);
  /* Device memory for values. alloc returns TPU_OUT_OF_MEMORY when the device is full. */
  tpu_status_t (*mem_alloc)(tpu_driver_t* d, int device, uint64_t nbytes, void** out_ptr);
  void (*mem_free)(tpu_driver_t* d, int device, void* ptr, uint64_t nbytes);
  /* Runs one node whose operands are materialized. Called on the device's queue thread. */
  tpu_status_t (*execute)(tpu_driver_t* d, int device, tpu_node_t* node);
  /* Copies between host memory and a value (host driver: memcpy). */
  tpu_status_t (*write)(tpu_driver_t* d, tpu_value_t* dst, uint64_t off, const void* src, uint64_t n);
  tpu_status_t (*read)(tpu_driver_t* d, const tpu_value_t* src, uint64_t off, void* dst, uint64_t n);
  /* Optional (NULL: no fusion). can_fuse: the node is an elementwise op the driver can
   * run inside a fused tile loop. run_group: runs nodes[0..k) as one loop; internal[i]
   * says node i's output is consumed only inside the group and is never written to
   * memory (its value stays unmaterialized). */
  bool (*can_fuse)(tpu_driver_t* d, const tpu_node_t* node);
  tpu_status_t (*run_group)(tpu_driver_t* d, tpu_node_t* const* nodes, int k, const uint8_t* internal);
  /* Optional: node, a row reduction reading producer's output, can end a group (it then
   * runs as the group's last member, all its outputs materialized). */
  bool (*can_end_group)(tpu_driver_t* d, const tpu_node_t* producer, const tpu_node_t* node);
  /* Optional: runs nodes[0..k), none of which writes a value another one reads or writes,
   * each as tpu__node_run would, possibly at the same time on several threads; returns
   * the first error in node order (the others are freed). */
  tpu_status_t (*run_independent)(tpu_driver_t* d, int device, tpu_node_t* const* nodes, int k);
} tpu_driver_vtable_t;
#define TPU_MAX_INDEPENDENT 64 /* k of run_independent */
/* Groups of at most this many elements (per member) work on cache-resident data: the
 * planner may give them several unrelated chains (core/graph.c), the host driver long
 * tiles; larger ones stream from memory (host/fuse.c's group_tile). */
#define TPU_GROUP_SMALL_NUMEL 65536
struct tpu_driver_s { const tpu_driver_vtable_t* vt; };

tpu_driver_t* tpu__driver(void);       /* the active driver (host for now) */
tpu_driver_t* tpu__host_driver(void);

/* ---- memory pool (core/memory.c): caching, capacity-bounded, per device. */
tpu_status_t tpu__pool_alloc(int device, uint64_t nbytes, void** out_ptr);
void tpu__pool_free(int device, void* ptr, uint64_t nbytes);

/* ---- dtype rules (core/dtype.c) */
/* bf16 / f16 bit conversions (round to nearest even). */
static inline float tpu__bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } x; x.u = (uint32_t)h << 16; return x.f;
}
static inline uint16_t tpu__f32_to_bf16(float f) {
  union { uint32_t u; float f; } x; x.f = f;
  if ((x.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x.u >> 16) | 0x40);
  uint32_t lsb = (x.u >> 16) & 1u;
  return (uint16_t)((x.u + 0x7fffu + lsb) >> 16);
}
/* The value v becomes once stored as floating dtype t (f32, bf16, f16: rounded to nearest
 * even; f64 and non-floating t: v). Kernels that reproduce ATen's per-step rounding in
 * a narrow dtype call it after each operation. */
double tpu__round_to_dtype(double v, tpu_dtype_t t);
tpu_dtype_t tpu__promote(tpu_dtype_t a, tpu_dtype_t b);
/* PyTorch's canCast: no float->int, no non-bool->bool, except to same category. */
bool tpu__can_cast(tpu_dtype_t from, tpu_dtype_t to);
/* f32 for f32/bf16/f16, f64 for f64, i64 for integers and bool. */
tpu_dtype_t tpu__compute_dtype(tpu_dtype_t result);
tpu_dtype_t tpu__default_float(void); /* float32 */
/* complex64 for every real dtype but float64 (complex128); complex dtypes map to
 * themselves. tpu__real_of: a complex dtype's part dtype; real dtypes map to themselves. */
tpu_dtype_t tpu__complex_of(tpu_dtype_t dtype);
tpu_dtype_t tpu__real_of(tpu_dtype_t dtype);
/* c10's name for a dtype ("Float", "BFloat16"), as PyTorch's error messages print it. */
const char* tpu__dtype_c10_name(tpu_dtype_t dtype);
/* "[2, 3]" into buf. */
const char* tpu__fmt_shape(char* buf, size_t cap, int nd, const int64_t* sizes); /* "[2, 3]"; returns buf */

/* Greedy non-maximum suppression with torchvision's CPU semantics (core/boxes.c):
 * boxes are n rows of (x1, y1, x2, y2), dense, dtype F32 or F64 like scores (n). Boxes
 * are visited by score, descending (stable: ties in index order; NaN first, as
 * torch.sort); a box is kept unless a kept box before it overlaps it with IoU >
 * threshold, the arithmetic rounded to the dtype at each step. Writes the kept indices to
 * keep (NULL: only count) and returns their count, or -1 on host OOM. */
int64_t tpu__nms_keep(const void* boxes, const void* scores, tpu_dtype_t dtype, int64_t n, double threshold,
                      int64_t* keep);

/* unique_consecutive's runs (core/runs.c): data is `slices` dense slices of `len`
 * elements of dtype t; a slice starts a run unless every element equals the previous
 * slice's (as values: NaN never equal, -0.0 == 0.0). Writes 0/1 per slice to starts
 * (NULL: only count) and returns the number of runs. */
int64_t tpu__runs(const void* data, tpu_dtype_t t, int64_t slices, int64_t len, uint8_t* starts);
/* Stable bottom-up merge sort of the permutation perm[0..n) (tmp: n scratch entries) by
 * keys (double when flt, else int64), ascending or descending; NaN orders above every
 * number, as on PyTorch CPU. */
void tpu__merge_sort(int64_t* perm, int64_t* tmp, int64_t n, const void* keys, bool flt, bool desc);
/* _unique2's groups (core/runs.c): order receives the stable ascending order of the n
 * dense elements of dtype t (NaN last); starts (NULL: only count) gets 1 where a group of
 * equal values begins in that order (as values: NaN never equal, -0.0 == 0.0). Returns
 * the number of groups, -1 on host OOM. */
int64_t tpu__unique_groups(const void* data, tpu_dtype_t t, int64_t n, int64_t* order, uint8_t* starts);

#endif /* TPURT_CORE_INTERNAL_H_ */
