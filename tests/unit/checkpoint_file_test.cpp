// Unit tests for the checkpoint file format and its crash-safe commit
// (runtime/ckpt/checkpoint_format, checkpoint_writer, checkpoint_file; the
// sweep of temporaries in checkpoint_dir). Everything runs on real files in a
// fresh temporary directory per test; crashes are real SIGKILLs of forked
// children (KILN_FAULT_INJECT).
#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_dir.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "support/run_process.hpp"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using kiln::CheckpointError;
using kiln::CheckpointFile;
using kiln::CheckpointWriter;

namespace {

using kiln::test::read_file;
using kiln::test::write_file;

// File names in `dir`, sorted.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string random_bytes(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(size, '\0');
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, size - i));
  }
  return out;
}

// The message of the CheckpointError that read() throws, or "" (and a test
// failure) when it does not throw.
std::string read_error(const fs::path& path) {
  try {
    CheckpointFile::read(path);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "read(" << path << ") did not throw";
  return "";
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A small valid checkpoint, for the exhaustive truncation and bit-flip loops.
void write_small(const fs::path& path) {
  CheckpointWriter w(path);
  w.add("a", "xyz");
  w.add("empty", "");
  w.add("b", std::string("0123\0" "56789", 10));
  w.commit();
}

const std::vector<std::string> kFaultPoints = {"ckpt:after_open",   "ckpt:mid_write",   "ckpt:before_fsync",
                                               "ckpt:before_rename", "ckpt:after_rename", "ckpt:before_dir_fsync"};

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kiln_ckpt_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Forks; the child runs `body` and exits with its return value (3 if it
  // throws). Returns the wait status.
  template <class Body>
  int in_child(Body body) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      return -1;
    }
    if (pid == 0) {
      int code = 3;
      try {
        code = body();
      } catch (...) {
      }
      ::_exit(code);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
  }

  fs::path dir_;
};

TEST_F(CheckpointFileTest, RoundTripOfSeveralSectionsIncludingEmptyAndLarge) {
  const fs::path path = dir_ / "epoch=0001-step=000000010.ckpt";
  const std::string big = random_bytes(20 * 1000 * 1000, 1);
  const std::string binary("\0\xff\x01 KILNEND\0\n", 14);
  {
    CheckpointWriter w(path);
    w.add("meta", "hello");
    w.add("empty", "");
    w.add("null-empty", nullptr, 0);
    w.add("big", big.data(), big.size());
    w.add("binary", binary);
    w.add("after-big", "tail");
    w.commit();
  }
  EXPECT_EQ(listing(dir_), std::vector<std::string>{path.filename().string()});
  EXPECT_EQ(CheckpointFile::check(path), std::nullopt);

  const CheckpointFile f = CheckpointFile::read(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"meta", "empty", "null-empty", "big", "binary", "after-big"}));
  EXPECT_TRUE(f.has("big"));
  EXPECT_FALSE(f.has("bi"));
  EXPECT_EQ(f.section("meta"), "hello");
  EXPECT_EQ(f.section("empty"), "");
  EXPECT_EQ(f.section("null-empty"), "");
  EXPECT_TRUE(f.section("big") == big);  // not EXPECT_EQ: a failure would print 20 MB
  EXPECT_EQ(f.section("binary"), binary);
  EXPECT_EQ(f.section("after-big"), "tail");
}

TEST_F(CheckpointFileTest, LayoutMatchesTheDocumentedFormat) {
  const fs::path path = dir_ / "x.ckpt";
  {
    CheckpointWriter w(path);
    w.add("ab", "xyz");
    w.commit();
  }
  const std::string bytes = read_file(path);
  const std::string expected_prefix = std::string("KILNCKPT") + std::string("\x01\0\0\0", 4) +
                                      std::string("\x02\0\0\0", 4) + "ab" + std::string("\x03\0\0\0\0\0\0\0", 8) +
                                      "xyz" + std::string("\xff\xff\xff\xff", 4) +
                                      std::string("\x01\0\0\0\0\0\0\0", 8);
  ASSERT_EQ(bytes.size(), expected_prefix.size() + 16);
  EXPECT_EQ(bytes.substr(0, expected_prefix.size()), expected_prefix);
  EXPECT_EQ(bytes.substr(bytes.size() - 8), std::string("KILNEND\0", 8));
}

