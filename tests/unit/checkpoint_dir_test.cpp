// Unit tests for listing a checkpoint directory (runtime/ckpt/checkpoint_dir.cpp,
// read_checkpoint_head in checkpoint_file.cpp): a listing reads each file's
// header, metadata and trailer but not its tensor data, and the checksum is
// verified for the one file a run resumes from. Real files in a fresh
// temporary directory per test.
#include "ckpt/checkpoint_dir.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "support/run_process.hpp"
#include "util/errors.hpp"

namespace fs = std::filesystem;

namespace kiln {
namespace {

using test::read_file;
using test::write_file;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The message of the CheckpointError read_checkpoint_head throws, or "".
std::string head_error(const fs::path& path) {
  try {
    read_checkpoint_head(path);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kiln_ckpt_dir_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A checkpoint as kiln lays one out: "meta" first, then "tensor" bytes.
  fs::path write(const std::string& name, int64_t epoch, int64_t step, std::optional<double> monitored = {},
                 size_t tensor_bytes = 4096) {
    const fs::path path = dir_ / name;
    CheckpointWriter w(path);
    w.add("meta", meta_text(TrainPosition{epoch, 0, step}, monitored ? "val/loss" : "", monitored));
    w.add("manifest", "[run]\n");
    const std::string tensor(tensor_bytes, '\x5a');
    w.add("param/fc.weight", "float32 [" + std::to_string(tensor_bytes / 4) + "]\n", tensor.data(), tensor.size());
    w.commit();
    return path;
  }

  // Flips one byte in the middle of the file (inside the tensor data):
  // header, metadata and trailer intact, the checksum no longer matches.
  // Written as a new file, as a hard-linked last.ckpt must not be written through.
  static void corrupt_tensor_bytes(const fs::path& path) {
    std::string bytes = read_file(path);
    bytes[bytes.size() / 2] ^= 0x10;
    fs::remove(path);
    write_file(path, bytes);
  }

  fs::path dir_;
};

TEST_F(CheckpointDirTest, HeadHasTheMetadataAndTheSize) {
  const fs::path path = write("epoch=0003-step=000000120.ckpt", 3, 120, 0.25);
  const CheckpointHead head = read_checkpoint_head(path);
  EXPECT_EQ(head.path, path);
  EXPECT_EQ(head.size, fs::file_size(path));
  const CheckpointMeta meta = read_meta(head);
  EXPECT_EQ(meta.position.epoch, 3);
  EXPECT_EQ(meta.position.global_step, 120);
  ASSERT_TRUE(meta.monitored.has_value());
  EXPECT_EQ(*meta.monitored, 0.25);
  EXPECT_EQ(meta.monitor, "val/loss");
  // The same metadata as a full, checksummed read gives.
  const CheckpointMeta full = read_meta(CheckpointFile::read(path));
  EXPECT_EQ(full.position.epoch, meta.position.epoch);
  EXPECT_EQ(full.position.global_step, meta.position.global_step);
  EXPECT_EQ(full.kiln_version, meta.kiln_version);
}

// What the head does not read, it cannot be hurt by: corrupt tensor bytes
// leave it readable (a full read refuses the file on its checksum).
TEST_F(CheckpointDirTest, HeadDoesNotReadTheTensorData) {
  const fs::path path = write("a.ckpt", 1, 10, std::nullopt, 1 << 20);
  corrupt_tensor_bytes(path);
  EXPECT_EQ(read_meta(read_checkpoint_head(path)).position.global_step, 10);
  ASSERT_TRUE(CheckpointFile::check(path).has_value());
  EXPECT_TRUE(contains(*CheckpointFile::check(path), "checksum mismatch"));
}

// A file cut anywhere is refused by the head alone, from its trailer.
TEST_F(CheckpointDirTest, HeadRefusesEveryTruncation) {
  const fs::path good = write("good.ckpt", 1, 10, std::nullopt, 64);
  const std::string bytes = read_file(good);
  const fs::path cut = dir_ / "cut.ckpt";
  for (size_t size = 0; size < bytes.size(); ++size) {
    write_file(cut, bytes.substr(0, size));
    const std::string error = head_error(cut);
    EXPECT_FALSE(error.empty()) << "cut at " << size << " of " << bytes.size();
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    EXPECT_TRUE(contains(error, cut.string())) << error;
  }
}

TEST_F(CheckpointDirTest, HeadRefusesForeignFilesAndFilesWithoutMetadata) {
  const fs::path zip = dir_ / "model.ckpt";
  write_file(zip, std::string("PK\x03\x04 a zip, as torch.save writes", 33));
  EXPECT_TRUE(contains(head_error(zip), "is not a kiln checkpoint")) << head_error(zip);

  const fs::path empty = dir_ / "empty.ckpt";
  write_file(empty, "");
  EXPECT_TRUE(contains(head_error(empty), "is empty")) << head_error(empty);

  const fs::path no_meta = dir_ / "no_meta.ckpt";
  {
    CheckpointWriter w(no_meta);
    w.add("manifest", "[run]\n");
    w.commit();
  }
  EXPECT_TRUE(contains(head_error(no_meta), "no 'meta' section")) << head_error(no_meta);

  std::string future = read_file(write("future.ckpt", 0, 1));
  future[8] = 9;  // the format version
  write_file(dir_ / "future.ckpt", future);
  EXPECT_TRUE(contains(head_error(dir_ / "future.ckpt"), "checkpoint format 9")) << head_error(dir_ / "future.ckpt");
}

TEST_F(CheckpointDirTest, ListingKeepsCorruptTensorBytesAndSkipsWhatCannotBeRead) {
  write("epoch=0001-step=000000010.ckpt", 1, 10);
  corrupt_tensor_bytes(write("epoch=0002-step=000000020.ckpt", 2, 20));
  write_file(dir_ / "epoch=0003-step=000000030.ckpt", "KILNCKPT");  // truncated
  write_file(dir_ / ".epoch=0004-step=000000040.ckpt.tmp-1", "");   // a temporary: not listed
  std::vector<std::string> skipped;
  auto found = scan_checkpoints(dir_, [&](const CheckpointError& e) { skipped.push_back(e.what()); });
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.global_step < b.global_step; });
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].global_step, 10);
  EXPECT_EQ(found[1].global_step, 20);
  EXPECT_EQ(found[1].epoch, 2);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_TRUE(contains(skipped[0], "epoch=0003-step=000000030.ckpt is truncated")) << skipped[0];
}

