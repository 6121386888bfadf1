// ABI 1.1 appended kiln_host.error_new_code. The SDK reads it only when the
// host's struct_size says it exists: a 1.1 plugin in a 1.0 host falls back
// to error_new, and never calls past the end of the 1.0 table.
#include <gtest/gtest.h>

#include <string>

#include "kiln/plugin.hpp"

namespace {

struct Calls {
  int error_new = 0, error_new_code = 0;
  kiln_error_code code = -1;
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

kiln_host host_table(Calls* calls, size_t struct_size) {
  kiln_host host{};
  host.struct_size = struct_size;
  host.host_data = calls;
  host.error_new = &error_new;
  host.error_new_code = &error_new_code;  // present in memory, but not in a 1.0 table's size
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

TEST(SdkErrors, FrozenOneDotZeroSizesAreTheFloor) {
  // 1.1 grew the host table only; the plugin tables keep their 1.0 size.
  EXPECT_LT(KILN_HOST_STRUCT_SIZE_1_0, sizeof(kiln_host));
  EXPECT_EQ(KILN_DATA_HOOKS_STRUCT_SIZE_1_0, sizeof(kiln_data_hooks));
  EXPECT_EQ(KILN_MODEL_HOOKS_STRUCT_SIZE_1_0, sizeof(kiln_model_hooks));
  EXPECT_EQ(KILN_ENTRY_STRUCT_SIZE_1_0, sizeof(kiln_entry));
}

}  // namespace
