/* Per-device in-order queue drained by one worker thread (strict mode).
 *
 * The submitting thread returns as soon as the node is linked in. The worker runs nodes
 * in order through the driver; the first error becomes the device's sticky error,
 * reported (with the op's name and call site) by the next synchronize, after which
 * nodes queued behind the failed one are still run: they read well-defined, if stale,
 * memory, exactly as a CUDA stream does after a kernel fault. TPU_LAUNCH_BLOCKING=1
 * makes submit wait for the node, so the error surfaces at the op that caused it; debug
 * mode does the same and checks each node's outputs. defer_and_fuse does not queue
 * single nodes: core/graph.c queues whole cut graphs as one GRAPH item.
 *
 * Run-ahead is bounded (TORCHTPU_QUEUE_DEPTH items, default 32): a value's memory returns
 * to the pool only when the last queued op using it has run, so a host thread that ran
 * arbitrarily far ahead would hold every intermediate of the run-ahead alive at once
 * (and touch fresh pages for each). A host thread that finds the queue full sleeps until
 * it has drained to half, and the worker wakes it only then: woken at every completion,
 * it took a context switch per op (on 2 cores, from the kernels' own threads) to queue
 * one more op and sleep again. Likewise completions wake cv_done only when a thread
 * waits there. Run-ahead is bounded in bytes too: past TORCHTPU_QUEUE_BYTES (4 MiB) of
 * queued outputs with more than one node outstanding, the host thread waits until half
 * of that, or one node, is left. 32 queued ops over 1M floats kept 128 MiB of outputs
 * alive, none of it in cache when its consumer ran: a strict loop of relu at 1M
 * elements took 214 us per op, 65-78 us with the bound (CPU eager 91).
 *
 * Small ops run inline: when the queue is idle and a node touches at most INLINE_BYTES
 * of distinct memory (an elementwise node the driver could fuse, or a fused optimizer
 * step: INLINE_EW_BYTES, as their cost is their memory traffic), the submitting thread
 * runs it itself under the same execution lock the worker holds, so order is kept, while
 * a wake-up of the worker and two context switches (5-20 microseconds, more than such an
 * op) are saved. Its error is still
 * reported at the next synchronize, as if it had run on the queue. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/internal.h"

#define MAX_DEVICES 64

#define INLINE_BYTES (32 << 10)
#define INLINE_EW_BYTES (512 << 10) /* ~10-20 us of traffic: about one worker wake-up */

typedef struct queue_s {
  pthread_mutex_t mu;
  pthread_mutex_t exec_mu; /* held while a node runs, by the worker or inline */
  pthread_cond_t cv_work, cv_done, cv_space;
  int done_waiters, space_waiters; /* threads blocked on cv_done / cv_space */
  bool started;
  pthread_t thread;
  tpu_node_t *head, *tail;
  uint64_t submitted, completed;
  int64_t queued_bytes; /* output bytes of the queued nodes (queue_bytes) */
  tpu_status_t error; /* sticky, first async error */
  int device;
} queue_t;

static queue_t queues[MAX_DEVICES];
static pthread_once_t queues_once = PTHREAD_ONCE_INIT;
static bool launch_blocking;
static uint64_t max_depth = 32;
static int64_t max_bytes = 4 << 20;

static void init_queues(void) {
  for (int i = 0; i < MAX_DEVICES; ++i) {
    pthread_mutex_init(&queues[i].mu, NULL);
    pthread_mutex_init(&queues[i].exec_mu, NULL);
    pthread_cond_init(&queues[i].cv_work, NULL);
    pthread_cond_init(&queues[i].cv_done, NULL);
    pthread_cond_init(&queues[i].cv_space, NULL);
    queues[i].device = i;
  }
  const char* e = getenv("TPU_LAUNCH_BLOCKING");
  launch_blocking = e && *e && *e != '0';
  const char* d = getenv("TORCHTPU_QUEUE_DEPTH");
  if (d && *d) {
    char* end;
    unsigned long long v = strtoull(d, &end, 10);
    if (end != d && v > 0) max_depth = v;
  }
  const char* b = getenv("TORCHTPU_QUEUE_BYTES");
  if (b && *b) {
    char* end;
    unsigned long long v = strtoull(b, &end, 10);
    if (end != b && v > 0 && v < (1ull << 62)) max_bytes = (int64_t)v;
  }
}

_Atomic int tpu__eager_mode = TPU_EAGER_STRICT;

