// CRC-32C (Castagnoli), the checksum of TensorBoard's event files (the
// TFRecord framing), and TFRecord's "masked" form of it. Bitwise-table
// software CRC: event files are small and written a row at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

// CRC-32C of `data` (reflected polynomial 0x82F63B78, initial and final
// XOR 0xFFFFFFFF). crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view data);

// TFRecord's mask: rotate right by 15 bits and add 0xa282ead8, so that a
// CRC stored inside CRC-checked data does not checksum to a constant.
uint32_t masked_crc32c(std::string_view data);

}  // namespace kiln