TEST_F(CheckpointFileTest, TemporaryLivesBesideTheFinalNameAndIsGoneAfterCommit) {
  const fs::path path = dir_ / "a.ckpt";
  CheckpointWriter w(path);
  EXPECT_EQ(w.temporary_path(), dir_ / (".a.ckpt.tmp-" + std::to_string(::getpid())));
  EXPECT_TRUE(fs::exists(w.temporary_path()));
  EXPECT_FALSE(fs::exists(path));
  struct stat st {};
  ASSERT_EQ(::stat(w.temporary_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  w.add("x", "1");
  w.commit();
  EXPECT_FALSE(fs::exists(w.temporary_path()));
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"a.ckpt"});
}

TEST_F(CheckpointFileTest, WriterDestroyedWithoutCommitRemovesTemporaryAndLeavesFinalUntouched) {
  const fs::path path = dir_ / "a.ckpt";
  write_file(path, "previous content");
  fs::path temporary;
  {
    CheckpointWriter w(path);
    temporary = w.temporary_path();
    w.add("x", random_bytes(3 << 20, 2));  // past the write buffer, so bytes reach the file
    EXPECT_TRUE(fs::exists(temporary));
  }
  EXPECT_FALSE(fs::exists(temporary));
  EXPECT_EQ(read_file(path), "previous content");
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"a.ckpt"});
}

TEST_F(CheckpointFileTest, CommitReplacesAnExistingCheckpoint) {
  const fs::path path = dir_ / "last.ckpt";
  {
    CheckpointWriter w(path);
    w.add("step", "1");
    w.commit();
  }
  CheckpointWriter w(path);
  w.add("step", "2");
  w.add("more", random_bytes(2 << 20, 3));
  // Until the commit, readers see the old checkpoint, complete.
  EXPECT_EQ(CheckpointFile::read(path).section("step"), "1");
  w.commit();
  const CheckpointFile f = CheckpointFile::read(path);
  EXPECT_EQ(f.section("step"), "2");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"step", "more"}));
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"last.ckpt"});
}

TEST_F(CheckpointFileTest, MissingDirectoryIsAnErrorNamingThePath) {
  const fs::path path = dir_ / "missing" / "a.ckpt";
  try {
    CheckpointWriter w(path);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(starts_with(e.what(), "cannot write checkpoint " + path.string() + ": ")) << e.what();
    EXPECT_TRUE(contains(e.what(), std::strerror(ENOENT))) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "missing"));
}

TEST_F(CheckpointFileTest, SecondWriterForTheSameNameFailsWithoutDisturbingTheFirst) {
  const fs::path path = dir_ / "a.ckpt";
  CheckpointWriter first(path);
  first.add("x", "first");
  EXPECT_THROW(CheckpointWriter second(path), std::runtime_error);
  // The failed writer must not have removed the temporary it did not create.
  EXPECT_TRUE(fs::exists(first.temporary_path()));
  first.commit();
  EXPECT_EQ(CheckpointFile::read(path).section("x"), "first");
}

TEST_F(CheckpointFileTest, DuplicateSectionNameIsRejectedAndTheWriterStaysUsable) {
  const fs::path path = dir_ / "a.ckpt";
  CheckpointWriter w(path);
  w.add("model", "1");
  EXPECT_THROW(w.add("model", "2"), std::invalid_argument);
  EXPECT_THROW(w.add("", "2"), std::invalid_argument);
  EXPECT_THROW(w.add("nodata", nullptr, 4), std::invalid_argument);
  w.add("optimizer", "3");
  w.commit();
  const CheckpointFile f = CheckpointFile::read(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"model", "optimizer"}));
  EXPECT_EQ(f.section("model"), "1");
}