tpu_status_t tpu__node_run(int device, tpu_node_t* n) {
  if (n->kind == TPU_KIND_GRAPH) return tpu__graph_run(device, n->graph);
  if (n->kind == TPU_KIND_MARKER) { tpu__marker_run(n); return NULL; }
  struct timespec t0, t1;
  bool debug = n->flags & TPU_NODE_DEBUG;
  if (debug) clock_gettime(CLOCK_MONOTONIC, &t0);
  tpu_status_t st = tpu__driver()->vt->execute(tpu__driver(), device, n);
  if (debug) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double us = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
    tpu__debug_after_run(n, us, &st);
  }
  if (st)
    st = tpu_status_annotate(st, "error in %s%s%s", tpu__node_describe(n),
                             n->site ? " called at " : "", n->site ? n->site : "");
  return st;
}

static void run_node(queue_t* q, tpu_node_t* n) {
  pthread_mutex_lock(&q->exec_mu);
  tpu_status_t st = tpu__node_run(q->device, n);
  pthread_mutex_unlock(&q->exec_mu);
  if (st) {
    pthread_mutex_lock(&q->mu);
    if (!q->error) q->error = st; else tpu_status_free(st);
    pthread_mutex_unlock(&q->mu);
  }
  tpu__node_free(n);
}

/* The run-ahead bound (q->mu held): more than max_depth nodes outstanding, or more than
 * one holding more than max_bytes of outputs; drained: back to half of both, or one node. */
static bool queue_full(const queue_t* q) {
  uint64_t out = q->submitted - q->completed;
  return out > max_depth || (out > 1 && q->queued_bytes > max_bytes);
}
static bool queue_drained(const queue_t* q) {
  uint64_t out = q->submitted - q->completed;
  return out <= max_depth / 2 && (out <= 1 || q->queued_bytes <= max_bytes / 2);
}

/* Counts one node done and wakes who waits for it (q->mu held). */
static void complete_one(queue_t* q) {
  q->completed++;
  if (q->done_waiters) pthread_cond_broadcast(&q->cv_done);
  if (q->space_waiters && queue_drained(q)) pthread_cond_broadcast(&q->cv_space);
}

/* Sleeps on cv_done until completed reaches target (q->mu held). */
static void wait_completed(queue_t* q, uint64_t target) {
  q->done_waiters++;
  while (q->completed < target) pthread_cond_wait(&q->cv_done, &q->mu);
  q->done_waiters--;
}

static void* worker(void* arg) {
  queue_t* q = arg;
  for (;;) {
    pthread_mutex_lock(&q->mu);
    while (!q->head) pthread_cond_wait(&q->cv_work, &q->mu);
    tpu_node_t* n = q->head;
    q->head = n->next;
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    int64_t bytes = n->queue_bytes;
    run_node(q, n);
    pthread_mutex_lock(&q->mu);
    q->queued_bytes -= bytes;
    complete_one(q);
    pthread_mutex_unlock(&q->mu);
  }
  return NULL;
}

static queue_t* get_queue(int device) {
  pthread_once(&queues_once, init_queues);
  if (device < 0 || device >= MAX_DEVICES) return NULL;
  return &queues[device];
}

/* Nodes whose cost is a few streaming passes over their operands: fusable elementwise
 * ops, and ops whose builder says so (the fused optimizer steps). */
static bool streams(const tpu_node_t* n) {
  if (n->flags & TPU_NODE_STREAMING) return true;
  tpu_driver_t* drv = tpu__driver();
  return drv->vt->can_fuse && drv->vt->can_fuse(drv, n);
}

/* Bytes of distinct memory n touches: its inputs' (when `inputs`) and its outputs' that
 * are not written in place of an input, counted until they pass `limit`. */
static int64_t node_bytes(const tpu_node_t* n, bool inputs, int64_t limit) {
  int64_t bytes = 0;
  for (int i = inputs ? 0 : n->n_in; i < n->n_in + n->n_out && bytes <= limit; ++i) {
    const tpu_operand_t* op = i < n->n_in ? &n->in[i] : &n->out[i - n->n_in];
    if (!op->value || op->ndim < 0) continue;
    /* an in-place output is memory an input already holds */
    bool counted = false;
    for (int j = 0; j < n->n_in && i >= n->n_in && !counted; ++j) counted = n->in[j].value == op->value;
    if (counted) continue;
    bytes += tpu__operand_numel(op) * (int64_t)tpu_dtype_size(op->dtype);
  }
  return bytes;
}

bool tpu__node_is_small(const tpu_node_t* n) {
  if (n->kind == TPU_KIND_GRAPH) return false;
  int64_t limit = streams(n) ? INLINE_EW_BYTES : INLINE_BYTES;
  return node_bytes(n, true, limit) <= limit;
}

/* The new memory n's outputs take: what the queue holds alive for it until it has run. */
static int64_t output_bytes(const tpu_node_t* n) {
  if (n->kind == TPU_KIND_GRAPH || n->kind == TPU_KIND_MARKER) return 0;
  return node_bytes(n, false, INT64_MAX);
}

