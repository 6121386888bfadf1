// The manifest and its --set overrides. Input: TOML text, then a NUL byte,
// then one override per line. The contract (config/manifest.hpp): a valid
// Manifest, or InputError — any other exception escapes and is a finding.
#include <cstdint>
#include <string>
#include <vector>

#include "config/manifest.hpp"
#include "fuzz_file.hpp"
#include "util/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t split = all.find('\0');
  const std::string text = all.substr(0, split);
  std::vector<std::string> overrides;
  if (split != std::string::npos) {
    std::string rest = all.substr(split + 1);
    for (size_t at = 0; at <= rest.size();) {
      const size_t end = std::min(rest.find('\n', at), rest.size());
      if (end > at) overrides.push_back(rest.substr(at, end - at));
      at = end + 1;
    }
  }
  const std::string file = kiln_fuzz::input_file(".toml", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  try {
    kiln::PluginSearchPath search;  // nothing resolves by bare name: plugin lookups fail cleanly
    (void)kiln::load_manifest(file, overrides, search);
  } catch (const kiln::InputError&) {
  }
  return 0;
}
