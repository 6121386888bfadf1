// Schema-driven validation of a parsed manifest. Internal to config/.
#pragma once

#include <toml++/toml.h>

#include "config/manifest.hpp"
#include "config/manifest_values.hpp"

namespace kiln::manifest_detail {

// Checks `root` (the file with --set overrides applied) against the schema
// (config/manifest_schema.hpp) and fills `manifest`: host tables key by key,
// plugin tables ([model], [data], [[callbacks]]) with their plugin found on
// `search`, then the defaults and checks that span keys. Keys are checked in
// the order they appear in the file, so the error a user sees is the first
// one. Throws InputError.
void validate_manifest(const toml::table& root, const Context& ctx, Manifest& manifest,
                       const PluginSearchPath& search);

}  // namespace kiln::manifest_detail
