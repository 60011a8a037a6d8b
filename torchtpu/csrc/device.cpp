// Device-level registrations: allocator, pinned host allocator, device guard, hooks,
// generator. Each is a translation onto libtpurt calls.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "adapter.h"

namespace torchtpu {

[[noreturn]] void raise(tpu_status_t st) {
  std::string msg = tpu_status_message(st);
  tpu_status_code_t code = tpu_status_code(st);
  tpu_status_free(st);
  switch (code) {
    case TPU_TYPE_ERROR: TORCH_CHECK_TYPE(false, msg);
    case TPU_INDEX_ERROR: TORCH_CHECK_INDEX(false, msg);
    case TPU_VALUE_ERROR: TORCH_CHECK_VALUE(false, msg);
    case TPU_OUT_OF_MEMORY: TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
    case TPU_UNIMPLEMENTED: TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
    default: TORCH_CHECK(false, msg);
  }
}

tpu_view_t view_of(const at::Tensor& t) {
  tpu_view_t v;
  const int64_t nd = t.dim();
  TORCH_CHECK(nd <= TPU_MAX_DIMS, "tpu tensors support at most ", TPU_MAX_DIMS,
              " dimensions, got ", nd);
  v.storage = storage_of(t);
  // A tensor without tpu memory (a FakeTensor or meta tensor that reached a tpu kernel)
  // would crash libtpurt: refuse it with a Python error instead.
  TORCH_CHECK(v.storage, "a tpu kernel got a tensor without tpu storage (", t.device(),
              ", ", t.toString(), "): FakeTensor or meta tensors cannot run on the device");
  v.dtype = static_cast<tpu_dtype_t>(t.scalar_type());
  v.ndim = static_cast<int32_t>(nd);
  v.offset = t.storage_offset();
  const int64_t* sz = t.sizes().data();
  const int64_t* st = t.strides().data();
  for (int64_t i = 0; i < TPU_MAX_DIMS; ++i) {  // unused dims read as 0
    v.sizes[i] = i < nd ? sz[i] : 0;
    v.strides[i] = i < nd ? st[i] : 0;
  }
  return v;
}

static_assert(TPU_DTYPE_F32 == static_cast<int>(at::kFloat) &&
              TPU_DTYPE_BF16 == static_cast<int>(at::kBFloat16) &&
              TPU_DTYPE_BOOL == static_cast<int>(at::kBool) &&
              TPU_DTYPE_U8 == static_cast<int>(at::kByte) &&
              TPU_DTYPE_F16 == static_cast<int>(at::kHalf) &&
              TPU_DTYPE_I64 == static_cast<int>(at::kLong) &&
              TPU_DTYPE_C64 == static_cast<int>(at::kComplexFloat) &&
              TPU_DTYPE_C128 == static_cast<int>(at::kComplexDouble),
              "tpu_dtype_t must equal c10::ScalarType");

// ---- current device --------------------------------------------------------------
static thread_local c10::DeviceIndex tls_device = 0;
c10::DeviceIndex current_device() { return tls_device; }
void set_current_device(c10::DeviceIndex d) {
  TORCH_CHECK(d >= 0 && d < tpu_device_count(), "Invalid device index tpu:", int(d),
              " (device count ", tpu_device_count(), ")");
  tls_device = d;
}

// ---- allocator --------------------------------------------------------------------
static void delete_storage(void* ctx) { tpu_storage_release(static_cast<tpu_storage_t*>(ctx)); }

// PyTorch's CPU ops run on OpenMP threads that keep spinning for milliseconds after
// each parallel region (libgomp's default wait policy, fixed when libgomp loads, before
// torchtpu does). With the host driver those spins take the cores the runtime's pool
// computes on: a training loop that builds its batches with CPU ops ran its tpu steps
// slower (CNN example, 200 steps, three alternating runs: 8.1-10.4 ms per step with two
// PyTorch threads, 6.9-8.2 ms with one). So once the host driver is in use (the first
// tpu allocation), PyTorch's CPU ops get cpu_threads_beside_runtime() threads. A PJRT
// device computes off the CPU and leaves them alone.
int cpu_threads_beside_runtime() {
  for (const char* var : {"TORCHTPU_CPU_THREADS", "OMP_NUM_THREADS"}) {
    const char* e = std::getenv(var);
    int n = e && *e ? std::atoi(e) : 0;
    if (n >= 1) return n;
  }
  return 1;
}

static void share_cores_with_cpu_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::strcmp(tpu_driver_name(), "host") == 0) at::set_num_threads(cpu_threads_beside_runtime());
  });
}

