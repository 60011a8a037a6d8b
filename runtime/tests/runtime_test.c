/* Core runtime: status, dtype promotion, memory pool, storages, copies, async errors. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"

static void test_status(void) {
  tpu_status_t st = tpu_status_make(TPU_INVALID_ARGUMENT, "bad %d", 3);
  st = tpu_status_annotate(st, "while %s", "testing");
  CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
  CHECK(strcmp(tpu_status_message(st), "while testing: bad 3") == 0);
  tpu_status_free(st);
  tpu_status_free(NULL);
  /* host OOM while making a status yields a usable static status */
  tpu__alloc_fail_after(0);
  tpu_status_t s2 = tpu_status_make(TPU_INTERNAL, "x");
  tpu__alloc_fail_after(-1);
  CHECK(s2 != NULL);
  tpu_status_free(s2);
}

static void test_promotion(void) {
  CHECK(tpu__promote(TPU_DTYPE_U8, TPU_DTYPE_I8) == TPU_DTYPE_I16);
  CHECK(tpu__promote(TPU_DTYPE_BF16, TPU_DTYPE_F16) == TPU_DTYPE_F32);
  CHECK(tpu__promote(TPU_DTYPE_I64, TPU_DTYPE_F16) == TPU_DTYPE_F16);
  CHECK(tpu__promote(TPU_DTYPE_BOOL, TPU_DTYPE_I32) == TPU_DTYPE_I32);
  CHECK(!tpu__can_cast(TPU_DTYPE_F32, TPU_DTYPE_I64));
  CHECK(tpu__can_cast(TPU_DTYPE_I64, TPU_DTYPE_F32));
}

static void test_storage_roundtrip(void) {
  int64_t sizes[2] = {3, 4};
  tpu_storage_t* s;
  CHECK_OK(tpu_storage_create(0, 12 * sizeof(float), &s));
  tpu_view_t v = check_view(s, TPU_DTYPE_F32, 2, sizes);
  float in[12], out[12];
  for (int i = 0; i < 12; ++i) in[i] = (float)i * 0.5f;
  CHECK_OK(tpu_copy_from_host(&v, in));
  CHECK_OK(tpu_copy_to_host(&v, out));
  CHECK(memcmp(in, out, sizeof in) == 0);
  /* transposed read */
  tpu_view_t t = v;
  t.sizes[0] = 4; t.sizes[1] = 3; t.strides[0] = 1; t.strides[1] = 4;
  CHECK_OK(tpu_copy_to_host(&t, out));
  CHECK(out[1] == in[4] && out[3] == in[1]);
  /* resize keeps the prefix */
  CHECK_OK(tpu_storage_resize(s, 24 * sizeof(float)));
  CHECK_OK(tpu_copy_to_host(&v, out));
  CHECK(memcmp(in, out, sizeof in) == 0);
  tpu_storage_release(s);
}

static void test_add_op(void) {
  int idx = check_op_index("add.Tensor");
  CHECK(idx >= 0);
  int64_t sa[2] = {2, 3}, sb[1] = {3};
  tpu_storage_t *a, *b, *c;
  CHECK_OK(tpu_storage_create(0, 6 * 4, &a));
  CHECK_OK(tpu_storage_create(0, 3 * 8, &b));
  CHECK_OK(tpu_storage_create(0, 6 * 8, &c));
  tpu_view_t va = check_view(a, TPU_DTYPE_F32, 2, sa), vb = check_view(b, TPU_DTYPE_F64, 1, sb);
  float ha[6] = {1, 2, 3, 4, 5, 6};
  double hb[3] = {10, 20, 30};
  CHECK_OK(tpu_copy_from_host(&va, ha));
  CHECK_OK(tpu_copy_from_host(&vb, hb));
  tpu_arg_t args[3] = {0};
  args[0].kind = TPU_ARG_TENSOR; args[0].tensor = va;
  args[1].kind = TPU_ARG_TENSOR; args[1].tensor = vb;
  args[2].kind = TPU_ARG_SCALAR; args[2].scalar_kind = TPU_SCALAR_INT; args[2].v.i = 2;
  tpu_node_t* n;
  CHECK_OK(tpu_op_prepare(idx, TPU_VARIANT_FUNCTIONAL, args, 3, &n));
  tpu_dtype_t dt; int32_t nd; int64_t os[TPU_MAX_DIMS];
  tpu_node_output_meta(n, 0, &dt, &nd, os);
  CHECK(dt == TPU_DTYPE_F64 && nd == 2 && os[0] == 2 && os[1] == 3);
  tpu_view_t vc = check_view(c, TPU_DTYPE_F64, 2, os);
  CHECK_OK(tpu_node_bind_output(n, 0, &vc));
  CHECK_OK(tpu_node_submit(n));
  double hc[6];
  CHECK_OK(tpu_copy_to_host(&vc, hc));
  CHECK(hc[0] == 21 && hc[5] == 66);
  /* shape mismatch: RuntimeError-class status naming the op */
  int64_t sbad[1] = {4};
  args[1].tensor.sizes[0] = 4;
  (void)sbad;
  tpu_status_t st = tpu_op_prepare(idx, TPU_VARIANT_FUNCTIONAL, args, 3, &n);
  CHECK(tpu_status_code(st) == TPU_INVALID_ARGUMENT);
  CHECK(strstr(tpu_status_message(st), "add.Tensor") != NULL);
  tpu_status_free(st);
  tpu_storage_release(a); tpu_storage_release(b); tpu_storage_release(c);
}

