#include "metrics/protobuf_writer.hpp"

#include <cstring>

namespace kiln {

void ProtobufWriter::varint(uint64_t value) {
  while (value >= 0x80) {
    out_.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out_.push_back(static_cast<char>(value));
}

void ProtobufWriter::tag(uint32_t field_number, uint32_t wire_type) {
  varint((static_cast<uint64_t>(field_number) << 3) | wire_type);
}

void ProtobufWriter::fixed(uint64_t bits, int size) {
  for (int i = 0; i < size; ++i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

void ProtobufWriter::int64_field(uint32_t field_number, int64_t value) {
  tag(field_number, 0);
  varint(static_cast<uint64_t>(value));
}

void ProtobufWriter::enum_field(uint32_t field_number, int32_t value) {
  tag(field_number, 0);
  varint(static_cast<uint64_t>(static_cast<int64_t>(value)));  // negative enums: 10 bytes, as protobuf does
}

void ProtobufWriter::double_field(uint32_t field_number, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  tag(field_number, 1);
  fixed(bits, 8);
}

void ProtobufWriter::float_field(uint32_t field_number, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  tag(field_number, 5);
  fixed(bits, 4);
}

void ProtobufWriter::bytes_field(uint32_t field_number, std::string_view bytes) {
  tag(field_number, 2);
  varint(bytes.size());
  out_.append(bytes.data(), bytes.size());
}

}  // namespace kiln
