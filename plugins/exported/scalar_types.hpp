// The export schema's enums (torch/csrc/utils/generated_serialization_types.h)
// as LibTorch's own: the schema numbers them its own way (FLOAT is 7 there,
// c10::ScalarType::Float is 6), so each is mapped by name, never cast.
#pragma once

#include <optional>

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/utils/generated_serialization_types.h>

namespace kiln_exported {

inline std::optional<c10::ScalarType> to_scalar_type(torch::_export::ScalarType t) {
  using S = torch::_export::ScalarType;
  switch (t) {
    case S::BYTE: return c10::ScalarType::Byte;
    case S::CHAR: return c10::ScalarType::Char;
    case S::SHORT: return c10::ScalarType::Short;
    case S::INT: return c10::ScalarType::Int;
    case S::LONG: return c10::ScalarType::Long;
    case S::HALF: return c10::ScalarType::Half;
    case S::FLOAT: return c10::ScalarType::Float;
    case S::DOUBLE: return c10::ScalarType::Double;
    case S::COMPLEXHALF: return c10::ScalarType::ComplexHalf;
    case S::COMPLEXFLOAT: return c10::ScalarType::ComplexFloat;
    case S::COMPLEXDOUBLE: return c10::ScalarType::ComplexDouble;
    case S::BOOL: return c10::ScalarType::Bool;
    case S::BFLOAT16: return c10::ScalarType::BFloat16;
    case S::UINT16: return c10::ScalarType::UInt16;
    case S::UINT32: return c10::ScalarType::UInt32;
    case S::UINT64: return c10::ScalarType::UInt64;
    case S::FLOAT8E4M3FN: return c10::ScalarType::Float8_e4m3fn;
    case S::FLOAT8E5M2: return c10::ScalarType::Float8_e5m2;
    case S::FLOAT8E4M3FNUZ: return c10::ScalarType::Float8_e4m3fnuz;
    case S::FLOAT8E5M2FNUZ: return c10::ScalarType::Float8_e5m2fnuz;
    default: return std::nullopt;
  }
}

inline std::optional<c10::Layout> to_layout(torch::_export::Layout l) {
  using L = torch::_export::Layout;
  switch (l) {
    case L::Strided: return c10::Layout::Strided;
    case L::SparseCoo: return c10::Layout::Sparse;
    case L::SparseCsr: return c10::Layout::SparseCsr;
    case L::SparseCsc: return c10::Layout::SparseCsc;
    case L::SparseBsr: return c10::Layout::SparseBsr;
    case L::SparseBsc: return c10::Layout::SparseBsc;
    default: return std::nullopt;
  }
}

inline std::optional<c10::MemoryFormat> to_memory_format(torch::_export::MemoryFormat m) {
  using M = torch::_export::MemoryFormat;
  switch (m) {
    case M::ContiguousFormat: return c10::MemoryFormat::Contiguous;
    case M::ChannelsLast: return c10::MemoryFormat::ChannelsLast;
    case M::ChannelsLast3d: return c10::MemoryFormat::ChannelsLast3d;
    case M::PreserveFormat: return c10::MemoryFormat::Preserve;
    default: return std::nullopt;
  }
}

}  // namespace kiln_exported
