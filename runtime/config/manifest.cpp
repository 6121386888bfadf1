// The run manifest: loading (config/manifest.hpp). The parts, each in a file
// of its own inside config/:
//   input_guard.cpp          what toml++ is never handed; every parse
//   manifest_overrides.cpp   --set KEY=VALUE
//   manifest_validation.cpp  the parsed manifest checked against the schema
//   manifest_values.cpp      where a value is, and its typed, checked reading
//   manifest_schema.cpp      every host key, declared once
//   text.cpp                 small text helpers (and the SDK's "did you mean")
#include "config/manifest.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <system_error>
#include <tuple>

#include "config/hparams_table.hpp"
#include "config/input_guard.hpp"
#include "config/manifest_overrides.hpp"
#include "config/manifest_validation.hpp"
#include "config/manifest_values.hpp"
#include "config/text.hpp"

namespace kiln {

namespace {

namespace fs = std::filesystem;
using manifest_detail::Context;
using manifest_detail::fail;

std::string read_manifest(const fs::path& file, const std::string& shown) {
  errno = 0;
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) fail(shown + ": cannot read manifest: " + std::strerror(errno ? errno : ENOENT));
  std::string text;
  char buffer[65536];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
  const bool failed = std::ferror(f) != 0;
  const int error = errno;
  std::fclose(f);
  if (failed) fail(shown + ": cannot read manifest: " + std::strerror(error ? error : EIO));
  return text;
}

}  // namespace

OptimizerConfig OptimizerConfig::for_group(const OptimizerGroupConfig& g) const {
  OptimizerConfig c = *this;
  c.groups.clear();
  c.lr = g.lr.value_or(lr);
  c.weight_decay = g.weight_decay.value_or(weight_decay);
  c.momentum = g.momentum.value_or(momentum);
  c.nesterov = g.nesterov.value_or(nesterov);
  if (g.betas) std::tie(c.beta1, c.beta2) = *g.betas;
  c.eps = g.eps.value_or(eps);
  c.alpha = g.alpha.value_or(alpha);
  c.centered = g.centered.value_or(centered);
  c.lr_decay = g.lr_decay.value_or(lr_decay);
  c.initial_accumulator_value = g.initial_accumulator_value.value_or(initial_accumulator_value);
  return c;
}

int64_t BatchLimit::apply(int64_t available) const {
  if (available <= 0) return 0;
  if (!is_fraction) return std::clamp<int64_t>(count, 0, available);
  if (!(fraction > 0.0)) return 0;
  if (fraction >= 1.0) return available;
  const auto n = static_cast<int64_t>(std::floor(static_cast<double>(available) * fraction));
  return std::clamp<int64_t>(n, 1, available);
}

int64_t swa_start_epoch(const AveragingConfig& averaging, int64_t max_epochs) {
  const BatchLimit& start = averaging.start_epoch;
  if (!start.is_fraction) return start.count;
  return static_cast<int64_t>(start.fraction * static_cast<double>(std::max<int64_t>(max_epochs, 0)));
}

PluginSearchPath PluginSearchPath::from_environment() {
  PluginSearchPath search;
  auto add = [&](fs::path dir) {
    dir = dir.lexically_normal();
    if (!dir.has_filename() && dir.has_relative_path()) dir = dir.parent_path();  // drop a trailing '/'
    if (std::find(search.dirs.begin(), search.dirs.end(), dir) == search.dirs.end()) search.dirs.push_back(dir);
  };
  std::error_code ec;
  if (const char* env = std::getenv("KILN_PLUGIN_PATH")) {
    std::stringstream entries{std::string(env)};
    std::string entry;
    while (std::getline(entries, entry, ':')) {
      if (entry.empty()) continue;
      fs::path dir(entry);
      if (dir.is_relative()) {
        const fs::path absolute = fs::absolute(dir, ec);
        if (!ec) dir = absolute;
        ec.clear();
      }
      add(dir);
    }
  }
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path bundled = (exe.parent_path() / ".." / "lib" / "kiln" / "plugins").lexically_normal();
    if (fs::is_directory(bundled, ec)) add(bundled);
  }
  return search;
}

Manifest load_manifest(const fs::path& file, const std::vector<std::string>& overrides,
                       const PluginSearchPath& search) {
  if (file.empty()) fail("no manifest given: pass the path to a run manifest, e.g. run.toml");

  Context ctx;
  ctx.file = file.string();
  std::error_code ec;
  fs::path absolute = fs::absolute(file, ec);
  if (ec) absolute = file;
  absolute = absolute.lexically_normal();
  ctx.dir = absolute.parent_path();

  toml::table root = manifest_detail::parse_manifest_text(read_manifest(file, ctx.file), ctx.file);
  for (const auto& arg : overrides) manifest_detail::apply_override(root, arg, ctx);

  Manifest manifest;
  manifest.file = absolute;
  manifest_detail::validate_manifest(root, ctx, manifest, search);
  manifest.text = manifest_detail::toml_text(root);
  manifest.hparams = flatten_manifest_hparams(root);
  return manifest;
}

}  // namespace kiln
