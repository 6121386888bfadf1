#include "data/data_summary.hpp"

#include <map>
#include <utility>

#include <ATen/ATen.h>

#include "plugin/host_objects.hpp"
#include "plugin/host_services.hpp"
#include "plugin/plugin_instance.hpp"
#include "plugin/proxies.hpp"
#include "plugin/inspect_services.hpp"
#include "loop_parts/loop_parts.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {

// PyTorch's names (torch.float32), which the people reading this know.
std::string dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(t.scalar_type());
  }
}

std::string shape_of(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 1; d < t.dim(); ++d) out += (d > 1 ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

// A file's text when it is short, readable text; else its size.
std::string file_text(const std::string& bytes) {
  bool text = bytes.size() <= 400;
  for (const char c : bytes) text = text && (static_cast<unsigned char>(c) >= 0x20 || c == '\n');
  if (!text) return std::to_string(bytes.size()) + " bytes";
  std::string one = bytes;
  while (!one.empty() && one.back() == '\n') one.pop_back();
  for (char& c : one)
    if (c == '\n') c = ' ';
  return one;
}

}  // namespace

std::vector<std::string> inspect_data(const LoadedPlugin& data, const std::string& config_toml) {
  return inspect_plugin(data, config_toml, [&](PluginInstance& instance, InspectServices& services) {
    std::vector<std::string> lines;
    DataModuleProxy proxy(instance);
    std::vector<std::pair<kiln_split, int64_t>> sizes;
    for (const kiln_split split : {KILN_SPLIT_TRAIN, KILN_SPLIT_VAL, KILN_SPLIT_TEST}) {
      sizes.emplace_back(split, proxy.length(split));
      lines.push_back(std::string(split_name(split)) + ": " + std::to_string(sizes.back().second) + " samples");
    }
    for (const auto& [split, size] : sizes) {
      if (size == 0) continue;
      const int64_t first = 0;
      kiln_batch* out = nullptr;
      instance.check(data.data_hooks().get_batch(instance.instance(), split, &first, 1, &out), "get_batch");
      BatchPtr batch(out);
      if (!batch) instance.check(make_error("get_batch returned no batch"), "get_batch");
      lines.push_back(std::string("a sample (") + split_name(split) + "'s first):");
      for (const auto& [name, tensor] : batch->tensors)
        lines.push_back("  " + name + ": " + dtype_of(tensor) + " " + shape_of(tensor));
      break;
    }
    for (const auto& [name, bytes] : services.files) lines.push_back("run file " + name + ": " + file_text(bytes));
    return lines;
  });
}

}  // namespace kiln
