#include "metrics/tfevents.hpp"

#include <cstring>

#include "metrics/crc32c.hpp"
#include "metrics/protobuf_writer.hpp"

namespace kiln {

namespace {

void put_le(std::string& out, uint64_t value, int size) {
  for (int i = 0; i < size; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t get_le(std::string_view bytes, size_t at, int size) {
  uint64_t value = 0;
  for (int i = 0; i < size; ++i) value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return value;
}

// tensorflow.Event field numbers.
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
// tensorflow.Summary and Summary.Value.
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2;

}  // namespace

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(std::string_view(out.data(), 8)), 4);
  out.append(data.data(), data.size());
  put_le(out, masked_crc32c(data), 4);
  return out;
}

std::string file_version_event(double wall_time) {
  ProtobufWriter event;
  event.double_field(kWallTime, wall_time);  // step 0: proto3 leaves a default out
  event.bytes_field(kFileVersion, "brain.Event:2");
  return event.take();
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  ProtobufWriter summary;
  for (const auto& [tag, value] : scalars) {
    ProtobufWriter v;
    v.bytes_field(kValueTag, tag);
    v.float_field(kValueSimpleValue, value);
    summary.bytes_field(kSummaryValue, v.bytes());
  }
  ProtobufWriter event;
  event.double_field(kWallTime, wall_time);
  if (step != 0) event.int64_field(kStep, step);  // proto3 leaves a default out
  event.bytes_field(kSummary, summary.bytes());
  return event.take();
}

std::vector<std::string> read_tfrecords(std::string_view bytes, size_t* valid_bytes) {
  std::vector<std::string> records;
  size_t at = 0;
  while (bytes.size() - at >= 12) {
    const uint64_t length = get_le(bytes, at, 8);
    if (static_cast<uint32_t>(get_le(bytes, at + 8, 4)) != masked_crc32c(bytes.substr(at, 8))) break;
    if (length > bytes.size() - at - 12 || bytes.size() - at - 12 - length < 4) break;
    const std::string_view data = bytes.substr(at + 12, length);
    if (static_cast<uint32_t>(get_le(bytes, at + 12 + length, 4)) != masked_crc32c(data)) break;
    records.emplace_back(data);
    at += 12 + length + 4;
  }
  if (valid_bytes) *valid_bytes = at;
  return records;
}

}  // namespace kiln