// commit_checkpoint: a snapshot that owns its sections, written by the same
// protocol. The file is byte for byte the streaming writer's.
TEST_F(CheckpointFileTest, SnapshotCommitWritesTheStreamingWritersFile) {
  const std::string large = random_bytes((3 << 20) + 5, 11);
  kiln::CheckpointSnapshot snapshot;
  snapshot.add("meta", std::string("epoch=1"));
  snapshot.add("empty", std::string());
  {
    // The snapshot keeps these bytes alive: the caller's handle goes first.
    auto storage = std::make_shared<std::string>(large);
    snapshot.add("tensor", "head:", storage, storage->data(), storage->size());
  }
  snapshot.add("small", std::string("0123\0" "56789", 10));

  CheckpointWriter w(dir_ / "streamed.ckpt");
  w.add("meta", "epoch=1");
  w.add("empty", "");
  w.add("tensor", "head:", large.data(), large.size());
  w.add("small", std::string("0123\0" "56789", 10));
  w.commit();
  kiln::commit_checkpoint(dir_ / "snapshot.ckpt", snapshot);

  EXPECT_EQ(read_file(dir_ / "snapshot.ckpt"), read_file(dir_ / "streamed.ckpt"));
  const CheckpointFile f = CheckpointFile::read(dir_ / "snapshot.ckpt");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"meta", "empty", "tensor", "small"}));
  EXPECT_EQ(f.section("tensor"), "head:" + large);
  EXPECT_EQ(listing(dir_), (std::vector<std::string>{"snapshot.ckpt", "streamed.ckpt"}));
}

TEST_F(CheckpointFileTest, SnapshotCommitFailsAsTheWriterDoesAndKeepsThePreviousFile) {
  const fs::path path = dir_ / "last.ckpt";
  write_file(path, "previous content");
  kiln::CheckpointSnapshot snapshot;
  snapshot.add("model", std::string("1"));
  snapshot.add("model", std::string("2"));
  try {
    kiln::commit_checkpoint(path, snapshot);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "duplicate checkpoint section name 'model' in " + path.string());
  }
  EXPECT_EQ(read_file(path), "previous content");
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"last.ckpt"});

  const fs::path missing = dir_ / "missing" / "a.ckpt";
  try {
    kiln::commit_checkpoint(missing, kiln::CheckpointSnapshot{});
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(starts_with(e.what(), "cannot write checkpoint " + missing.string() + ": ")) << e.what();
  }
}

TEST_F(CheckpointFileTest, UseAfterCommitIsALogicError) {
  CheckpointWriter w(dir_ / "a.ckpt");
  w.commit();
  EXPECT_THROW(w.add("x", "1"), std::logic_error);
  EXPECT_THROW(w.commit(), std::logic_error);
  EXPECT_EQ(CheckpointFile::read(dir_ / "a.ckpt").names(), std::vector<std::string>{});
}

TEST_F(CheckpointFileTest, MissingSectionNamesFileAndSection) {
  const fs::path path = dir_ / "a.ckpt";
  write_small(path);
  const CheckpointFile f = CheckpointFile::read(path);
  try {
    f.section("optimizer");
    FAIL() << "no exception";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()), path.string() + ": no section 'optimizer'");
  }
}

TEST_F(CheckpointFileTest, TruncationAtEveryLengthIsReportedAsTruncated) {
  const fs::path good = dir_ / "good.ckpt";
  write_small(good);
  const std::string bytes = read_file(good);
  ASSERT_GT(bytes.size(), 40u);
  const fs::path path = dir_ / "cut.ckpt";
  for (size_t k = 0; k < bytes.size(); ++k) {
    SCOPED_TRACE("truncated to " + std::to_string(k) + " of " + std::to_string(bytes.size()) + " bytes");
    write_file(path, bytes.substr(0, k));
    const std::string message = read_error(path);
    EXPECT_TRUE(starts_with(message, path.string() + " ")) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    if (k == 0)
      EXPECT_EQ(message, path.string() + " is empty");
    else
      EXPECT_TRUE(contains(message, "truncated")) << message;
    // check() streams instead of loading, and must reach the same verdict.
    EXPECT_EQ(CheckpointFile::check(path), std::optional<std::string>(message));
  }
}

