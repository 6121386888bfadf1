// `kiln inspect`: what a manifest's plugins are (with the model's summary and
// the data it reads), what a plugin shared object holds, or whether a
// checkpoint is valid and what it holds. Prints to stdout; runs nothing.
#pragma once

#include <string>
#include <vector>

namespace kiln {

// `target`: a manifest (.toml, `overrides` applied), a plugin shared object
// or a checkpoint (.ckpt). The exit code; throws InputError for a target that
// is none of the three.
int inspect_command(const std::string& target, const std::vector<std::string>& overrides);

}  // namespace kiln
