#include "ckpt/safetensors_format.hpp"

#include "util/json_string.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace kiln {

namespace {

struct DtypeName {
  const char* torch;
  const char* safetensors;
  size_t size;
};

constexpr DtypeName kDtypes[] = {
    {"Double", "F64", 8}, {"Float", "F32", 4}, {"Half", "F16", 2},  {"BFloat16", "BF16", 2}, {"Long", "I64", 8},
    {"Int", "I32", 4},    {"Short", "I16", 2}, {"Char", "I8", 1},   {"Byte", "U8", 1},       {"Bool", "BOOL", 1},
};

const DtypeName* find_dtype(const std::string& torch_dtype) {
  for (const auto& d : kDtypes)
    if (torch_dtype == d.torch) return &d;
  return nullptr;
}

void put_u64_le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

std::string safetensors_dtype(const std::string& torch_dtype) {
  const DtypeName* d = find_dtype(torch_dtype);
  return d ? d->safetensors : "";
}

std::string safetensors_file(const std::vector<SafetensorsEntry>& tensors,
                             const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<const DtypeName*> dtypes;
  for (const auto& t : tensors) {
    const DtypeName* d = find_dtype(t.dtype);
    if (!d) throw std::invalid_argument("tensor '" + t.name + "' has dtype " + t.dtype + ", which safetensors cannot hold");
    uint64_t numel = 1;
    for (int64_t n : t.shape) numel *= static_cast<uint64_t>(n);
    if (numel * d->size != t.data.size())
      throw std::invalid_argument("tensor '" + t.name + "' has " + std::to_string(t.data.size()) +
                                  " bytes, not what its dtype and shape need");
    dtypes.push_back(d);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return dtypes[a]->size > dtypes[b]->size; });

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i)
      header += (i ? "," : "") + json_string(metadata[i].first) + ":" + json_string(metadata[i].second);
    header += "}";
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const SafetensorsEntry& t = tensors[i];
    std::string shape;
    for (size_t d = 0; d < t.shape.size(); ++d) shape += (d ? "," : "") + std::to_string(t.shape[d]);
    const uint64_t end = offset + t.data.size();
    header += (header.size() > 1 ? "," : "") + json_string(t.name) + ":{\"dtype\":\"" + dtypes[i]->safetensors +
              "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) +
              "]}";
    offset = end;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header.size() + offset);
  put_u64_le(out, header.size());
  out += header;
  for (size_t i : order) out.append(tensors[i].data.data(), tensors[i].data.size());
  return out;
}

}  // namespace kiln