struct TpuAllocator final : c10::DeviceAllocator {
  at::DataPtr allocate(size_t n) override {
    share_cores_with_cpu_ops();
    c10::DeviceIndex d = current_device();
    tpu_storage_t* s = nullptr;
    check(tpu_storage_create(d, n, &s));
    // The data pointer is the opaque storage handle, as a CUDA pointer is opaque.
    return {s, s, &delete_storage, at::Device(c10::DeviceType::PrivateUse1, d)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &delete_storage; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "tpu: raw copy_data between device handles is not supported; "
                "copy tensors instead");
  }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {
    for (int d = 0; d < tpu_device_count(); ++d) {
      check(tpu_device_synchronize(d));
      tpu_memory_empty_cache(d);
    }
  }
  void recordStream(const at::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    tpu_memory_stats_t s{};
    check(tpu_memory_stats(d, &s));
    c10::CachingDeviceAllocator::DeviceStats out;
    auto fill = [](c10::CachingAllocator::StatArray& a, int64_t cur, int64_t peak, int64_t alloc,
                   int64_t freed) {
      for (auto& st : a) {
        st.current = cur;
        st.peak = peak;
        st.allocated = alloc;
        st.freed = freed;
      }
    };
    fill(out.allocated_bytes, s.allocated, s.peak_allocated, 0, 0);
    fill(out.active_bytes, s.allocated, s.peak_allocated, 0, 0);
    fill(out.requested_bytes, s.allocated, s.peak_allocated, 0, 0);
    fill(out.reserved_bytes, s.reserved, s.peak_reserved, 0, 0);
    fill(out.allocation, s.alloc_count - s.free_count, 0, s.alloc_count, s.free_count);
    out.num_ooms = static_cast<int64_t>(s.oom_count);
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex d) override { tpu_memory_reset_peak(d); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    tpu_memory_stats_t s{};
    check(tpu_memory_stats(d, &s));
    return {s.capacity - s.reserved, s.capacity};
  }
};

static TpuAllocator g_allocator;
c10::DeviceAllocator* device_allocator() { return &g_allocator; }
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  auto* impl = storage.unsafeGetStorageImpl();
  auto* s = static_cast<tpu_storage_t*>(impl->data_ptr().get_context());
  TORCH_CHECK(s, "tpu: cannot resize a storage without a device handle");
  check(tpu_storage_resize(s, nbytes));
  impl->set_nbytes(nbytes);
}

// ---- pinned host memory: page-aligned host buffers, tracked so is_pinned() works ------
static std::mutex g_pinned_mu;
static std::unordered_set<const void*> g_pinned;

static void delete_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lk(g_pinned_mu);
    g_pinned.erase(p);
  }
  std::free(p);
}

struct PinnedAllocator final : at::Allocator {
  at::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, n ? n : 1) != 0) p = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, p, "pin_memory: cannot allocate ", n, " bytes");
    {
      std::lock_guard<std::mutex> lk(g_pinned_mu);
      g_pinned.insert(p);
    }
    return {p, p, &delete_pinned, at::Device(at::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &delete_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
static PinnedAllocator g_pinned_allocator;
at::Allocator* pinned_allocator() { return &g_pinned_allocator; }
bool is_pinned(const void* p) {
  std::lock_guard<std::mutex> lk(g_pinned_mu);
  return g_pinned.count(p) != 0;
}

// ---- generator ------------------------------------------------------------------------
// A CPUGeneratorImpl whose device is tpu: its state (get_state/set_state, manual_seed)
// behaves like CPU's; each random op draws one 64-bit key from it for libtpurt's
// counter-based generator.
struct TpuGenerator : at::CPUGeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex d) : CPUGeneratorImpl(c10::default_rng_seed_val) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, d);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