TEST_F(CheckpointFileTest, EveryBitFlipIsDetected) {
  const fs::path good = dir_ / "good.ckpt";
  write_small(good);
  const std::string bytes = read_file(good);
  const fs::path path = dir_ / "flipped.ckpt";
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      SCOPED_TRACE("byte " + std::to_string(i) + " bit " + std::to_string(bit));
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      write_file(path, flipped);
      const std::string message = read_error(path);
      EXPECT_TRUE(starts_with(message, path.string() + " ")) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      EXPECT_EQ(CheckpointFile::check(path), std::optional<std::string>(message));
    }
  }
}

TEST_F(CheckpointFileTest, FlippedDataByteIsAChecksumMismatch) {
  const fs::path path = dir_ / "a.ckpt";
  write_small(path);
  std::string bytes = read_file(path);
  const size_t at = bytes.find("xyz");
  ASSERT_NE(at, std::string::npos);
  bytes[at] = 'X';
  write_file(path, bytes);
  const std::string message = read_error(path);
  EXPECT_TRUE(starts_with(message, path.string() + " checksum mismatch: the file is corrupt (expected 0x"))
      << message;
  EXPECT_TRUE(contains(message, ", computed 0x")) << message;
}

TEST_F(CheckpointFileTest, WrongMagicIsNotACheckpoint) {
  const fs::path path = dir_ / "a.ckpt";
  write_small(path);
  std::string bytes = read_file(path);
  bytes.replace(0, 8, "PK\x03\x04zip!");
  write_file(path, bytes);
  EXPECT_TRUE(contains(read_error(path), "is not a kiln checkpoint"));
  write_file(path, "hello, this is a text file");
  EXPECT_TRUE(contains(read_error(path), "is not a kiln checkpoint"));
}

TEST_F(CheckpointFileTest, FutureFormatVersionIsNamed) {
  const fs::path path = dir_ / "a.ckpt";
  write_small(path);
  std::string bytes = read_file(path);
  bytes[8] = 2;
  write_file(path, bytes);
  const std::string expected = path.string() + " was written by checkpoint format 2; this kiln reads format 1";
  EXPECT_EQ(read_error(path), expected);
  EXPECT_EQ(CheckpointFile::check(path), std::optional<std::string>(expected));
}

TEST_F(CheckpointFileTest, TrailingBytesAreRejected) {
  const fs::path path = dir_ / "a.ckpt";
  write_small(path);
  write_file(path, read_file(path) + "x");
  EXPECT_TRUE(contains(read_error(path), "unexpected bytes after the end marker")) << read_error(path);
}

TEST_F(CheckpointFileTest, SectionLengthPastTheEndIsNamed) {
  const fs::path path = dir_ / "a.ckpt";
  {
    CheckpointWriter w(path);
    w.add("weights", "0123456789");
    w.commit();
  }
  std::string bytes = read_file(path);
  bytes[12 + 4 + 7 + 5] = 1;  // the data length's byte 5: 2^40 + 10
  write_file(path, bytes);
  EXPECT_EQ(read_error(path),
            path.string() + " is truncated or corrupt (section 'weights' runs past the end of the file)");
}

TEST_F(CheckpointFileTest, UnreadablePathsAreReportedNotThrownAsSomethingElse) {
  const fs::path missing = dir_ / "missing.ckpt";
  EXPECT_TRUE(starts_with(read_error(missing), missing.string() + " cannot be read: "));
  ASSERT_TRUE(CheckpointFile::check(missing).has_value());
  EXPECT_TRUE(contains(*CheckpointFile::check(missing), std::strerror(ENOENT)));
  EXPECT_EQ(read_error(dir_), dir_.string() + " is not a regular file");
  const fs::path empty = dir_ / "empty.ckpt";
  write_file(empty, "");
  EXPECT_EQ(CheckpointFile::check(empty), std::optional<std::string>(empty.string() + " is empty"));
}

