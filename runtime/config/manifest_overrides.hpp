// `--set KEY=VALUE` overrides of a parsed manifest. Internal to config/.
#pragma once

#include <string>

#include <toml++/toml.h>

#include "config/manifest_values.hpp"

namespace kiln::manifest_detail {

// Writes one "dotted.key=value" (`callbacks[0].patience=5` too) into `root`,
// creating the tables and array entries on its way, and records in
// `ctx.set_by` that `arg` wrote it, for messages. The value is parsed as a
// TOML value, or taken as a string if it does not parse, or if the schema
// says the key takes a string (`--set run.name=2024`). Throws InputError.
void apply_override(toml::table& root, const std::string& arg, Context& ctx);

}  // namespace kiln::manifest_detail
