// Internal to config/: the flattening of a table the manifest's parse
// already holds (load_manifest flattens it once, into Manifest::hparams).
#pragma once

#include <vector>

#include <toml++/toml.h>

#include "config/hparams.hpp"

namespace kiln {

std::vector<HParam> flatten_manifest_hparams(const toml::table& root);

}  // namespace kiln