// --- sweep_temporaries ------------------------------------------------------

TEST_F(CheckpointFileTest, SweepRemovesTemporariesOfDeadProcessesOnly) {
  // A pid that is certainly dead: a child we reaped.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  const std::string dead = std::to_string(child);

  const std::vector<std::string> stale = {".epoch=0001-step=000000010.ckpt.tmp-" + dead,
                                          ".last.ckpt.tmp-" + std::to_string(::getpid())};
  const std::vector<std::string> kept = {
      ".last.ckpt.tmp-" + std::to_string(::getppid()),  // a live process may still be writing
      "epoch=0001-step=000000010.ckpt",                 // committed checkpoints
      "last.ckpt.tmp-" + dead,                          // no leading dot
      ".last.ckpt.tmp-",                                // no pid
      ".last.ckpt.tmp-12x",                             // not a pid
      ".last.ckpt.tmp-0",                               // pid 0 is not a process
      "..tmp-" + dead,                                  // nothing between the dot and the tag
      ".last.ckpt.tmp-" + dead + ".bak",
  };
  for (const auto& name : stale) write_file(dir_ / name, "partial");
  for (const auto& name : kept) write_file(dir_ / name, "keep");
  // Not recursive, and only plain files.
  fs::create_directory(dir_ / "sub");
  write_file(dir_ / "sub" / (".a.ckpt.tmp-" + dead), "partial");
  fs::create_directory(dir_ / (".d.ckpt.tmp-" + dead));

  std::vector<fs::path> removed = kiln::sweep_temporaries(dir_);
  std::sort(removed.begin(), removed.end());
  std::vector<fs::path> expected;
  for (const auto& name : stale) expected.push_back(dir_ / name);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(removed, expected);

  std::vector<std::string> remaining = kept;
  remaining.push_back("sub");
  remaining.push_back(".d.ckpt.tmp-" + dead);
  std::sort(remaining.begin(), remaining.end());
  EXPECT_EQ(listing(dir_), remaining);
  EXPECT_TRUE(fs::exists(dir_ / "sub" / (".a.ckpt.tmp-" + dead)));
  EXPECT_EQ(kiln::sweep_temporaries(dir_), std::vector<fs::path>{});
}

TEST_F(CheckpointFileTest, SweepOfAMissingDirectoryFindsNothing) {
  EXPECT_EQ(kiln::sweep_temporaries(dir_ / "missing"), std::vector<fs::path>{});
}

// --- Crashes: KILN_FAULT_INJECT ---------------------------------------------

TEST_F(CheckpointFileTest, FaultPointMatchesExactNamesInACommaSeparatedList) {
  struct Case {
    const char* env;
    const char* point;
    bool killed;
  };
  const Case cases[] = {
      {"ckpt:before_rename", "ckpt:before_rename", true},
      {"x,ckpt:before_rename,y", "ckpt:before_rename", true},
      {"x,ckpt:before_rename", "ckpt:before_rename", true},
      {"ckpt:before", "ckpt:before_rename", false},
      {"ckpt:before_rename_x", "ckpt:before_rename", false},
      {"", "ckpt:before_rename", false},
      {nullptr, "ckpt:before_rename", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string("KILN_FAULT_INJECT=") + (c.env ? c.env : "(unset)"));
    const int status = in_child([&] {
      if (c.env)
        ::setenv("KILN_FAULT_INJECT", c.env, 1);
      else
        ::unsetenv("KILN_FAULT_INJECT");
      kiln::fault_point(c.point);
      return 0;
    });
    if (c.killed) {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
    } else {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    }
  }
}

