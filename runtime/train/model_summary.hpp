// Lightning's ModelSummary for a plugin's model, from what the model
// reports through the ABI (dotted parameter names, sizes, requires_grad):
// one row per top-level module with its parameter count and whether it
// trains, then the totals and the size in MiB. No LibTorch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct ParameterInfo {
  std::string name;  // dotted, as the model reports it: "encoder.layer1.weight"
  int64_t count = 0;
  int64_t bytes = 0;
  bool trainable = true;
};

// "1.2 M", "200 K", "52": Lightning's short counts.
std::string short_count(int64_t count);

// The table's lines, without trailing newlines.
std::vector<std::string> model_summary(const std::vector<ParameterInfo>& parameters);

}  // namespace kiln
