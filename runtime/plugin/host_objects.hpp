// The host's definitions of the ABI's opaque types that carry tensors. Only
// LibTorch translation units include this.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "kiln/abi.h"
#include "kiln/tensor.hpp"

struct kiln_batch {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

struct kiln_state_writer {
  std::map<std::string, std::string> blobs;
};

struct kiln_state_reader {
  const std::map<std::string, std::string>* blobs = nullptr;
};

// Handles convert with kiln/tensor.hpp, as in the SDK.