/* here_ok: the caller waits for n next, so n runs on the calling thread whenever the
 * queue is idle, whatever its size. ordered_by (may be NULL), a mutex the caller holds,
 * is released once n has its place in the queue's order, before n runs. */
static tpu_status_t push(int device, tpu_node_t* n, bool wait, bool here_ok, pthread_mutex_t* ordered_by) {
  queue_t* q = get_queue(device);
  if (!q) {
    if (ordered_by) pthread_mutex_unlock(ordered_by);
    tpu__node_free(n);
    return tpu_status_make(TPU_INVALID_ARGUMENT, "bad device %d", device);
  }
  n->next = NULL;
  n->queue_bytes = output_bytes(n); /* (outside the lock the worker takes per node) */
  pthread_mutex_lock(&q->mu);
  if (!q->started) {
    if (pthread_create(&q->thread, NULL, worker, q) != 0) {
      pthread_mutex_unlock(&q->mu);
      if (ordered_by) pthread_mutex_unlock(ordered_by);
      tpu__node_free(n);
      return tpu_status_make(TPU_UNAVAILABLE, "cannot start the queue thread of tpu:%d", device);
    }
    pthread_detach(q->thread);
    q->started = true;
  }
  if (!wait && q->completed == q->submitted && (here_ok || tpu__node_is_small(n)) &&
      !pthread_equal(pthread_self(), q->thread)) {
    ++q->submitted;
    pthread_mutex_lock(&q->exec_mu); /* before q->mu is released: nothing queued after
                                        this node can start before it */
    pthread_mutex_unlock(&q->mu);
    if (ordered_by) pthread_mutex_unlock(ordered_by);
    tpu_status_t st = tpu__node_run(device, n);
    pthread_mutex_unlock(&q->exec_mu);
    tpu__node_free(n);
    pthread_mutex_lock(&q->mu);
    if (st) { if (!q->error) q->error = st; else tpu_status_free(st); }
    complete_one(q);
    pthread_mutex_unlock(&q->mu);
    return NULL;
  }
  q->queued_bytes += n->queue_bytes;
  if (q->tail) q->tail->next = n; else q->head = n;
  q->tail = n;
  uint64_t ticket = ++q->submitted;
  pthread_cond_signal(&q->cv_work);
  if (ordered_by) pthread_mutex_unlock(ordered_by);
  if (wait) {
    wait_completed(q, ticket);
    tpu_status_t err = q->error;
    q->error = NULL;
    pthread_mutex_unlock(&q->mu);
    return err;
  }
  if (!pthread_equal(pthread_self(), q->thread) && queue_full(q)) {
    q->space_waiters++;
    while (!queue_drained(q)) pthread_cond_wait(&q->cv_space, &q->mu);
    q->space_waiters--;
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

tpu_status_t tpu__queue_push(int device, tpu_node_t* n, bool wait) { return push(device, n, wait, false, NULL); }

tpu_status_t tpu__queue_run_here(int device, tpu_node_t* n, pthread_mutex_t* ordered_by) {
  return push(device, n, false, true, ordered_by);
}

tpu_status_t tpu__queue_submit(int device, tpu_node_t* n) {
  pthread_once(&queues_once, init_queues);
  switch (atomic_load_explicit(&tpu__eager_mode, memory_order_relaxed)) {
    case TPU_EAGER_DEFER:
      return tpu__graph_append(device, n);
    case TPU_EAGER_DEBUG:
      n->flags |= TPU_NODE_DEBUG;
      return tpu__queue_push(device, n, true);
    default:
      return tpu__queue_push(device, n, launch_blocking);
  }
}

bool tpu_device_query(int device) {
  if (device < 0 || device >= tpu_device_count()) return true;
  tpu_status_t st = tpu_flush(device, "stream query (torch.Stream.query)"); /* else it never completes */
  bool failed = st != NULL;
  tpu_status_free(st); /* (a planning error surfaces at the next synchronize as well) */
  queue_t* q = get_queue(device);
  pthread_mutex_lock(&q->mu);
  bool idle = q->completed == q->submitted;
  pthread_mutex_unlock(&q->mu);
  return idle || failed;
}

tpu_status_t tpu_device_synchronize(int device) {
  if (device < 0 || device >= tpu_device_count())
    return tpu_status_make(TPU_INVALID_ARGUMENT, "invalid device index %d (device count %d)",
                           device, tpu_device_count());
  tpu_status_t flushed = tpu__flush_for_sync(device, "torch.tpu.synchronize() / host read");
  queue_t* q = get_queue(device);
  pthread_mutex_lock(&q->mu);
  wait_completed(q, q->submitted);
  tpu_status_t err = q->error;
  q->error = NULL;
  pthread_mutex_unlock(&q->mu);
  if (flushed) { tpu_status_free(err); return flushed; }
  return err;
}
