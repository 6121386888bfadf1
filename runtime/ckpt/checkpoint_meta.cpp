#include "ckpt/checkpoint_meta.hpp"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <system_error>

namespace kiln {

std::string shown(std::string_view text) { return "'" + printable(text, 40) + "'"; }

namespace {

// Anything std::stoll would throw std::invalid_argument for is a
// CheckpointError here: a damaged file is bad input, never a crash.
int64_t parse_count_in(const std::filesystem::path& path, const std::string& what, std::string_view text) {
  int64_t value = -1;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < 0)
    throw CheckpointError(path.string() + ": " + what + " is not a non-negative integer (" + shown(text) + ")");
  return value;
}

CheckpointMeta parse_meta(const std::filesystem::path& path, std::string_view text) {
  CheckpointMeta meta;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    const size_t space = line.find(' ');
    const std::string_view key = line.substr(0, space);
    const std::string_view value = space == std::string_view::npos ? "" : line.substr(space + 1);
    if (key == "epoch") meta.position.epoch = parse_count_in(path, "the epoch in its metadata", value);
    else if (key == "next_batch") meta.position.next_batch = parse_count_in(path, "the batch in its metadata", value);
    else if (key == "global_step") meta.position.global_step = parse_count_in(path, "the global step in its metadata", value);
    else if (key == "next_sample") meta.position.next_sample = parse_count_in(path, "the sample position in its metadata", value);
    else if (key == "world_size") meta.saved_by.world_size = parse_count_in(path, "the world size in its metadata", value);
    else if (key == "batch_size") meta.saved_by.batch_size = parse_count_in(path, "the batch size in its metadata", value);
    else if (key == "monitor") meta.monitor = std::string(value);
    else if (key == "monitored" && !value.empty()) meta.monitored = std::strtod(std::string(value).c_str(), nullptr);
    else if (key == "kiln") meta.kiln_version = std::string(value);
  }
  return meta;
}

}  // namespace

int64_t parse_count(const CheckpointFile& file, const std::string& what, std::string_view text) {
  return parse_count_in(file.path(), what, text);
}

std::string meta_text(const TrainPosition& position, const std::string& monitor, std::optional<double> monitored,
                      const SavedBy& saved_by) {
  char value[64] = "";
  if (monitored) std::snprintf(value, sizeof value, "%a", *monitored);
  std::ostringstream out;
  out << "format " << kCheckpointFormat << "\nkiln " << KILN_VERSION << "\nepoch " << position.epoch
      << "\nnext_batch " << position.next_batch << "\nglobal_step " << position.global_step << "\nmonitor "
      << monitor << "\nmonitored " << value << "\n";
  // Older readers skip keys they do not know.
  if (position.next_sample >= 0) out << "next_sample " << position.next_sample << "\n";
  if (saved_by.world_size > 0) out << "world_size " << saved_by.world_size << "\n";
  if (saved_by.batch_size > 0) out << "batch_size " << saved_by.batch_size << "\n";
  return out.str();
}

CheckpointMeta read_meta(const CheckpointFile& file) { return parse_meta(file.path(), file.section("meta")); }

CheckpointMeta read_meta(const CheckpointHead& head) { return parse_meta(head.path, head.meta); }

}  // namespace kiln
