// Unit tests for the safetensors writer (runtime/ckpt/safetensors_format.cpp):
// the header length, the JSON header with offsets and metadata, alignment,
// and refusals. Real readers check the files in integration.Export.*.
#include "ckpt/safetensors_format.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace kiln {
namespace {

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return n;
}

TEST(Safetensors, HeaderOffsetsAndDataFollowTheFormat) {
  const float weights[2] = {1.0f, 2.0f};
  const uint16_t half[1] = {0x3c00};
  const std::string w(reinterpret_cast<const char*>(weights), sizeof weights);
  const std::string h(reinterpret_cast<const char*>(half), sizeof half);
  // The 2-byte tensor first in the list: laid out after the 4-byte one.
  const std::string file =
      safetensors_file({{"b\"x", "Half", {1}, h}, {"fc.weight", "Float", {1, 2}, w}}, {{"format", "pt"}});
  const uint64_t n = header_length(file);
  ASSERT_EQ(n % 8, 0u);
  ASSERT_EQ(file.size(), 8 + n + 10);
  const std::string header = file.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' ') + 1, header.rfind('}') + 1);
  EXPECT_EQ(header.substr(0, header.rfind('}') + 1),
            "{\"__metadata__\":{\"format\":\"pt\"},"
            "\"fc.weight\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]},"
            "\"b\\\"x\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[8,10]}}");
  EXPECT_EQ(file.substr(8 + n, 8), w);
  EXPECT_EQ(file.substr(8 + n + 8), h);
}

TEST(Safetensors, AScalarHasAnEmptyShape) {
  const int64_t v = 7;
  const std::string file = safetensors_file({{"step", "Long", {}, std::string_view(reinterpret_cast<const char*>(&v), 8)}}, {});
  EXPECT_NE(file.find("\"step\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]}"), std::string::npos);
}

TEST(Safetensors, RefusesWhatItCannotHold) {
  EXPECT_THROW(safetensors_file({{"z", "ComplexFloat", {1}, std::string(8, '\0')}}, {}), std::invalid_argument);
  EXPECT_THROW(safetensors_file({{"short", "Float", {2}, std::string(4, '\0')}}, {}), std::invalid_argument);
  EXPECT_EQ(safetensors_dtype("BFloat16"), "BF16");
  EXPECT_EQ(safetensors_dtype("QInt8"), "");
}

}  // namespace
}  // namespace kiln