static void test_oom(void) {
  tpu_memory_stats_t before, after;
  CHECK_OK(tpu_memory_stats(0, &before));
  tpu_storage_t* s = NULL;
  CHECK_CODE(tpu_storage_create(0, before.capacity + 1, &s), TPU_OUT_OF_MEMORY);
  CHECK_OK(tpu_memory_stats(0, &after));
  CHECK(after.allocated == before.allocated);
  CHECK(after.oom_count > before.oom_count);
  CHECK_CODE(tpu_storage_create(5, 16, &s), TPU_INVALID_ARGUMENT);
}

static void test_memory_returns_to_baseline(void) {
  CHECK_OK(tpu_device_synchronize(0));
  tpu_memory_stats_t base, now;
  CHECK_OK(tpu_memory_stats(0, &base));
  for (int i = 0; i < 100; ++i) {
    tpu_storage_t* s;
    CHECK_OK(tpu_storage_create(0, 1000 + (uint64_t)i, &s));
    tpu_storage_release(s);
  }
  CHECK_OK(tpu_device_synchronize(0));
  CHECK_OK(tpu_memory_stats(0, &now));
  CHECK(now.allocated == base.allocated);
}

/* Pool blocks of 4 MiB and more are their own 2 MiB-aligned mappings (host driver, huge
 * pages), given back by empty_cache and mapped again; smaller ones come from malloc. */
static void test_large_blocks(void) {
  /* (main sets TORCHTPU_HUGE_PAGES=1 before the driver reads it) */
  CHECK_OK(tpu_device_synchronize(0));
  uint64_t sizes[] = {1u << 20, 4u << 20, (9u << 20) + 4};
  for (int round = 0; round < 2; ++round) {
    void* p[3];
    for (int i = 0; i < 3; ++i) {
      CHECK_OK(tpu__pool_alloc(0, sizes[i], &p[i]));
      memset(p[i], 0x5a, sizes[i]);
      CHECK(((unsigned char*)p[i])[sizes[i] - 1] == 0x5a);
    }
    CHECK((uintptr_t)p[1] % (2u << 20) == 0);
    CHECK((uintptr_t)p[2] % (2u << 20) == 0);
    for (int i = 0; i < 3; ++i) tpu__pool_free(0, p[i], sizes[i]);
    tpu_memory_empty_cache(0);
    tpu_memory_stats_t st;
    CHECK_OK(tpu_memory_stats(0, &st));
    CHECK(st.reserved == st.allocated);
  }
}

/* Large host blocks freed by the runtime are kept and handed out again (base/alloc.c). */
static void test_scratch_reuse(void) {
  tpu__scratch_release();
  size_t mib = (size_t)1 << 20;
  char* a = tpu__malloc(mib);
  CHECK(a != NULL);
  memset(a, 0x5a, mib);
  tpu__free(a);
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
  CHECK(tpu__scratch_kept_bytes() >= mib);
  char* b = tpu__malloc(mib - 4096); /* fits, and at most twice the request: the same block */
  CHECK(b == a);
  CHECK(tpu__scratch_kept_bytes() == 0);
  tpu__free(b);
  char* q = tpu__malloc(mib / 4); /* the kept block is over twice this: not taken */
  CHECK(q != NULL && q != a);
  tpu__free(q);
  char* z = tpu__calloc(mib / 4, 4); /* a kept block, zeroed */
  CHECK(z == a);
  size_t nonzero = 0;
  for (size_t i = 0; i < mib; ++i) nonzero += z[i] != 0;
  CHECK(nonzero == 0);
  tpu__free(z);
  char* small = tpu__malloc(1024);
  size_t kept = tpu__scratch_kept_bytes();
  tpu__free(small); /* small blocks go straight back to the C library */
  CHECK(tpu__scratch_kept_bytes() == kept);
  tpu__alloc_fail_after(0); /* a kept block does not hide an injected failure */
  CHECK(tpu__malloc(mib) == NULL);
  tpu__alloc_fail_after(-1);
  tpu_memory_empty_cache(0); /* torch.tpu.empty_cache() gives them back */
  CHECK(tpu__scratch_kept_bytes() == 0);
#endif
}

