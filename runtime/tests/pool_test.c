/* The host thread pool: coverage of every index exactly once, fixed chunks (whoever runs
 * them), nested regions running serially, errors collected in chunk order, many small
 * regions, and two callers racing for the pool. Run under ThreadSanitizer by `make tsan`. */
#include <pthread.h>
#include <stdatomic.h>

#include <string.h>

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
    CHECK(atomic_load(&c.max_tid) < nt); /* tids index per-thread scratch */
    tpu__free(c.hits);
  }
  /* grain caps the chunk count */
  CHECK(tpu__parallel_chunks(10, 100) == 1);
  CHECK(tpu__parallel_chunks(0, 1) == 1);
  CHECK(tpu__parallel_chunks(1 << 20, 1) == nt);
}

/* Each chunk writes its own partial (found from its range: chunk c of k begins at
 * floor(n c / k)); combining in chunk order is deterministic. */
typedef struct psum_s {
  const double* x;
  int64_t n;
  int k;
  double partial[256];
  int64_t begin[256];
} psum_t;

static tpu_status_t psum_fn(void* arg, int64_t b, int64_t e, int tid) {
  psum_t* p = arg;
  double s = 0;
  for (int64_t i = b; i < e; ++i) s += p->x[i];
  int64_t c = (b * p->k + p->n - 1) / p->n;
  p->partial[c] = s;
  p->begin[c] = b;
  return NULL;
}

static void test_static_chunks(void) {
  enum { N = 50000 };
  double* x = tpu__malloc(sizeof(double) * N);
  for (int i = 0; i < N; ++i) x[i] = 1.0 / (i + 1);
  int k = tpu__parallel_chunks(N, 1000);
  psum_t a = {x, N, k}, b = {x, N, k};
  CHECK_OK(tpu__parallel_for(N, 1000, psum_fn, &a));
  CHECK_OK(tpu__parallel_for(N, 1000, psum_fn, &b));
  for (int c = 0; c < k; ++c) {
    CHECK(a.begin[c] == (int64_t)N * c / k);
    CHECK(a.partial[c] == b.partial[c]);
  }
  /* the serial runner produces the same chunks */
  psum_t s = {x, N, k};
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
  if (b == 0) return NULL;
  return tpu_status_make(TPU_INVALID_ARGUMENT, "chunk at %lld failed", (long long)b);
}

static tpu_status_t fail_all_fn(void* arg, int64_t b, int64_t e, int tid) {
  (void)arg;
  return tpu_status_make(b == 0 ? TPU_INDEX_ERROR : TPU_INVALID_ARGUMENT, "chunk at %lld failed", (long long)b);
}