// `--resume last`: the listing picks last.ckpt; its checksum fails, so the
// newest file that verifies is used — the same choice as when the listing
// verified every file.
TEST_F(CheckpointDirTest, ResumeLastVerifiesTheChoiceAndFallsBackToTheNewestValid) {
  const RetentionPolicy policy{"", MonitorMode::min, 1};
  write("epoch=0001-step=000000010.ckpt", 1, 10);
  const fs::path newer = write("epoch=0002-step=000000020.ckpt", 2, 20);
  link_checkpoint(newer, dir_ / "last.ckpt");
  EXPECT_EQ(resolve_resume("last", dir_, policy), dir_ / "last.ckpt");

  corrupt_tensor_bytes(dir_ / "last.ckpt");  // last.ckpt now its own, corrupt file
  EXPECT_EQ(resolve_resume("last", dir_, policy), newer);
  corrupt_tensor_bytes(newer);
  EXPECT_EQ(resolve_resume("last", dir_, policy), dir_ / "epoch=0001-step=000000010.ckpt");
}

TEST_F(CheckpointDirTest, ResumeBestVerifiesTheChoiceAndFallsBackToTheNextBest) {
  const RetentionPolicy policy{"val/loss", MonitorMode::min, 2};
  const fs::path best = write("epoch=0001-step=000000010.ckpt", 1, 10, 0.1);
  const fs::path second = write("epoch=0002-step=000000020.ckpt", 2, 20, 0.2);
  write("epoch=0003-step=000000030.ckpt", 3, 30, 0.3);
  EXPECT_EQ(resolve_resume("best", dir_, policy), best);
  corrupt_tensor_bytes(best);
  EXPECT_EQ(resolve_resume("best", dir_, policy), second);
}

// Found by the listing, refused when resumed: one line, naming the file and
// the checksum, as bad input (kiln exits 2).
TEST_F(CheckpointDirTest, CorruptTensorBytesAreRefusedWhenResumedInOneLine) {
  const RetentionPolicy policy{"", MonitorMode::min, 1};
  const fs::path only = write("epoch=0001-step=000000010.ckpt", 1, 10);
  corrupt_tensor_bytes(only);
  EXPECT_EQ(scan_checkpoints(dir_, nullptr).size(), 1u);
  for (const std::string& spec : std::vector<std::string>{"last", "best", only.string()}) {
    try {
      resolve_resume(spec, dir_, policy);
      ADD_FAILURE() << spec << ": resolved";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_TRUE(contains(what, only.string())) << what;
      EXPECT_TRUE(contains(what, "checksum mismatch")) << what;
    }
  }
}

}  // namespace
}  // namespace kiln
