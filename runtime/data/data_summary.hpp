// What `kiln inspect run.toml` says of the data module the manifest
// configures: each split's size, the names, per-sample shapes and dtypes of a
// batch's tensors (the train split's first sample, else the first split that
// has one), and the files the data module would write into the run
// directory (a class list, a held-out split's rows), shown when small. The
// module is created, set up for fit and torn down; nothing is written.
#pragma once

#include <string>
#include <vector>

#include "plugin/loader.hpp"

namespace kiln {

// Throws InputError when the module refuses its configuration or its data
// (as `kiln fit` would exit 2), HookError for other failures.
std::vector<std::string> inspect_data(const LoadedPlugin& data, const std::string& config_toml);

}  // namespace kiln
