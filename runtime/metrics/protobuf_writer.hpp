// The few protocol-buffer encodings a TensorBoard event needs, written by
// hand (kiln links no protobuf runtime): varints, and fields of wire types
// varint (0), 64-bit (1), length-delimited (2) and 32-bit (5), little-endian
// as the wire format requires. Fields are appended in the order called.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

class ProtobufWriter {
 public:
  // A base-128 varint, low 7 bits first (uint64; negative int64 values are
  // written as their 10-byte two's complement, as protobuf does).
  void varint(uint64_t value);
  // field_number << 3 | wire_type.
  void tag(uint32_t field_number, uint32_t wire_type);

  void int64_field(uint32_t field_number, int64_t value);      // wire type 0
  void enum_field(uint32_t field_number, int32_t value);       // wire type 0
  void double_field(uint32_t field_number, double value);      // wire type 1
  void float_field(uint32_t field_number, float value);        // wire type 5
  void bytes_field(uint32_t field_number, std::string_view bytes);  // wire type 2 (string, bytes, message)

  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void fixed(uint64_t bits, int size);
  std::string out_;
};

}  // namespace kiln