// A crash at every point of the commit leaves, under the final name, either
// the previous checkpoint intact or the new one complete, never a partial
// file; and whatever temporary it leaves, the next sweep removes.
TEST_F(CheckpointFileTest, CrashAtEveryFaultPointLeavesOldOrNewCheckpointNeverAPartialOne) {
  const std::string big = random_bytes(3 << 20, 4);
  for (const bool had_previous : {true, false}) {
    for (size_t i = 0; i < kFaultPoints.size(); ++i) {
      const std::string& point = kFaultPoints[i];
      SCOPED_TRACE(point + (had_previous ? " over a previous checkpoint" : " with no previous checkpoint"));
      const fs::path run = dir_ / (std::to_string(had_previous) + "-" + std::to_string(i));
      fs::create_directory(run);
      const fs::path path = run / "last.ckpt";
      std::string previous;
      if (had_previous) {
        CheckpointWriter w(path);
        w.add("step", "old");
        w.commit();
        previous = read_file(path);
      }

      const int status = in_child([&] {
        ::setenv("KILN_FAULT_INJECT", point.c_str(), 1);
        CheckpointWriter w(path);
        w.add("step", "new");
        w.add("weights", big);
        w.commit();
        return 0;  // reaching this means the fault point never fired
      });
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

      const bool renamed = point == "ckpt:after_rename" || point == "ckpt:before_dir_fsync";
      if (renamed) {
        const CheckpointFile f = CheckpointFile::read(path);
        EXPECT_EQ(f.section("step"), "new");
        EXPECT_TRUE(f.section("weights") == big);
        EXPECT_EQ(listing(run), std::vector<std::string>{"last.ckpt"});
      } else {
        if (had_previous) {
          EXPECT_EQ(read_file(path), previous);
        } else {
          EXPECT_FALSE(fs::exists(path));
        }
        // The crashed writer's temporary is still there (SIGKILL ran no
        // destructor); it is the only other file, and sweeping removes it.
        std::vector<std::string> names = listing(run);
        names.erase(std::remove(names.begin(), names.end(), "last.ckpt"), names.end());
        ASSERT_EQ(names.size(), 1u);
        EXPECT_TRUE(starts_with(names[0], ".last.ckpt.tmp-")) << names[0];
        if (point == "ckpt:mid_write") {
          // Really a partial file: the crash happened mid-way through it.
          EXPECT_GT(fs::file_size(run / names[0]), 0u);
          EXPECT_TRUE(CheckpointFile::check(run / names[0]).has_value());
        }
        EXPECT_EQ(kiln::sweep_temporaries(run), std::vector<fs::path>{run / names[0]});
        EXPECT_EQ(listing(run), had_previous ? std::vector<std::string>{"last.ckpt"} : std::vector<std::string>{});
      }
    }
  }
}

// --- Write errors -------------------------------------------------------------

// A full disk cannot be simulated without mounting a file system, but a
// file-size limit makes write() fail (EFBIG) the same way ENOSPC does: the
// temporary must go, the previous file must stay, and the message must say
// what failed. Run in a child so the limit does not leak into other tests.
TEST_F(CheckpointFileTest, WriteErrorRemovesTheTemporaryAndKeepsThePreviousFile) {
  const fs::path path = dir_ / "last.ckpt";
  write_file(path, "previous content");
  // After a small first section (which add() flushes), 512 KiB waits in the
  // write buffer and fails at commit's flush; 4 MiB is written straight
  // from the caller's memory and fails in add().
  for (const size_t size : {size_t{512} << 10, size_t{4} << 20}) {
    SCOPED_TRACE("section of " + std::to_string(size) + " bytes");
    const int status = in_child([&] {
      std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing us
      const rlimit limit{64 << 10, 64 << 10};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
      const std::string data(size, 'x');
      // The writer outlives the failure: the error path itself, not the
      // destructor, must have removed the temporary.
      CheckpointWriter w(path);
      const fs::path temporary = w.temporary_path();
      bool added = false;
      try {
        w.add("step", "1");
        w.add("weights", data);
        added = true;
        w.commit();
        return 11;  // the limit did not bite
      } catch (const std::runtime_error& e) {
        const std::string message = e.what();
        if (!starts_with(message, "cannot write checkpoint " + path.string() + ": write " + temporary.string()))
          return 12;
        if (!contains(message, std::strerror(EFBIG))) return 13;
        if (added != (size < (size_t{1} << 20))) return 16;  // failed where expected
      }
      if (fs::exists(temporary)) return 14;
      if (read_file(path) != "previous content") return 15;
      return 0;
    });
    EXPECT_TRUE(WIFEXITED(status)) << "status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_EQ(listing(dir_), std::vector<std::string>{"last.ckpt"});
  }
}