/* ATen's memory-overlap rules on views (tpu_aten_check_overlap). */
static void test_overlap_rules(void) {
  tpu_storage_t *s = NULL, *other = NULL;
  CHECK_OK(tpu_storage_create(0, 64 * 4, &s));
  CHECK_OK(tpu_storage_create(0, 64 * 4, &other));
  int64_t n8[1] = {8};
  tpu_view_t a = check_view(s, TPU_DTYPE_F32, 1, n8);      /* elements 0..7 */
  tpu_view_t a2 = a;                                        /* the same window, another tensor */
  tpu_view_t b = a; b.offset = 4;                           /* 4..11: partly over a */
  tpu_view_t c = a; c.offset = 8;                           /* 8..15: beside a */
  tpu_view_t d = check_view(other, TPU_DTYPE_F32, 1, n8);   /* another storage */
  tpu_view_t ex = a; ex.strides[0] = 0;                     /* expanded: 8 elements, 1 place */
  tpu_view_t rev = a; rev.ndim = 2; rev.sizes[0] = 2; rev.sizes[1] = 4; rev.strides[0] = 1; rev.strides[1] = 2;
  const tpu_view_t* none[1] = {&d};
  CHECK(tpu_aten_check_overlap("aten::add_", &a, none, 1, true, true) == NULL);
  const tpu_view_t* beside[2] = {&c, &d};
  CHECK(tpu_aten_check_overlap("aten::add.out", &a, beside, 2, false, false) == NULL);
  const tpu_view_t* partly[1] = {&b};
  tpu_status_t st = tpu_aten_check_overlap("aten::add.out", &a, partly, 1, false, true);
  CHECK(st && tpu_status_code(st) == TPU_INVALID_ARGUMENT && strstr(tpu_status_message(st), "aten::add.out"));
  tpu_status_free(st);
  const tpu_view_t* same[1] = {&a2};   /* exactly equal: allowed only where the kernel may alias */
  CHECK(tpu_aten_check_overlap("aten::add.out", &a, same, 1, false, true) == NULL);
  st = tpu_aten_check_overlap("aten::index_select.out", &a, same, 1, false, false);
  CHECK(st != NULL);
  tpu_status_free(st);
  const tpu_view_t* itself[1] = {&a}; /* the written tensor itself among the inputs */
  CHECK(tpu_aten_check_overlap("aten::cat.out", &a, itself, 1, false, true) == NULL);
  st = tpu_aten_check_overlap("aten::cat.out", &a, itself, 1, false, false);
  CHECK(st != NULL);
  tpu_status_free(st);
  const tpu_view_t* permuted[1] = {&rev}; /* same bytes, other strides: partial */
  st = tpu_aten_check_overlap("aten::add.out", &a, permuted, 1, false, true);
  CHECK(st != NULL);
  tpu_status_free(st);
  /* an expanded written tensor: refused, except in place where ATen lets it (fill_) */
  st = tpu_aten_check_overlap("aten::add_", &ex, none, 1, true, true);
  CHECK(st && strstr(tpu_status_message(st), "more than one element"));
  tpu_status_free(st);
  CHECK(tpu_aten_check_overlap("aten::fill_", &ex, none, 1, true, true) == NULL);
  st = tpu_aten_check_overlap("aten::fill_", &ex, none, 1, false, true); /* fill.out-like: no */
  CHECK(st != NULL);
  tpu_status_free(st);
  /* an empty view is contiguous for ATen, whatever its strides (nonzero's out=) */
  tpu_view_t empty = ex; empty.ndim = 2; empty.sizes[0] = 5; empty.sizes[1] = 0; empty.strides[0] = 0; empty.strides[1] = 1;
  CHECK(tpu_aten_check_overlap("aten::nonzero", &empty, none, 1, false, true) == NULL);
  tpu_storage_release(s);
  tpu_storage_release(other);
}

int main(void) {
  setenv("TORCHTPU_HUGE_PAGES", "1", 1);
  test_overlap_rules();
  test_status();
  test_promotion();
  test_storage_roundtrip();
  test_add_op();
  test_oom();
  test_memory_returns_to_baseline();
  test_large_blocks();
  test_scratch_reuse();
  TEST_MAIN_END();
}
