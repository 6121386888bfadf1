#include "ckpt/checkpoint_meta.hpp"

#include <cstdio>
#include <cstdlib>

#include "ckpt/section_fields.hpp"

namespace kiln {

std::string shown(std::string_view text) { return "'" + printable(text, 40) + "'"; }

namespace {

// Anything std::stoll would throw std::invalid_argument for is a
// CheckpointError here: a damaged file is bad input, never a crash.
int64_t parse_count_in(const std::filesystem::path& path, const std::string& what, std::string_view text) {
  const auto value = parse_field_count(text);
  if (!value) throw CheckpointError(path.string() + ": " + what + " is not a non-negative integer (" + shown(text) + ")");
  return *value;
}

CheckpointMeta parse_meta(const std::filesystem::path& path, std::string_view text) {
  CheckpointMeta meta;
  const SectionFields fields(path.string() + ": section 'meta'", text);
  for (const auto& [key, value] : fields.lines()) {
    if (key == "epoch") meta.position.epoch = parse_count_in(path, "the epoch in its metadata", value);
    else if (key == "next_batch") meta.position.next_batch = parse_count_in(path, "the batch in its metadata", value);
    else if (key == "global_step") meta.position.global_step = parse_count_in(path, "the global step in its metadata", value);
    else if (key == "next_sample") meta.position.next_sample = parse_count_in(path, "the sample position in its metadata", value);
    else if (key == "world_size") meta.saved_by.world_size = parse_count_in(path, "the world size in its metadata", value);
    else if (key == "batch_size") meta.saved_by.batch_size = parse_count_in(path, "the batch size in its metadata", value);
    else if (key == "monitor") meta.monitor = std::string(value);
    else if (key == "monitored" && !value.empty()) meta.monitored = std::strtod(std::string(value).c_str(), nullptr);
    else if (key == "kiln") meta.kiln_version = std::string(value);
    else if (key == "rank_files") meta.rank_files.prefix = std::string(value);
    else if (key == "rank_files_world") meta.rank_files.world = parse_count_in(path, "the rank files' count in its metadata", value);
  }
  return meta;
}

}  // namespace

int64_t parse_count(const CheckpointFile& file, const std::string& what, std::string_view text) {
  return parse_count_in(file.path(), what, text);
}

std::string meta_text(const TrainPosition& position, const std::string& monitor, std::optional<double> monitored,
                      const SavedBy& saved_by, const RankFilesTag& rank_files) {
  char value[64] = "";
  if (monitored) std::snprintf(value, sizeof value, "%a", *monitored);
  SectionFieldsWriter out;
  out.add("format", int64_t{kCheckpointFormat}).add("kiln", KILN_VERSION).add("epoch", position.epoch);
  out.add("next_batch", position.next_batch).add("global_step", position.global_step);
  out.add("monitor", monitor).add("monitored", value);
  // Older readers skip keys they do not know.
  if (position.next_sample >= 0) out.add("next_sample", position.next_sample);
  if (saved_by.world_size > 0) out.add("world_size", saved_by.world_size);
  if (saved_by.batch_size > 0) out.add("batch_size", saved_by.batch_size);
  if (!rank_files.prefix.empty()) out.add("rank_files", rank_files.prefix).add("rank_files_world", rank_files.world);
  return out.text();
}

CheckpointMeta read_meta(const CheckpointFile& file) { return parse_meta(file.path(), file.section("meta")); }

void MetaPart::save(CheckpointSnapshot& snapshot) const {
  snapshot.add("meta", meta_text(f_.position, f_.monitor, f_.monitored, f_.saved_by,
                                 f_.rank_files ? *f_.rank_files : RankFilesTag{}));
  snapshot.add("manifest", f_.manifest_text);
}

void MetaPart::load(const CheckpointFile& file) {
  const CheckpointMeta meta = read_meta(file);
  f_.position = meta.position;
  f_.saved_by = meta.saved_by;
  f_.monitored = meta.monitored;
}

CheckpointMeta read_meta(const CheckpointHead& head) { return parse_meta(head.path, head.meta); }

}  // namespace kiln
