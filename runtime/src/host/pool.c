/* The host driver's thread pool (declarations and contract in host/host.h).
 *
 * One process-wide pool of persistent workers, sized once. A parallel region splits its
 * range into k fixed chunks, chunk c covering [c*n/k, (c+1)*n/k); the caller and the
 * workers claim chunks as they get to them, so a kernel that combines per-chunk partials
 * in chunk order gets the same answer every run. Only one region runs at a time; a caller that finds
 * the pool busy (another device's queue thread) or that is itself inside a region runs
 * serially instead of queueing, so the machine is never oversubscribed. BLAS runs
 * single-threaded inside whatever thread calls it (host/linalg.c splits large products
 * over this pool). */
#include <sched.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <unistd.h>

#include "host/host.h"

#define MAX_THREADS 256

/* The one region in flight (the pool's busy lock is held by its caller). Its fields are
 * written before the region is published and read by a worker only after it claimed a
 * chunk of it, which the caller waits for: a worker that wakes late cannot see a region
 * half set up or one that has ended. */
typedef struct region_s {
  tpu_parallel_fn fn;
  void* ctx;
  int64_t n;
  int chunks;
  atomic_int finished;            /* chunks run to completion */
  tpu_status_t errs[MAX_THREADS]; /* per chunk; combined in chunk order */
} region_t;

/* The claim word: (generation << 32) | (chunks << 16) | next chunk. A chunk is claimed by
 * one compare-and-swap that also checks the generation, so a claim never lands in a
 * region other than the one the claimer saw. */
#define CLAIM_WORD(gen, chunks) (((uint64_t)(uint32_t)(gen) << 32) | ((uint64_t)(chunks) << 16))

typedef struct pool_s {
  int nthreads; /* including the caller */
  pthread_mutex_t busy; /* held by the thread running a region */
  pthread_mutex_t mu;
  pthread_cond_t cv_start, cv_done;
  uint64_t generation;  /* bumped per region (under mu); workers join the new one */
  atomic_uint_least64_t gen_seen; /* generation, readable without mu (spinning workers) */
  atomic_uint_least64_t claim;    /* see CLAIM_WORD */
  int sleepers;         /* workers blocked on cv_start */
  int64_t spin_ns;      /* how long an idle worker polls before it sleeps */
  region_t region;
  pthread_t threads[MAX_THREADS];
  int started; /* workers actually running */
} pool_t;

static pool_t pool;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static _Thread_local bool in_region;

bool tpu__in_parallel_region(void) { return in_region; }

/* The next chunk of generation gen, or -1 when that region has none left (or is over). */
static int claim_chunk(uint64_t gen) {
  uint64_t s = atomic_load_explicit(&pool.claim, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(s >> 32) != (uint32_t)gen) return -1;
    int chunks = (int)((s >> 16) & 0xffff), next = (int)(s & 0xffff);
    if (next >= chunks) return -1;
    if (atomic_compare_exchange_weak_explicit(&pool.claim, &s, s + 1, memory_order_acq_rel,
                                              memory_order_acquire))
      return next;
  }
}

/* Claims and runs chunks of generation gen until none is left. The thread that finishes
 * the last chunk wakes the caller if it sleeps (the caller checks under mu). */
