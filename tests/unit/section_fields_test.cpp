// Unit tests for the checkpoint sections' key/value codec
// (runtime/ckpt/section_fields) and the two sections written with it:
// "meta" and "amp/scaler", byte for byte as kilns before it wrote them.
#include "ckpt/section_fields.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <unistd.h>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "optim/scaler_checkpoint.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no error)";
}

// A checkpoint file of the given text sections, read back.
CheckpointFile file_of(const std::vector<std::pair<std::string, std::string>>& sections) {
  const fs::path dir = fs::temp_directory_path() / ("kiln-fields-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  CheckpointWriter writer(dir / "a.ckpt");
  for (const auto& [name, bytes] : sections) writer.add(name, bytes);
  writer.commit();
  CheckpointFile file = CheckpointFile::read(dir / "a.ckpt");
  fs::remove_all(dir);
  return file;
}

TEST(CheckpointFileFields, RoundTripInOrder) {
  const std::string text = SectionFieldsWriter().add("b", "two words").add("a", int64_t{42}).add("empty", "").text();
  EXPECT_EQ(text, "b two words\na 42\nempty \n");
  const SectionFields fields("x.ckpt: section 's'", text);
  ASSERT_EQ(fields.lines().size(), 3u);
  EXPECT_EQ(fields.lines()[0].first, "b");
  EXPECT_EQ(fields.get("b"), "two words");
  EXPECT_EQ(fields.count("a"), 42);
  EXPECT_EQ(fields.get("empty"), "");
  EXPECT_FALSE(fields.find("c"));
  // A line without a space is a key with an empty value; the last of a key counts.
  const SectionFields odd("x.ckpt: section 's'", "flag\na 1\na 2");
  EXPECT_EQ(odd.get("flag"), "");
  EXPECT_EQ(odd.count("a"), 2);
}

TEST(CheckpointFileFields, AMissingOrMalformedFieldIsOneLineNamingFileSectionAndKey) {
  const SectionFields fields("run/a.ckpt: section 'meta'", "epoch two\nscale 1e999\n");
  EXPECT_EQ(error_of([&] { fields.count("epoch"); }),
            "run/a.ckpt: section 'meta': field 'epoch' is not a non-negative integer ('two')");
  EXPECT_EQ(error_of([&] { fields.count("step"); }), "run/a.ckpt: section 'meta' has no field 'step'");
  EXPECT_EQ(error_of([&] { fields.number("scale"); }),
            "run/a.ckpt: section 'meta': field 'scale' is not a finite number ('1e999')");
  const SectionFields newline("run/a.ckpt: section 'meta'", "epoch 1\n2\n");
  EXPECT_EQ(error_of([&] { newline.count("2"); }), "run/a.ckpt: section 'meta': field '2' is not a non-negative "
                                                   "integer ('')");
}

// "meta" as kilns before the codec wrote it (an ostringstream of these lines).
TEST(CheckpointFileFields, MetaTextIsByteIdenticalAndOldTextParsesTheSame) {
  const TrainPosition position{3, 5, 70, 1280};
  const std::string expected = std::string("format 1\nkiln ") + KILN_VERSION +
                               "\nepoch 3\nnext_batch 5\nglobal_step 70\nmonitor val/loss\nmonitored 0x1p-1\n"
                               "next_sample 1280\nworld_size 2\nbatch_size 32\n";
  EXPECT_EQ(meta_text(position, "val/loss", 0.5, SavedBy{2, 32}), expected);
  EXPECT_EQ(meta_text(TrainPosition{1, 0, 9}, "", std::nullopt),
            std::string("format 1\nkiln ") + KILN_VERSION + "\nepoch 1\nnext_batch 0\nglobal_step 9\nmonitor \nmonitored \n");

  // An older kiln's: no sample position, no saving run.
  const CheckpointFile old = file_of({{"meta", "format 1\nkiln 0.1.0\nepoch 2\nnext_batch 4\nglobal_step 8\nmonitor "
                                               "val/acc\nmonitored 0x1.8p-1\n"}});
  const CheckpointMeta meta = read_meta(old);
  EXPECT_EQ(meta.position.epoch, 2);
  EXPECT_EQ(meta.position.next_batch, 4);
  EXPECT_EQ(meta.position.global_step, 8);
  EXPECT_EQ(meta.position.next_sample, -1);
  EXPECT_EQ(meta.saved_by.world_size, 0);
  EXPECT_EQ(meta.monitor, "val/acc");
  EXPECT_EQ(meta.monitored, 0.75);
  EXPECT_EQ(meta.kiln_version, "0.1.0");

  const CheckpointFile bad = file_of({{"meta", "epoch two\n"}});
  EXPECT_EQ(error_of([&] { read_meta(bad); }),
            bad.path().string() + ": the epoch in its metadata is not a non-negative integer ('two')");
}

TEST(CheckpointFileFields, ScalerTextIsByteIdenticalAndMalformedIsOneLine) {
  const ScalerState state{1234.5678901234567, 17, 3};
  char old[128];
  std::snprintf(old, sizeof old, "scale %.17g\ngrowth_tracker %lld\nskipped %lld\n", state.scale,
                static_cast<long long>(state.growth_tracker), static_cast<long long>(state.skipped));
  EXPECT_EQ(scaler_text(state), old);

  const ScalerState read = read_scaler(file_of({{"amp/scaler", old}}));
  EXPECT_EQ(read.scale, state.scale);
  EXPECT_EQ(read.growth_tracker, 17);
  EXPECT_EQ(read.skipped, 3);

  for (const std::string text : {"scale 0\ngrowth_tracker 1\nskipped 0\n", "scale 2\ngrowth_tracker -1\nskipped 0\n",
                                 "scale 2\ngrowth_tracker 1\n", "scale nan\ngrowth_tracker 1\nskipped 0\n"}) {
    const CheckpointFile file = file_of({{"amp/scaler", text}});
    EXPECT_EQ(error_of([&] { read_scaler(file); }), file.path().string() +
                                                        ": section 'amp/scaler' is not a gradient scaler's state (" +
                                                        printable(text) + ")");
  }
}

}  // namespace
}  // namespace kiln
