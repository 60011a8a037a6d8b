/* libtpurt runtime: devices, memory, storages, views, execution. Public C contract.
 *
 * Model (docs/architecture.md):
 *  - A value is an immutable, refcounted device buffer (internal type tpu_value_t).
 *  - A storage is the mutable handle behind one PyTorch StorageImpl. It refers to its
 *    current value; writes produce (or, when donated, reuse) the value it refers to.
 *  - A view (tpu_view_t) is a strided window of a storage: what an at::Tensor is.
 *  - Every op becomes one IR node; strict mode submits it at once to the device's
 *    in-order queue, which a worker thread drains. Reads synchronize.
 *
 * Thread-safety: all functions may be called from any thread unless noted. */
#ifndef TPURT_RUNTIME_H_
#define TPURT_RUNTIME_H_

#include "tpurt/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime and devices ------------------------------------------------------- */

/* Number of devices of the active driver (host: TORCHTPU_NUM_DEVICES or the count in
 * TPU_VISIBLE_DEVICES, default 1). Never fails; initializes nothing heavy. */
int tpu_device_count(void);
/* Device name and properties. Borrowed string. */
const char* tpu_device_name(int device);
const char* tpu_driver_name(void);
typedef struct tpu_device_props_s {
  uint64_t total_memory;    /* HBM capacity in bytes */
  int core_count;           /* compute units (host: CPU cores) */
  int major, minor;
} tpu_device_props_t;
tpu_status_t tpu_device_props(int device, tpu_device_props_t* out_props);

/* Waits until every op queued on the device has run. Returns the first error that an
 * asynchronously running op raised since the last sync (with the op's name), and
 * clears it. */
tpu_status_t tpu_device_synchronize(int device);

/* ---- eager modes (docs/modes.md) -----------------------------------------------------
 * strict:         each op is one node queued at once; Python blocks only to read data.
 * debug:          strict plus launch-blocking and checks (NaN/Inf per floating output,
 *                 naming the op and call site; a per-op trace).
 * defer_and_fuse: ops are appended to a per-device pending graph; device memory is
 *                 taken only when a value is materialized. The graph is cut at host
 *                 reads, synchronize, a mode change, a size limit, and when the op stream
 *                 repeats the previous graph; a cut graph is partitioned into fused
 *                 elementwise groups and single kernels, planned once per structure
 *                 (cached), and queued. */
typedef enum tpu_eager_mode_e {
  TPU_EAGER_STRICT = 0,
  TPU_EAGER_DEBUG = 1,
  TPU_EAGER_DEFER = 2,
} tpu_eager_mode_t;

/* Flushes every device's pending graph, then switches. Process-wide. */
tpu_status_t tpu_set_eager_mode(tpu_eager_mode_t mode);
tpu_eager_mode_t tpu_get_eager_mode(void);

/* Debug mode's NaN/Inf check: 0 off, 1 warn, 2 raise (default). */
void tpu_set_nan_check(int policy);
/* Takes the oldest pending debug warning into buf; returns false when none is left. */
bool tpu_take_warning(char* buf, size_t cap);

/* Cuts the device's pending graph (no-op outside defer_and_fuse) and queues it. reason
 * is copied into the explain log, with the current call site. */
tpu_status_t tpu_flush(int device, const char* reason);
/* True when everything submitted to the device has run (cuts a pending graph first, so
 * that a caller polling for completion sees it). */
bool tpu_device_query(int device);

/* One record per cut graph, for torchtpu.explain(). Times in microseconds; run_us is
 * filled in when the graph has run (0 before). */
typedef struct tpu_cut_record_s {
  char reason[96];
  char site[192];
  char last_op[96];   /* the graph's last op ("aten::mm"): where the cut fell */
  int device;
  int nodes;          /* ops in the graph */
  int kernels;        /* kernels launched: fused groups + single ops */
  int fused_groups;   /* groups of >= 2 elementwise ops run as one tile loop */
  int fused_nodes;    /* ops inside those groups */
  int fused_reductions; /* groups ending with a row reduction (softmax, layer norm) */
  int internal_values;/* intermediates never written to memory */
  int donated;        /* outputs written into a dead input's buffer (filled at run time) */
  bool cache_hit;     /* the plan came from the plan cache */
  uint64_t key;       /* structural key of the graph */
  double plan_us, run_us;
} tpu_cut_record_t;
int tpu_explain_count(void);
bool tpu_explain_get(int i, tpu_cut_record_t* out);
void tpu_explain_clear(void);
/* Heuristic cuts (loop detection, the size limit) happen inside an op's submission, where
 * the runtime knows no Python line. The adapter, after submitting an op, asks whether that
 * made records on this thread without a call site, and supplies one (on an autograd
 * engine thread: the line that started the backward pass). */