static void run_claimed(uint64_t gen, int tid) {
  region_t* r = &pool.region;
  for (int c; (c = claim_chunk(gen)) >= 0;) {
    int chunks = r->chunks; /* read before finishing: the caller may then start another region */
    int64_t b = r->n * c / chunks, e = r->n * (c + 1) / chunks;
    r->errs[c] = b < e ? r->fn(r->ctx, b, e, tid) : NULL;
    if (atomic_fetch_add_explicit(&r->finished, 1, memory_order_acq_rel) + 1 == chunks && tid != 0) {
      pthread_mutex_lock(&pool.mu);
      pthread_cond_signal(&pool.cv_done);
      pthread_mutex_unlock(&pool.mu);
    }
  }
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One step of a polling loop; true every 64th step, when the loop checks its deadline.
 * Those steps also yield the core: with more runnable threads than cores (2 cores: the
 * Python thread, the queue thread, a worker, another process) the thread a poller waits
 * for is often queued on the poller's own core, and a bare pause loop kept it off that
 * core for the whole poll (measured on 2 busy cores: a worker that woke on its caller's
 * core ran its chunk, then polled 50 us for the next region while the caller, preempted
 * before it could finish, waited: a 10 us region took 67 us). sched_yield returns at
 * once when nothing else is runnable there. */
static bool spin_pause(int i) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
  if ((i & 63) != 0) return false;
  sched_yield();
  return true;
}

/* An idle worker first polls for the next region for pool.spin_ns, then sleeps on
 * cv_start. Waking a sleeping thread takes tens of microseconds, often longer than a small
 * kernel's chunks: the caller, which claims chunks itself, had then run them all alone
 * (measured: a 4 MFLOP product split in two took longer than unsplit). Kernels come in
 * bursts, so a short poll catches the next region of the burst. */
static bool spin_for_region(uint64_t seen) {
  int64_t end = now_ns() + pool.spin_ns;
  for (int i = 1; atomic_load_explicit(&pool.gen_seen, memory_order_acquire) == seen; ++i)
    if (spin_pause(i) && now_ns() > end) return false;
  return true;
}

static void* worker_main(void* arg) {
  int tid = (int)(intptr_t)arg;
  in_region = true; /* anything a worker runs is inside a region: nested calls go serial */
  uint64_t seen = 0;
  for (;;) {
    if (pool.spin_ns > 0) spin_for_region(seen);
    pthread_mutex_lock(&pool.mu);
    while (pool.generation == seen) {
      pool.sleepers++;
      pthread_cond_wait(&pool.cv_start, &pool.mu);
      pool.sleepers--;
    }
    seen = pool.generation;
    pthread_mutex_unlock(&pool.mu);
    run_claimed(seen, tid); /* nothing left (it ended before this worker came): no-op */
  }
  return NULL;
}

static int64_t spin_from_env(void) {
  const char* e = getenv("TORCHTPU_POOL_SPIN_US");
  if (e && *e) {
    long us = atol(e);
    return us > 0 ? (int64_t)us * 1000 : 0;
  }
  return 50 * 1000; /* 50 us */
}

static int threads_from_env(void) {
  const char* e = getenv("TORCHTPU_NUM_THREADS");
  if (e && *e) {
    int n = atoi(e);
    if (n >= 1) return n < MAX_THREADS ? n : MAX_THREADS;
  }
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c < 1 ? 1 : c > MAX_THREADS ? MAX_THREADS : (int)c;
}

static void pool_init(void) {
  pool.nthreads = threads_from_env();
  pool.spin_ns = spin_from_env();
  atomic_init(&pool.gen_seen, 0);
  atomic_init(&pool.claim, 0);
  atomic_init(&pool.region.finished, 0);
  pthread_mutex_init(&pool.busy, NULL);
  pthread_mutex_init(&pool.mu, NULL);
  pthread_cond_init(&pool.cv_start, NULL);
  pthread_cond_init(&pool.cv_done, NULL);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  /* Workers that fail to start just shrink the pool; a region never waits on them. */
  for (int t = 1; t < pool.nthreads; ++t) {
    if (pthread_create(&pool.threads[t], &attr, worker_main, (void*)(intptr_t)t) != 0) break;
    pool.started = t;
  }
  pthread_attr_destroy(&attr);
  pool.nthreads = pool.started + 1;
}

int tpu__num_threads(void) {
  pthread_once(&pool_once, pool_init);
  return pool.nthreads;
}

int tpu__parallel_chunks(int64_t n, int64_t grain) {
  int nt = tpu__num_threads();
  if (n <= 0) return 1;
  if (grain < 1) grain = 1;
  int64_t k = (n + grain - 1) / grain;
  if (k > nt) k = nt;
  return k < 1 ? 1 : (int)k;
}

