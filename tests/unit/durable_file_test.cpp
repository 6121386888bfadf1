// util/durable_file: what every crash-safe file kiln writes goes through.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "support/run_process.hpp"
#include "util/durable_file.hpp"

namespace kiln {
namespace {

std::string read(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(DurableFile, ReplacesTheFileWholeAndLeavesNoTemporary) {
  test::TempDir dir("kiln-durable");
  const auto file = dir.path() / "metrics.csv";
  write_file_durably(file, "a\n");
  write_file_durably(file, std::string(3 << 20, 'x'));  // larger than one write() may take
  EXPECT_EQ(read(file), std::string(3 << 20, 'x'));
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"metrics.csv"});
}

TEST(DurableFile, AFailedWriteNamesTheFileAndKeepsTheOldOne) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  test::TempDir dir("kiln-durable");
  const auto file = dir.path() / "metrics.csv";
  write_file_durably(file, "old\n");
  ::chmod(dir.path().c_str(), 0555);  // the temporary cannot be created
  try {
    write_file_durably(file, "new\n");
    ADD_FAILURE() << "writing into a read-only directory must fail";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write " + file.string() + ": create"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Permission denied"), std::string::npos) << e.what();
  }
  ::chmod(dir.path().c_str(), 0755);
  EXPECT_EQ(read(file), "old\n");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"metrics.csv"});
}

// Runs as root too (where directory permissions do not stop a write): the
// rename fails, after the temporary was written and fsync'ed.
TEST(DurableFile, AFailedRenameNamesTheFileAndLeavesNoTemporary) {
  test::TempDir dir("kiln-durable");
  const auto file = dir.path() / "predictions.pt";
  std::filesystem::create_directories(file / "in-the-way");
  try {
    write_file_durably(file, "new\n");
    ADD_FAILURE() << "renaming over a non-empty directory must fail";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write " + file.string() + ": rename"), std::string::npos) << e.what();
  }
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"predictions.pt"});
  EXPECT_TRUE(std::filesystem::is_directory(file / "in-the-way"));
}

TEST(DurableFile, AMissingDirectoryIsAnErrorNotCreated) {
  test::TempDir dir("kiln-durable");
  EXPECT_THROW(write_file_durably(dir.path() / "nope" / "f", "x"), std::runtime_error);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "nope"));
}

TEST(DurableFile, LinkPublishesTheSameBytesUnderASecondName) {
  test::TempDir dir("kiln-durable");
  write_file_durably(dir.path() / "a.ckpt", "one");
  link_durably(dir.path() / "a.ckpt", dir.path() / "last.ckpt");
  write_file_durably(dir.path() / "b.ckpt", "two");
  link_durably(dir.path() / "b.ckpt", dir.path() / "last.ckpt");  // replaces the link atomically
  EXPECT_EQ(read(dir.path() / "last.ckpt"), "two");
  EXPECT_TRUE(std::filesystem::equivalent(dir.path() / "b.ckpt", dir.path() / "last.ckpt"));
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"a.ckpt", "b.ckpt", "last.ckpt"}));
}

TEST(DurableFile, TheTemporaryIsInTheSameDirectoryAndNamesTheWriter) {
  const auto t = temporary_for("/run/ckpt/last.ckpt");
  EXPECT_EQ(t.parent_path(), "/run/ckpt");
  EXPECT_EQ(t.filename().string(), ".last.ckpt.tmp-" + std::to_string(::getpid()));
}

}  // namespace
}  // namespace kiln
