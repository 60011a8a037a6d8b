/* The host thread pool: coverage of every index exactly once, static chunks, nested
 * regions running serially, errors collected in chunk order, many small regions, and two
 * callers racing for the pool. Run under ThreadSanitizer by `make tsan`. */
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "host/host.h"

typedef struct cover_s {
  atomic_int* hits;
  atomic_int max_tid;
  int64_t n;
} cover_t;

static tpu_status_t cover_fn(void* arg, int64_t b, int64_t e, int tid) {
  cover_t* c = arg;
  for (int64_t i = b; i < e; ++i) atomic_fetch_add(&c->hits[i], 1);
  int m = atomic_load(&c->max_tid);
  while (tid > m && !atomic_compare_exchange_weak(&c->max_tid, &m, tid)) {}
  return NULL;
}

static void test_cover(void) {
  int nt = tpu__num_threads();
  CHECK(nt >= 1);
  static const int64_t sizes[] = {1, 2, 3, 7, 100, 1000, 100003};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; ++s) {
    int64_t n = sizes[s];
    cover_t c = {tpu__calloc((size_t)n, sizeof(atomic_int)), 0, n};
    CHECK_OK(tpu__parallel_for(n, 1, cover_fn, &c));
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += atomic_load(&c.hits[i]) != 1;
    CHECK(bad == 0);
    CHECK(atomic_load(&c.max_tid) < nt);
    CHECK(atomic_load(&c.max_tid) == tpu__parallel_chunks(n, 1) - 1);
    tpu__free(c.hits);
  }
  /* grain caps the chunk count */
  CHECK(tpu__parallel_chunks(10, 100) == 1);
  CHECK(tpu__parallel_chunks(0, 1) == 1);
  CHECK(tpu__parallel_chunks(1 << 20, 1) == nt);
}

/* Each chunk writes its own partial; combining in chunk order is deterministic. */
typedef struct psum_s {
  const double* x;
  double partial[256];
  int64_t begin[256];
} psum_t;

static tpu_status_t psum_fn(void* arg, int64_t b, int64_t e, int tid) {
  psum_t* p = arg;
  double s = 0;
  for (int64_t i = b; i < e; ++i) s += p->x[i];
  p->partial[tid] = s;
  p->begin[tid] = b;
  return NULL;
}

static void test_static_chunks(void) {
  enum { N = 50000 };
  double* x = tpu__malloc(sizeof(double) * N);
  for (int i = 0; i < N; ++i) x[i] = 1.0 / (i + 1);
  psum_t a = {x}, b = {x};
  CHECK_OK(tpu__parallel_for(N, 1000, psum_fn, &a));
  CHECK_OK(tpu__parallel_for(N, 1000, psum_fn, &b));
  int k = tpu__parallel_chunks(N, 1000);
  for (int c = 0; c < k; ++c) {
    CHECK(a.begin[c] == (int64_t)N * c / k);
    CHECK(a.partial[c] == b.partial[c]);
  }
  /* the serial runner produces the same chunks */
  psum_t s = {x};
  CHECK_OK(tpu__parallel_serial(N, k, psum_fn, &s));
  for (int c = 0; c < k; ++c) CHECK(s.partial[c] == a.partial[c]);
  tpu__free(x);
}

typedef struct nest_s {
  atomic_int inner_calls;
  atomic_int inner_nonzero_tid;
  atomic_llong total;
} nest_t;

static tpu_status_t nest_inner(void* arg, int64_t b, int64_t e, int tid) {
  nest_t* n = arg;
  atomic_fetch_add(&n->inner_calls, 1);
  if (tid != 0 || b != 0) atomic_fetch_add(&n->inner_nonzero_tid, 1);
  atomic_fetch_add(&n->total, e - b);
  return NULL;
}

static tpu_status_t nest_outer(void* arg, int64_t b, int64_t e, int tid) {
  for (int64_t i = b; i < e; ++i) {
    tpu_status_t st = tpu__parallel_for(1000, 1, nest_inner, arg);
    if (st) return st;
  }
  return NULL;
}

static void test_nested_is_serial(void) {
  nest_t n = {0};
  CHECK_OK(tpu__parallel_for(8, 1, nest_outer, &n));
  /* every inner region ran as one serial chunk [0, 1000) on its caller */
  CHECK(atomic_load(&n.inner_calls) == 8);
  CHECK(atomic_load(&n.inner_nonzero_tid) == 0);
  CHECK(atomic_load(&n.total) == 8000);
}

static tpu_status_t fail_fn(void* arg, int64_t b, int64_t e, int tid) {
  (void)arg;
  if (tid == 0) return NULL;
  return tpu_status_make(TPU_INVALID_ARGUMENT, "chunk %d failed", tid);
}

static tpu_status_t fail_all_fn(void* arg, int64_t b, int64_t e, int tid) {
  (void)arg;
  return tpu_status_make(tid == 0 ? TPU_INDEX_ERROR : TPU_INVALID_ARGUMENT, "chunk %d failed", tid);
}

static void test_errors_collected(void) {
  if (tpu__num_threads() > 1) {
    /* an error on a pool thread reaches the caller */
    tpu_status_t st = tpu__parallel_for(100, 1, fail_fn, NULL);
    CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
    CHECK(st && strcmp(tpu_status_message(st), "chunk 1 failed") == 0);
    tpu_status_free(st);
  }
  /* several errors: the first in chunk order wins, the rest are freed (ASan checks) */
  CHECK_CODE(tpu__parallel_for(100, 1, fail_all_fn, NULL), TPU_INDEX_ERROR);
}

static void test_many_small(void) {
  atomic_int hits[64];
  for (int r = 0; r < 20000; ++r) {
    for (int i = 0; i < 64; ++i) atomic_init(&hits[i], 0);
    cover_t c = {hits, 0, 64};
    CHECK_OK(tpu__parallel_for(2 + r % 62, 1, cover_fn, &c));
    int bad = 0;
    for (int i = 0; i < 2 + r % 62; ++i) bad += atomic_load(&hits[i]) != 1;
    if (bad) { CHECK(bad == 0); break; }
  }
}

static void* racer(void* arg) {
  cover_t* c = arg;
  for (int r = 0; r < 2000; ++r) {
    tpu_status_t st = tpu__parallel_for(c->n, 1, cover_fn, c);
    if (st) { tpu_status_free(st); return (void*)1; }
  }
  return NULL;
}

static void test_two_callers(void) {
  /* Two queue threads (two devices) share the pool: one gets it, the other runs its
   * chunks itself; neither blocks on the other or loses chunks. */
  enum { N = 97 };
  cover_t a = {tpu__calloc(N, sizeof(atomic_int)), 0, N}, b = {tpu__calloc(N, sizeof(atomic_int)), 0, N};
  pthread_t ta, tb;
  pthread_create(&ta, NULL, racer, &a);
  pthread_create(&tb, NULL, racer, &b);
  void *ra, *rb;
  pthread_join(ta, &ra);
  pthread_join(tb, &rb);
  CHECK(ra == NULL && rb == NULL);
  int bad = 0;
  for (int i = 0; i < N; ++i) bad += atomic_load(&a.hits[i]) != 2000 || atomic_load(&b.hits[i]) != 2000;
  CHECK(bad == 0);
  tpu__free(a.hits);
  tpu__free(b.hits);
}

int main(void) {
  test_cover();
  test_static_chunks();
  test_nested_is_serial();
  test_errors_collected();
  test_many_small();
  test_two_callers();
  printf("%s: %s (%d threads)\n", __FILE__, check_failures ? "FAILED" : "ok", tpu__num_threads());
  return check_failures ? 1 : 0;
}