bool tpu_explain_needs_site(void);
void tpu_explain_fill_site(const char* site);
/* Plans built since the last clear (cache misses) and cache hits. */
void tpu_plan_cache_stats(uint64_t* out_plans, uint64_t* out_hits);

/* Debug mode's per-op trace. */
typedef struct tpu_trace_record_s {
  char op[96];
  char shapes[256]; /* "float32[2, 3], float32[3] -> float32[2, 3]" */
  char site[192];
  double us;
  bool fallback;
  bool fusable; /* the driver can run it inside a fused elementwise group */
} tpu_trace_record_t;
int tpu_trace_count(void);
bool tpu_trace_get(int i, tpu_trace_record_t* out);
void tpu_trace_clear(void);
/* The adapter records an op that ran through the CPU fallback (debug mode only). */
void tpu_trace_fallback(const char* op, double us);

/* ---- events (torch.Event, torch.tpu.Event) ------------------------------------------ */
/* A place in a device's queue. Recording cuts a pending defer_and_fuse graph and queues a
 * marker behind everything submitted so far; the event completes, with a timestamp, when
 * the marker runs. Re-recording moves the event to the new place. */
typedef struct tpu_event_s tpu_event_t;
tpu_event_t* tpu_event_create(void); /* NULL on host OOM */
void tpu_event_destroy(tpu_event_t* e);
tpu_status_t tpu_event_record(tpu_event_t* e, int device);
/* True when the last record has completed, or the event was never recorded. */
bool tpu_event_query(const tpu_event_t* e);
/* Waits for the last record to complete; returns the device's pending error, if any. */
tpu_status_t tpu_event_synchronize(tpu_event_t* e);
/* Milliseconds between the completions of a's and b's last records. */
tpu_status_t tpu_event_elapsed_ms(const tpu_event_t* a, const tpu_event_t* b, double* out_ms);

/* ---- memory ----------------------------------------------------------------------- */

typedef struct tpu_memory_stats_s {
  uint64_t allocated, peak_allocated, reserved, peak_reserved;
  uint64_t alloc_count, free_count, oom_count, capacity;
} tpu_memory_stats_t;
tpu_status_t tpu_memory_stats(int device, tpu_memory_stats_t* out_stats);
void tpu_memory_reset_peak(int device);
/* Sets the pool's capacity (torch.tpu.set_per_process_memory_fraction): later requests
 * beyond it fail with TPU_OUT_OF_MEMORY; cached blocks above it are returned now. */
tpu_status_t tpu_memory_set_capacity(int device, uint64_t bytes);
/* Returns cached, unused blocks to the host, and the large scratch blocks that kernels
 * freed and the runtime keeps for reuse. */
void tpu_memory_empty_cache(int device);

/* ---- storages ----------------------------------------------------------------------- */

typedef struct tpu_storage_s tpu_storage_t;

/* Creates a storage of nbytes on device (device memory is taken now, in strict mode).
 * Fails with TPU_OUT_OF_MEMORY naming requested/allocated/capacity. Caller owns the
 * returned reference. */
tpu_status_t tpu_storage_create(int device, uint64_t nbytes, tpu_storage_t** out_storage);
void tpu_storage_retain(tpu_storage_t* storage);
/* Accepts NULL. Memory is reclaimed once queued ops that use it have run. */
void tpu_storage_release(tpu_storage_t* storage);
uint64_t tpu_storage_nbytes(const tpu_storage_t* storage);
int tpu_storage_device(const tpu_storage_t* storage);
/* Grows or shrinks the storage to nbytes, keeping the first min(old,new) bytes
 * (queued, ordered with other ops). The handle stays the same. */
tpu_status_t tpu_storage_resize(tpu_storage_t* storage, uint64_t nbytes);

/* A strided window of a storage. Offsets, sizes, strides in elements. */
typedef struct tpu_view_s {
  tpu_storage_t* storage; /* borrowed */
  tpu_dtype_t dtype;
  int32_t ndim;
  int64_t offset;
  int64_t sizes[TPU_MAX_DIMS];
  int64_t strides[TPU_MAX_DIMS];
} tpu_view_t;

int64_t tpu_view_numel(const tpu_view_t* view);