const at::Generator& default_generator(c10::DeviceIndex d) {
  static std::once_flag once;
  static std::vector<at::Generator> gens;
  std::call_once(once, [] {
    for (int i = 0; i < std::max(1, tpu_device_count()); ++i)
      gens.push_back(at::make_generator<TpuGenerator>(static_cast<c10::DeviceIndex>(i)));
  });
  if (d < 0) d = current_device();
  TORCH_CHECK(d < static_cast<int>(gens.size()), "Invalid device index tpu:", int(d));
  return gens[d];
}

at::Generator new_generator(c10::DeviceIndex d) {
  return at::make_generator<TpuGenerator>(d < 0 ? current_device() : d);
}

int64_t draw_seed(const std::optional<at::Generator>& gen, c10::DeviceIndex d) {
  const at::Generator& chosen = gen.has_value() && gen->defined() ? *gen : default_generator(d);
  TORCH_CHECK(chosen.device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'tpu' device type for generator but found '", chosen.device().type(), "'");
  auto* g = static_cast<at::CPUGeneratorImpl*>(chosen.unsafeGetGeneratorImpl());
  std::lock_guard<std::mutex> lk(g->mutex_);
  return static_cast<int64_t>(g->random64());
}

// ---- device guard -----------------------------------------------------------------------
// One in-order queue per device: every stream is the default stream (ordering between
// "streams" is then stronger than CUDA's, never weaker). Events are libtpurt markers in
// that queue, with completion times for elapsed_time.
struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) set_current_device(d.index());
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < tpu_device_count()) tls_device = d.index();
  }
  static c10::Device indexed(c10::Device d) {  // torch.Stream(device="tpu") has no index
    return d.has_index() ? d : c10::Device(kType, current_device());
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, indexed(d));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, indexed(d));
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, indexed(d));
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(tpu_device_count());
  }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (!*event) {
      *event = tpu_event_create();
      TORCH_CHECK(*event, "tpu: host out of memory creating an event");
    }
    check(tpu_event_record(static_cast<tpu_event_t*>(*event), s.device_index()));
  }
  void block(void*, const c10::Stream&) const override {}  // one in-order queue
  bool queryEvent(void* e) const override { return !e || tpu_event_query(static_cast<tpu_event_t*>(e)); }
  void destroyEvent(void* e, const c10::DeviceIndex) const noexcept override {
    tpu_event_destroy(static_cast<tpu_event_t*>(e));
  }
  bool queryStream(const c10::Stream& s) const override { return tpu_device_query(s.device_index()); }
  void synchronizeStream(const c10::Stream& s) const override { check(tpu_device_synchronize(s.device_index())); }
  void synchronizeEvent(void* e) const override {
    if (e) check(tpu_event_synchronize(static_cast<tpu_event_t*>(e)));
  }
  double elapsedTime(void* a, void* b, const c10::DeviceIndex) const override {
    TORCH_CHECK(a && b, "elapsed_time: both events must be recorded first");
    double ms = 0;
    check(tpu_event_elapsed_ms(static_cast<tpu_event_t*>(a), static_cast<tpu_event_t*>(b), &ms));
    return ms;
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override { check(tpu_device_synchronize(d)); }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

// ---- DDP's timer ------------------------------------------------------------------------
// DistributedDataParallel times forward, backward and communication per device type (its
// logging data, and a warning on every run for a device without a timer). These are the
// host times at which the issuing thread reached each point, as CPU's timer records them.
struct TpuDdpTimer final : c10d::Timer {
  explicit TpuDdpTimer(c10::Device) {}
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    auto a = getTimestamp(start), b = getTimestamp(end);
    if (!a || !b || *b < *a) return std::nullopt;
    return *b - *a;
  }
};

// ---- hooks ------------------------------------------------------------------------------
struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return tpu_device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(tpu_device_count()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    set_current_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  at::Device getDeviceFromPtr(void* data) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current_device());
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override { return default_generator(d); }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override { return new_generator(d); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
};

static bool register_hooks = [] {
  at::RegisterPrivateUse1HooksInterface(new TpuHooks());
  return true;
}();

}  // namespace torchtpu

namespace c10d {  // the registry's own namespace, as its macro needs
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, torchtpu::TpuDdpTimer);
}  // namespace c10d