/* First error in chunk order; the rest are released. */
static tpu_status_t combine(region_t* r) {
  tpu_status_t first = NULL;
  for (int c = 0; c < r->chunks; ++c) {
    if (!first) first = r->errs[c];
    else tpu_status_free(r->errs[c]);
  }
  return first;
}

/* The caller and the woken workers claim chunks: a worker that wakes late (its core
 * busy with another process or the Python thread) finds fewer or no chunks left, and the
 * caller waits only for chunks that were claimed, never for a worker that has yet to
 * run (it used to wait for every worker that had joined the region: on 2 busy cores a
 * 9 us elementwise kernel then took ~65 us at the median). So a region costs at most
 * about its serial time plus the tail of a chunk a worker started. Chunk c always covers
 * the same range, whoever runs it, and errors combine in chunk order. */
static tpu_status_t parallel_run(int64_t n, int chunks, tpu_parallel_fn fn, void* ctx) {
  if (chunks <= 1 || in_region || pthread_mutex_trylock(&pool.busy) != 0)
    return chunks <= 1 || in_region ? fn(ctx, 0, n, 0) : tpu__parallel_serial(n, chunks, fn, ctx);
  region_t* r = &pool.region;
  r->fn = fn;
  r->ctx = ctx;
  r->n = n;
  r->chunks = chunks;
  atomic_store_explicit(&r->finished, 0, memory_order_relaxed);
  pthread_mutex_lock(&pool.mu);
  uint64_t gen = ++pool.generation;
  atomic_store_explicit(&pool.claim, CLAIM_WORD(gen, chunks), memory_order_release);
  atomic_store_explicit(&pool.gen_seen, gen, memory_order_release);
  if (pool.sleepers) pthread_cond_broadcast(&pool.cv_start);
  pthread_mutex_unlock(&pool.mu);
  in_region = true;
  run_claimed(gen, 0);
  in_region = false;
  /* a worker still on its chunk finishes soon: poll before sleeping on cv_done */
  int64_t end = pool.spin_ns > 0 ? now_ns() + pool.spin_ns : 0;
  for (int i = 1; end && atomic_load_explicit(&r->finished, memory_order_acquire) < chunks; ++i)
    if (spin_pause(i) && now_ns() > end) break;
  pthread_mutex_lock(&pool.mu);
  while (atomic_load_explicit(&r->finished, memory_order_acquire) < chunks)
    pthread_cond_wait(&pool.cv_done, &pool.mu);
  pthread_mutex_unlock(&pool.mu);
  tpu_status_t st = combine(r);
  pthread_mutex_unlock(&pool.busy);
  return st;
}

tpu_status_t tpu__parallel_for(int64_t n, int64_t grain, tpu_parallel_fn fn, void* ctx) {
  if (n <= 0) return NULL;
  return parallel_run(n, tpu__parallel_chunks(n, grain), fn, ctx);
}

tpu_status_t tpu__parallel_items(int64_t n, tpu_parallel_fn fn, void* ctx) {
  if (n <= 0) return NULL;
  int chunks = tpu__num_threads() <= 1 ? 1 : n < MAX_THREADS ? (int)n : MAX_THREADS;
  return parallel_run(n, chunks, fn, ctx);
}

tpu_status_t tpu__parallel_serial(int64_t n, int chunks, tpu_parallel_fn fn, void* ctx) {
  /* Same chunks as the parallel run, one after another: results that depend on the
   * partition (per-chunk partials) stay identical to what the pool would compute. */
  region_t r = {fn, ctx, n, chunks};
  bool outer = in_region;
  in_region = true;
  for (int c = 0; c < chunks; ++c) {
    int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    r.errs[c] = b < e ? fn(ctx, b, e, c) : NULL;
  }
  in_region = outer;
  return combine(&r);
}