/* Host -> device: copies the dense, row-major bytes at src (dtype and shape of dst) into
 * dst. src may be reused as soon as this returns. */
tpu_status_t tpu_copy_from_host(const tpu_view_t* dst, const void* src);
/* Device -> host: waits for the ops that produce src, then writes src densely (row
 * major, src's dtype) to dst. Surfaces pending async errors. */
tpu_status_t tpu_copy_to_host(const tpu_view_t* src, void* dst);

/* Device -> device on one device: dst = src broadcast to dst's shape and cast to dst's
 * dtype (queued). */
tpu_status_t tpu_copy(const tpu_view_t* dst, const tpu_view_t* src);
/* The same, conjugating (conj: complex sources only) and/or negating the values: the
 * copy that resolves a source's conjugate / negative bit (x.conj(), torch._neg_view).
 * A complex source copied to a real destination keeps its real part. */
tpu_status_t tpu_copy_math(const tpu_view_t* dst, const tpu_view_t* src, bool conj, bool negate);

/* ---- ops: the ATen front end ---------------------------------------------------------
 * The adapter translates each ATen call into a list of tpu_arg_t (one per schema
 * argument, in order) and calls tpu_op_prepare with the op's table index. libtpurt
 * validates the arguments, applies the shape and dtype rules, and returns a node with
 * its output metadata. The adapter then binds each output to a tensor (a new one, self
 * for in-place forms, the resized out= tensor) and submits. */

typedef enum tpu_arg_kind_e {
  TPU_ARG_NONE = 0,
  TPU_ARG_TENSOR,   /* .tensor; undefined tensors are TPU_ARG_NONE */
  TPU_ARG_SCALAR,   /* number: .scalar_kind says which field; also CPU 0-dim tensors */
  TPU_ARG_INT,      /* .i (also ScalarType, MemoryFormat, Layout enum values, seeds) */
  TPU_ARG_DOUBLE,   /* .d */
  TPU_ARG_BOOL,     /* .b */
  TPU_ARG_INTLIST,  /* .list / .list_len */
  TPU_ARG_TENSORLIST, /* .tensors / .list_len; entries with storage NULL are None */
  TPU_ARG_STRING,   /* .s (borrowed) */
  TPU_ARG_DOUBLELIST, /* .dlist / .list_len */
  TPU_ARG_SCALARLIST, /* .scalars / .list_len: each a TPU_ARG_SCALAR (Scalar[]) */
} tpu_arg_kind_t;

typedef enum tpu_scalar_kind_e {
  TPU_SCALAR_BOOL = 0, TPU_SCALAR_INT = 1, TPU_SCALAR_FLOAT = 2,
  TPU_SCALAR_COMPLEX = 3, /* .v.d is the real part, .scalar_im the imaginary part */
} tpu_scalar_kind_t;

typedef struct tpu_arg_s {
  tpu_arg_kind_t kind;
  tpu_scalar_kind_t scalar_kind;  /* TPU_ARG_SCALAR */
  /* TPU_ARG_SCALAR from a 0-dim CPU tensor that is not a wrapped number: it takes part
   * in type promotion as a 0-dim tensor of scalar_dtype, not as a Python number. */
  bool scalar_is_tensor;
  tpu_dtype_t scalar_dtype;
  union { int64_t i; double d; bool b; } v;
  double scalar_im;  /* TPU_SCALAR_COMPLEX: imaginary part */
  tpu_view_t tensor;
  const int64_t* list;
  const double* dlist;
  const tpu_view_t* tensors;
  const struct tpu_arg_s* scalars;
  int64_t list_len;
  const char* s;
} tpu_arg_t;

typedef enum tpu_variant_e {
  TPU_VARIANT_FUNCTIONAL = 0, /* outputs are new tensors */
  TPU_VARIANT_INPLACE = 1,    /* output 0 is argument 0 */
  TPU_VARIANT_OUT = 2,        /* outputs are the trailing out= arguments */
} tpu_variant_t;

typedef struct tpu_node_s tpu_node_t;

/* The ATen ops libtpurt implements natively: names like "add.Tensor", "add_.Tensor",
 * "add.out". Index i is stable for the life of the process. */
int tpu_aten_op_count(void);
const char* tpu_aten_op_name(int index);

/* True when the op draws random numbers but its schema carries no Generator: the caller
 * appends one extra TPU_ARG_INT seed after all schema arguments. */
