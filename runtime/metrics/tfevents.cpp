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
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2, kValueTensor = 8, kValueMetadata = 9;
// tensorboard.SummaryMetadata and its PluginData.
constexpr uint32_t kMetadataPluginData = 1, kPluginName = 1, kPluginContent = 2;
// tensorboard.hparams.HParamsPluginData, SessionStartInfo (and its map's
// entries), SessionEndInfo; google.protobuf.Value.
constexpr uint32_t kHParamsSessionStartInfo = 3, kHParamsSessionEndInfo = 4;
constexpr uint32_t kStartHParams = 1, kStartTimeSecs = 5, kEntryKey = 1, kEntryValue = 2;
constexpr uint32_t kEndStatus = 1, kEndTimeSecs = 2;
constexpr uint32_t kNumberValue = 2, kStringValue = 3, kBoolValue = 4;
constexpr int32_t kStatusSuccess = 1, kStatusFailure = 2;
// hparams' NULL_TENSOR: TensorProto{dtype: DT_FLOAT, tensor_shape {dim {size: 0}}}.
constexpr std::string_view kNullTensor("\x08\x01\x12\x02\x12\x00", 6);

// An Event holding one hparams-plugin summary: `data` is the
// HParamsPluginData's oneof field `field` (its version, 0, left out).
std::string hparams_event(double wall_time, int64_t step, const char* tag, uint32_t field, const std::string& data) {
  ProtobufWriter content;
  content.bytes_field(field, data);
  ProtobufWriter plugin_data;
  plugin_data.bytes_field(kPluginName, "hparams");
  plugin_data.bytes_field(kPluginContent, content.bytes());
  ProtobufWriter metadata;
  metadata.bytes_field(kMetadataPluginData, plugin_data.bytes());
  ProtobufWriter value;  // in field order, as protobuf writes them
  value.bytes_field(kValueTag, tag);
  value.bytes_field(kValueTensor, kNullTensor);
  value.bytes_field(kValueMetadata, metadata.bytes());
  ProtobufWriter summary;
  summary.bytes_field(kSummaryValue, value.bytes());
  ProtobufWriter event;
  event.double_field(kWallTime, wall_time);
  if (step != 0) event.int64_field(kStep, step);
  event.bytes_field(kSummary, summary.bytes());
  return event.take();
}

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

std::string hparams_start_event(double wall_time, const std::vector<HParam>& hparams, double start_time_secs) {
  ProtobufWriter start;
  for (const HParam& h : hparams) {
    ProtobufWriter value;  // a oneof: written even when it holds 0, "" or false
    switch (h.kind) {
      case HParam::Kind::number: value.double_field(kNumberValue, h.number); break;
      case HParam::Kind::string: value.bytes_field(kStringValue, h.string); break;
      case HParam::Kind::boolean: value.int64_field(kBoolValue, h.boolean ? 1 : 0); break;
    }
    ProtobufWriter entry;
    entry.bytes_field(kEntryKey, h.name);
    entry.bytes_field(kEntryValue, value.bytes());
    start.bytes_field(kStartHParams, entry.bytes());
  }
  if (start_time_secs != 0) start.double_field(kStartTimeSecs, start_time_secs);
  return hparams_event(wall_time, 0, "_hparams_/session_start_info", kHParamsSessionStartInfo, start.bytes());
}

std::string hparams_end_event(double wall_time, int64_t step, bool success, double end_time_secs) {
  ProtobufWriter end;
  end.enum_field(kEndStatus, success ? kStatusSuccess : kStatusFailure);
  if (end_time_secs != 0) end.double_field(kEndTimeSecs, end_time_secs);
  return hparams_event(wall_time, step, "_hparams_/session_end_info", kHParamsSessionEndInfo, end.bytes());
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