// A failed writer refuses further use instead of writing a file with a hole.
TEST_F(CheckpointFileTest, WriterIsUnusableAfterAFailedWrite) {
  const fs::path path = dir_ / "a.ckpt";
  const int status = in_child([&] {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 << 10, 64 << 10};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
    CheckpointWriter w(path);
    try {
      w.add("weights", std::string(4 << 20, 'x'));
      return 11;
    } catch (const std::runtime_error&) {
    }
    try {
      w.add("more", "x");
      return 12;
    } catch (const std::logic_error&) {
    }
    try {
      w.commit();
      return 13;
    } catch (const std::logic_error&) {
    }
    return fs::exists(path) ? 14 : 0;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_EQ(listing(dir_), std::vector<std::string>{});
}


// A file of a few dozen bytes that declares a section (or a section name) far
// larger than itself is refused before anything of the declared size is
// allocated: allocation is bounded by the file's size. The child has 256 MiB
// of address space to spare, so allocating the declared 1 GiB or 4 GiB would
// fail (std::bad_alloc, or a sanitizer's out-of-memory abort) instead of
// giving the CheckpointError.
TEST_F(CheckpointFileTest, HugeDeclaredLengthsAreRefusedWithoutAllocatingThem) {
  const fs::path path = dir_ / "a.ckpt";
  {
    CheckpointWriter w(path);
    w.add("weights", "0123456789");
    w.commit();
  }
  const std::string valid = read_file(path);
  auto patched = [&](size_t offset, int width, uint64_t value) {
    std::string bytes = valid;
    for (int i = 0; i < width; ++i) bytes[offset + i] = static_cast<char>((value >> (8 * i)) & 0xFF);
    return bytes;
  };
  // Offsets: magic 0, version 8, name length 12, name 16, data length 23.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {patched(23, 8, uint64_t{1} << 30), "is truncated or corrupt (section 'weights' runs past the end of the file)"},
      {patched(23, 8, ~uint64_t{0}), "is truncated or corrupt (section 'weights' runs past the end of the file)"},
      {patched(12, 4, 0xFFFFFFFEu),
       "is truncated or corrupt (a section name of 4294967294 bytes runs past the end of the file)"},
      {patched(12, 4, 60000), "is truncated or corrupt (a section name of 60000 bytes runs past the end of the file)"},
  };
  const int status = in_child([&] {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    if (pages <= 0) return 10;
    const rlim_t spare = rlim_t{256} << 20;
    const rlim_t now = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE));
    const rlimit limit{now + spare, now + spare};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) return 11;
    for (size_t i = 0; i < cases.size(); ++i) {
      write_file(path, cases[i].first);
      const std::string expected = path.string() + " " + cases[i].second;
      if (CheckpointFile::check(path) != std::optional<std::string>(expected)) return 20 + static_cast<int>(i);
      try {
        CheckpointFile::read(path);
        return 30 + static_cast<int>(i);
      } catch (const CheckpointError& e) {
        if (e.what() != expected) return 40 + static_cast<int>(i);
      }
    }
    return 0;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "status " << status << " (exit " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << ", signal "
      << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ")";
}

}  // namespace
