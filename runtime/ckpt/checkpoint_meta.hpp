// A checkpoint's position and metadata: where a resumed run continues and
// what retention ranks it by. Read without touching the model, so the
// directory scan, `--resume last|best` and `kiln inspect` need no LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/checkpoint_file.hpp"

namespace kiln {

// Where a run is: what a checkpoint saves and a resumed run continues from.
struct TrainPosition {
  int64_t epoch = 0;       // the epoch to run next (or continue)
  int64_t next_batch = 0;  // the batch of that epoch to run next
  int64_t global_step = 0;
};

struct CheckpointMeta {
  TrainPosition position;
  std::string monitor;
  std::optional<double> monitored;
  std::string kiln_version;
};

// The "meta" section's text.
std::string meta_text(const TrainPosition& position, const std::string& monitor, std::optional<double> monitored);
CheckpointMeta read_meta(const CheckpointFile& file);
// The same, from a directory listing's read of the file (no checksum check).
CheckpointMeta read_meta(const CheckpointHead& head);

// For readers of a checkpoint's sections: a non-negative decimal integer that
// is the whole of `text`, or a CheckpointError naming the file and `what`.
int64_t parse_count(const CheckpointFile& file, const std::string& what, std::string_view text);
// A checkpoint's text as it may appear in a one-line message: escaped, cut.
std::string shown(std::string_view text);

}  // namespace kiln