bool tpu_aten_op_needs_seed(int index);
/* True for an in-place op that resizes self to its result's shape when they differ, as
 * CPU's kernel does (addbmm_, which ATen runs as addbmm.out into self): the caller resizes
 * self before binding output 0. */
bool tpu_aten_op_resizes_self(int index);

/* Validates args and builds the node. variant says how outputs are bound. On success
 * the caller owns *out_node and must pass it to tpu_node_submit or tpu_node_discard. */
tpu_status_t tpu_op_prepare(int index, tpu_variant_t variant, const tpu_arg_t* args,
                            int nargs, tpu_node_t** out_node);
int tpu_node_output_count(const tpu_node_t* node);
/* Whether an out= or in-place output may be exactly one of the node's inputs (ATen allows
 * it except for the ops that assert no overlap at all: gather/scatter, index_select,
 * index_add/index_copy/index_put, masked_select, cat). */
bool tpu_node_may_alias_input(const tpu_node_t* node);
/* ATen's per-op exceptions to those rules, by schema name without the overload ("fill_"
 * or "aten::fill_"), for any op, native or not: a mask of TPU_OVERLAP_*. */
enum {
  TPU_OVERLAP_EXPANDED_WRITE_OK = 1, /* in place into an expanded tensor (fill_, zero_, ...) */
  TPU_OVERLAP_NO_FULL_ALIAS = 2,     /* no output equal to an input (take, kthvalue on CPU) */
};
int tpu_aten_overlap_rule(const char* schema_name);
/* ATen's memory-overlap checks for a view w that op (a schema name, as above) writes,
 * against the op's tensor inputs (TensorIterator's, and assert_no_overlap in the kernels
 * that gather or concatenate). NULL, or an INVALID_ARGUMENT error with ATen's message:
 * - w has internal overlap (stride 0 over a dim of size > 1), unless the write is in
 *   place and tpu_aten_overlap_rule(op) allows expanded writes;
 * - w lies partly over an input, or exactly over one while may_alias is false.
 * ins[i] == w (the same pointer) marks an input that is the written tensor itself. Where
 * ATen's own test gives up (views that are not non-overlapping and dense), nothing is
 * refused, as in ATen. w itself as the in-place self is not among ins. */
tpu_status_t tpu_aten_check_overlap(const char* op, const tpu_view_t* w, const tpu_view_t* const* ins,
                                    int n_ins, bool in_place, bool may_alias);

/* torch._foreach_* ops (optimizers, clip_grad_norm_). Each applies one table op, its
 * element op, at every position k of its list arguments: position k of each Tensor[] and
 * Scalar[] argument takes the list's place, the other arguments stay. The adapter asks
 * for the lists' common length (checked as ATen checks it), prepares the node of every
 * position, then binds and submits them in order, one ordinary node each, so strict runs
 * and defer_and_fuse fuses them like the same ops called one by one. variant is that of
 * the foreach op (in-place forms: output 0 of position k is self[k]). tpu_op_prepare
 * refuses these entries. */
bool tpu_aten_op_is_foreach(int index);
tpu_status_t tpu_foreach_length(int index, const tpu_arg_t* args, int nargs, int64_t* out_len);
tpu_status_t tpu_foreach_prepare(int index, tpu_variant_t variant, const tpu_arg_t* args,
                                 int nargs, int64_t k, tpu_node_t** out_node);
/* The output's dtype and shape as the op's rules computed them. sizes: TPU_MAX_DIMS.
 * *out_ndim < 0: the output is absent (an undefined tensor); do not bind it. */
void tpu_node_output_meta(const tpu_node_t* node, int i, tpu_dtype_t* out_dtype,
                          int32_t* out_ndim, int64_t* out_sizes);
/* Binds output i. For in-place and out= forms, checks shape and dtype castability the
 * way PyTorch does. The view's storage is retained by the node. */
tpu_status_t tpu_node_bind_output(tpu_node_t* node, int i, const tpu_view_t* view);
/* Queues the node (strict) and consumes it, also on failure. */
tpu_status_t tpu_node_submit(tpu_node_t* node);
void tpu_node_discard(tpu_node_t* node);
/* Op name for messages ("aten::add.Tensor"). Borrowed. */
const char* tpu_node_name(const tpu_node_t* node);

/* Sets a caller description ("model.py:42") attached to subsequently submitted nodes
 * on this thread, used in async error messages. Copied. NULL clears it. */
void tpu_set_call_site(const char* site);

#ifdef __cplusplus
}
#endif
#endif /* TPURT_RUNTIME_H_ */