static void test_errors_collected(void) {
  int k = tpu__parallel_chunks(100, 1);
  if (k > 1) {
    /* errors of chunks run by any thread reach the caller; the first in chunk order wins */
    tpu_status_t st = tpu__parallel_for(100, 1, fail_fn, NULL);
    char want[64];
    snprintf(want, sizeof want, "chunk at %d failed", 100 / k);
    CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
    CHECK(st && strcmp(tpu_status_message(st), want) == 0);
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

/* ---- kernels through the queue: large enough to run on the pool ---------------------- */

static tpu_view_t big_view(tpu_dtype_t dt, int nd, const int64_t* sizes, const void* data) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= sizes[i];
  tpu_storage_t* s;
  CHECK_OK(tpu_storage_create(0, (uint64_t)n * tpu_dtype_size(dt), &s));
  tpu_view_t v = check_view(s, dt, nd, sizes);
  if (data) CHECK_OK(tpu_copy_from_host(&v, data));
  return v;
}

static tpu_status_t run_op(const char* name, tpu_arg_t* args, int nargs, tpu_view_t* out) {
  tpu_node_t* n;
  TPU_RETURN_IF_ERROR(tpu_op_prepare(check_op_index(name), TPU_VARIANT_FUNCTIONAL, args, nargs, &n));
  tpu_dtype_t dt; int32_t nd; int64_t sz[TPU_MAX_DIMS];
  tpu_node_output_meta(n, 0, &dt, &nd, sz);
  *out = big_view(dt, nd, sz, NULL);
  tpu_status_t st = tpu_node_bind_output(n, 0, out);
  if (st) { tpu_node_discard(n); return st; }
  TPU_RETURN_IF_ERROR(tpu_node_submit(n));
  return tpu_device_synchronize(0);
}

static tpu_arg_t arg_t(const tpu_view_t* v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_TENSOR; a.tensor = *v; return a; }

static void test_kernels_on_pool(void) {
  enum { R = 512, C = 700 };
  int64_t sz[2] = {R, C};
  float* x = tpu__malloc(sizeof(float) * R * C);
  float* y = tpu__malloc(sizeof(float) * R * C);
  for (int i = 0; i < R * C; ++i) { x[i] = (float)((i * 37) % 101) * 0.01f; y[i] = (float)(i % 13); }
  tpu_view_t vx = big_view(TPU_DTYPE_F32, 2, sz, x), vy = big_view(TPU_DTYPE_F32, 2, sz, y), out;
  /* add: every element, across rows split over threads */
  tpu_arg_t add_args[3] = {arg_t(&vx), arg_t(&vy), {0}};
  add_args[2].kind = TPU_ARG_SCALAR;
  add_args[2].scalar_kind = TPU_SCALAR_INT;
  add_args[2].v.i = 1;
  CHECK_OK(run_op("add.Tensor", add_args, 3, &out));
  float* got = tpu__malloc(sizeof(float) * R * C);
  CHECK_OK(tpu_copy_to_host(&out, got));
  int bad = 0;
  for (int i = 0; i < R * C; ++i) bad += got[i] != x[i] + y[i];
  CHECK(bad == 0);
  tpu_storage_release(out.storage);
  /* softmax over rows */
  tpu_arg_t sm_args[3] = {arg_t(&vx), {0}, {0}};
  sm_args[1].kind = TPU_ARG_INT; sm_args[1].v.i = 1;
  sm_args[2].kind = TPU_ARG_BOOL; sm_args[2].v.b = false;
  CHECK_OK(run_op("_softmax", sm_args, 3, &out));
  CHECK_OK(tpu_copy_to_host(&out, got));
  bad = 0;
  for (int r = 0; r < R; ++r) {
    double s = 0;
    for (int c = 0; c < C; ++c) s += got[r * C + c];
    bad += fabs(s - 1.0) > 1e-4;
  }
  CHECK(bad == 0);
  tpu_storage_release(out.storage);
  /* integer division by zero raised on whichever thread holds the bad element */
  int64_t* a = tpu__malloc(sizeof(int64_t) * R * C);
  int64_t* b = tpu__malloc(sizeof(int64_t) * R * C);
  for (int i = 0; i < R * C; ++i) { a[i] = i; b[i] = i == R * C - 5 ? 0 : 3; }
  tpu_view_t va = big_view(TPU_DTYPE_I64, 2, sz, a), vb = big_view(TPU_DTYPE_I64, 2, sz, b);
  tpu_arg_t fd_args[2] = {arg_t(&va), arg_t(&vb)};
  tpu_status_t st = run_op("floor_divide", fd_args, 2, &out);
  CHECK(tpu_status_code(st) != TPU_OK);
  CHECK(st && strstr(tpu_status_message(st), "ZeroDivisionError"));
  tpu_status_free(st);
  tpu_storage_release(out.storage);
  tpu_storage_release(va.storage);
  tpu_storage_release(vb.storage);
  tpu_storage_release(vx.storage);
  tpu_storage_release(vy.storage);
  tpu__free(x); tpu__free(y); tpu__free(got); tpu__free(a); tpu__free(b);
}

/* The cache sizes the tile engine and the streaming stores are sized by: where sysfs
 * lists cpu0's caches, L1 data is a plausible size and the last level is the largest. */
static void test_cache_sizes(void) {
  int64_t l1 = tpu__cache_bytes(1), l2 = tpu__cache_bytes(2), l3 = tpu__cache_bytes(3);
  int64_t last = tpu__cache_bytes(0);
  FILE* f = fopen("/sys/devices/system/cpu/cpu0/cache/index0/size", "r");
  if (f) {
    fclose(f);
    CHECK(l1 >= 4096 && l1 <= (1 << 20));
    CHECK(last >= l1 && last >= l2 && last >= l3);
    CHECK(last == (l3 ? l3 : l2 ? l2 : l1));
  } else {
    CHECK(l1 == 0 && last == 0);
  }
  printf("caches: L1d %lld, L2 %lld, L3 %lld, last level %lld bytes\n", (long long)l1,
         (long long)l2, (long long)l3, (long long)last);
}

int main(void) {
  test_cover();
  test_static_chunks();
  test_nested_is_serial();
  test_errors_collected();
  test_many_small();
  test_two_callers();
  test_kernels_on_pool();
  test_cache_sizes();
  printf("%s: %s (%d threads)\n", __FILE__, check_failures ? "FAILED" : "ok", tpu__num_threads());
  return check_failures ? 1 : 0;
}
