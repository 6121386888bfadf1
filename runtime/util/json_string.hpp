// A string as a JSON string literal: what metrics.jsonl, the TensorBoard
// hparams and safetensors headers write names with.
#pragma once

#include <string>

namespace kiln {

// `s` as a JSON string literal, quotes included (UTF-8 passes through).
std::string json_string(const std::string& s);

}  // namespace kiln
