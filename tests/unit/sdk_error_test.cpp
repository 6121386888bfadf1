// ABI 1.1 appended kiln_host.error_new_code and log_metric_tensor. The SDK
// reads them only when the host's struct_size says they exist: a 1.1 plugin
// in a 1.0 host falls back to error_new and log_metric, and never calls past
// the end of the 1.0 table.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "kiln/plugin.hpp"

namespace {

struct Calls {
  int error_new = 0, error_new_code = 0;
  kiln_error_code code = -1;
  int log_metric = 0, log_metric_tensor = 0;
  double value = 0;
};

kiln_error* fake_error() { return reinterpret_cast<kiln_error*>(0x1); }

kiln_error* error_new(const kiln_host* host, const char*) {
  ++static_cast<Calls*>(host->host_data)->error_new;
  return fake_error();
}

kiln_error* error_new_code(const kiln_host* host, kiln_error_code code, const char*) {
  auto* calls = static_cast<Calls*>(host->host_data);
  ++calls->error_new_code;
  calls->code = code;
  return fake_error();
}

void log_metric(const kiln_host* host, const char*, double value, double, uint32_t) {
  auto* calls = static_cast<Calls*>(host->host_data);
  ++calls->log_metric;
  calls->value = value;
}

void log_metric_tensor(const kiln_host* host, const char*, const kiln_tensor* value, double, uint32_t) {
  auto* calls = static_cast<Calls*>(host->host_data);
  ++calls->log_metric_tensor;
  calls->value = kiln::borrow_tensor(value).item<double>();
}

kiln_host host_table(Calls* calls, size_t struct_size) {
  kiln_host host{};
  host.struct_size = struct_size;
  host.host_data = calls;
  host.error_new = &error_new;
  host.log_metric = &log_metric;
  // Present in memory, but not in a 1.0 table's size.
  host.error_new_code = &error_new_code;
  host.log_metric_tensor = &log_metric_tensor;
  return host;
}

TEST(SdkErrors, AOneDotZeroHostIsNeverAskedForErrorNewCode) {
  Calls calls;
  const kiln_host host = host_table(&calls, KILN_HOST_STRUCT_SIZE_1_0);
  kiln::detail::guarded(&host, [] { throw kiln::ConfigError("unknown config key 'hiden'"); });
  EXPECT_EQ(calls.error_new, 1);
  EXPECT_EQ(calls.error_new_code, 0);
}

TEST(SdkErrors, ConfigErrorsAreInvalidArgumentInAOneDotOneHost) {
  Calls calls;
  const kiln_host host = host_table(&calls, sizeof(kiln_host));
  kiln::detail::guarded(&host, [] { throw kiln::ConfigError("unknown config key 'hiden'"); });
  EXPECT_EQ(calls.error_new_code, 1);
  EXPECT_EQ(calls.code, KILN_ERROR_INVALID_ARGUMENT);
  kiln::detail::guarded(&host, [] { throw std::runtime_error("disk on fire"); });
  EXPECT_EQ(calls.code, KILN_ERROR_UNKNOWN);
}

TEST(SdkMetrics, AOneDotZeroHostGetsTheTensorsValueThroughLogMetric) {
  Calls calls;
  const kiln_host host = host_table(&calls, KILN_HOST_STRUCT_SIZE_1_0);
  kiln::Host(&host).log_metric("val/loss", at::scalar_tensor(0.25), 8.0);
  EXPECT_EQ(calls.log_metric, 1);
  EXPECT_EQ(calls.log_metric_tensor, 0);
  EXPECT_EQ(calls.value, 0.25);
}

TEST(SdkMetrics, AOneDotOneHostGetsTheTensorItself) {
  Calls calls;
  const kiln_host host = host_table(&calls, sizeof(kiln_host));
  kiln::Host(&host).log_metric("val/loss", at::scalar_tensor(0.25), 8.0);
  EXPECT_EQ(calls.log_metric_tensor, 1);
  EXPECT_EQ(calls.log_metric, 0);
  EXPECT_EQ(calls.value, 0.25);
  kiln::Host(&host).log_metric("val/acc", 0.5);  // a double still goes through log_metric
  EXPECT_EQ(calls.log_metric, 1);
}

// A real 1.0 host's table ends at KILN_HOST_STRUCT_SIZE_1_0: whatever lies
// after it is not the host's. Here the table ends exactly where a page that
// cannot be read begins, so a read of any 1.1 field (a pointer compared with
// NULL, a speculative load) kills the test instead of passing by luck.
class OneDotZeroTableAtAPageEnd {
 public:
  explicit OneDotZeroTableAtAPageEnd(const kiln_host& source) : page_(static_cast<size_t>(::sysconf(_SC_PAGESIZE))) {
    void* base = ::mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::runtime_error("mmap failed");
    base_ = static_cast<char*>(base);
    if (::mprotect(base_ + page_, page_, PROT_NONE) != 0) throw std::runtime_error("mprotect failed");
    static_assert(KILN_HOST_STRUCT_SIZE_1_0 % alignof(kiln_host) == 0, "the table must stay aligned");
    char* start = base_ + page_ - KILN_HOST_STRUCT_SIZE_1_0;
    std::memcpy(start, &source, KILN_HOST_STRUCT_SIZE_1_0);
    host_ = reinterpret_cast<const kiln_host*>(start);
  }
  ~OneDotZeroTableAtAPageEnd() { ::munmap(base_, 2 * page_); }
  const kiln_host* host() const { return host_; }

 private:
  size_t page_;
  char* base_ = nullptr;
  const kiln_host* host_ = nullptr;
};

TEST(SdkMetrics, NothingPastTheOneDotZeroTableIsRead) {
  Calls calls;
  const OneDotZeroTableAtAPageEnd table(host_table(&calls, KILN_HOST_STRUCT_SIZE_1_0));
  kiln::Host(table.host()).log_metric("val/loss", at::scalar_tensor(0.75, at::kFloat), 4.0);
  EXPECT_EQ(calls.log_metric, 1);
  EXPECT_EQ(calls.value, 0.75);
  kiln::detail::guarded(table.host(), [] { throw kiln::ConfigError("unknown config key 'hiden'"); });
  EXPECT_EQ(calls.error_new, 1);
  EXPECT_EQ(calls.log_metric_tensor + calls.error_new_code, 0);
}

TEST(SdkErrors, FrozenOneDotZeroSizesAreTheFloor) {
  // 1.1 grew the host table; 1.2 the host, model and callback tables (at
  // their ends); 1.4 the data hooks.
  EXPECT_LT(KILN_HOST_STRUCT_SIZE_1_0, sizeof(kiln_host));
  EXPECT_EQ(KILN_DATA_HOOKS_STRUCT_SIZE_1_0, offsetof(kiln_data_hooks, get_batch_seeded));
  EXPECT_EQ(KILN_MODEL_HOOKS_STRUCT_SIZE_1_0, offsetof(kiln_model_hooks, on_epoch_end));
  EXPECT_EQ(KILN_CALLBACK_HOOKS_STRUCT_SIZE_1_0, offsetof(kiln_callback_hooks, on_epoch_collected));
  EXPECT_EQ(KILN_STRUCT_SIZE(kiln_host, log_metric_tensor), offsetof(kiln_host, collect));
  EXPECT_EQ(KILN_ENTRY_STRUCT_SIZE_1_0, sizeof(kiln_entry));
}

}  // namespace
