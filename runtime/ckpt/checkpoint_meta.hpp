// A checkpoint's position and metadata: where a resumed run continues and
// what retention ranks it by. Read without touching the model, so the
// directory scan, `--resume last|best` and `kiln inspect` need no LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/stateful.hpp"

namespace kiln {

// Where a run is: what a checkpoint saves and a resumed run continues from.
struct TrainPosition {
  int64_t epoch = 0;       // the epoch to run next (or continue)
  int64_t next_batch = 0;  // the batch of that epoch to run next
  int64_t global_step = 0;
  // Where the epoch continues in its global sample order: its first
  // next_sample samples (all ranks' batches together) are trained. This,
  // not next_batch, is what a resumed run goes by, so that another world
  // size or batch size continues exactly (data/sampler.hpp). -1: not
  // recorded (a checkpoint from an older kiln: next_batch of the same
  // world size and batch size).
  int64_t next_sample = -1;
};

// The run that saved a checkpoint: how many processes, how many samples in
// each one's batch. 0: not recorded (an older kiln).
struct SavedBy {
  int64_t world_size = 0;
  int64_t batch_size = 0;
};

// The files each rank wrote beside this one (ckpt/rank_files.hpp): their
// common prefix and how many. Empty: none.
struct RankFilesTag {
  std::string prefix;
  int64_t world = 0;
};

struct CheckpointMeta {
  TrainPosition position;
  SavedBy saved_by;
  std::string monitor;
  std::optional<double> monitored;
  std::string kiln_version;
  RankFilesTag rank_files;
};

// The "meta" section's text.
std::string meta_text(const TrainPosition& position, const std::string& monitor, std::optional<double> monitored,
                      const SavedBy& saved_by = {}, const RankFilesTag& rank_files = {});
CheckpointMeta read_meta(const CheckpointFile& file);
// The same, from a directory listing's read of the file (no checksum check).
CheckpointMeta read_meta(const CheckpointHead& head);

// A run's position and description: "meta" (meta_text) and "manifest" (the
// manifest's text, for `kiln inspect`; a resume reads the run's own).
// Loading sets the position, the saving run and the monitored value.
class MetaPart : public Stateful {
 public:
  struct Fields {
    TrainPosition& position;
    SavedBy& saved_by;
    const std::string& monitor;
    std::optional<double>& monitored;
    const std::string& manifest_text;
    const RankFilesTag* rank_files = nullptr;  // the commit's (Checkpointer::rank_files_tag)
  };
  explicit MetaPart(Fields fields) : f_(fields) {}
  void save(CheckpointSnapshot& snapshot) const override;
  void load(const CheckpointFile& file) override;

 private:
  Fields f_;
};

// For readers of a checkpoint's sections: a non-negative decimal integer that
// is the whole of `text`, or a CheckpointError naming the file and `what`.
int64_t parse_count(const CheckpointFile& file, const std::string& what, std::string_view text);
// A checkpoint's text as it may appear in a one-line message: escaped, cut.
std::string shown(std::string_view text);

}  // namespace kiln
