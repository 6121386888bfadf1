// Runs a real child process for integration tests: captures stdout+stderr,
// enforces a timeout (a bound against hangs, never a performance check) and
// reports the exit code or the signal that ended it.
#pragma once

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kiln::test {

struct ProcessResult {
  int exit_code = -1;     // valid when !signaled
  int signal = 0;         // the signal that ended the process, if any
  bool timed_out = false;
  std::string output;     // stdout and stderr, interleaved
  double seconds = 0;
};

struct ProcessOptions {
  std::filesystem::path cwd;                       // empty = inherit
  std::map<std::string, std::string> env;          // added to the environment
  std::chrono::seconds timeout{300};
};

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options = {});

// How much slower than a plain build this one runs: KILN_TEST_TIMEOUT_SCALE
// (./go test --sanitize sets 3), else 1. Bounds against hangs and the slack
// of "within timeout_s" checks are multiplied by it; the asserted timeouts
// themselves are kiln's and do not change.
double timeout_scale();

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "kiln-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void write_file(const std::filesystem::path& file, const std::string& text);
std::string read_file(const std::filesystem::path& file);
// Bytes as lowercase hex digits (what a test compares bytes by).
std::string hex(const std::string& bytes);

// Paths of the build under test (set by tests/CMakeLists.txt).
std::filesystem::path kiln_exe();
std::filesystem::path plugin_dir();       // shipped plugins
std::filesystem::path test_plugin_dir();  // plugins built only for tests
std::filesystem::path source_dir();
// Debian's dataset-fashion-mnist, or the copy KILN_TEST_FASHION_MNIST names
// (bench/gpu.sh sets it to the one it unpacked on a machine without Debian).
std::filesystem::path fashion_mnist_root();

// The Python that checks kiln's files with the readers people use
// (tensorboard, safetensors, torch): set by ./go (KILN_CHECK_PYTHON);
// empty when this build was configured without one.
std::filesystem::path check_python();

// The one line a test prints when it skips for want of check_python().
#define KILN_REQUIRE_CHECK_PYTHON()                                                            \
  do {                                                                                         \
    if (::kiln::test::check_python().empty())                                                  \
      GTEST_SKIP() << "no checking Python (configure with -DKILN_CHECK_PYTHON=..., as ./go "  \
                      "does): file checked by its real reader not run";                       \
  } while (0)

// Python with mlflow (its server and client), or empty: set by ./go test
// (KILN_MLFLOW_PYTHON) in the Debian variant.
std::filesystem::path mlflow_python();
#define KILN_REQUIRE_MLFLOW_PYTHON()                                                            \
  do {                                                                                          \
    if (::kiln::test::mlflow_python().empty())                                                  \
      GTEST_SKIP() << "no Python with mlflow (./go test installs it in the Debian variant; "   \
                      "-DKILN_MLFLOW_PYTHON=...): the mlflow logger against a real server not run"; \
  } while (0)

// A slow check that one variant of CI is enough for (docs/testing.md):
// ./go sets KILN_TEST_VARIANT to "debian" or "wheel"; a test marked for the
// other one skips with one line. Unset (ctest by hand), every test runs.
#define KILN_ONLY_IN_VARIANT(variant)                                                          \
  do {                                                                                         \
    const char* kiln_variant_ = std::getenv("KILN_TEST_VARIANT");                              \
    if (kiln_variant_ != nullptr && *kiln_variant_ != '\0' && std::string(kiln_variant_) != variant) \
      GTEST_SKIP() << "a slow check run by the " variant " variant only (docs/testing.md)";      \
  } while (0)

// Runs `kiln <args...>`.
ProcessResult kiln(const std::vector<std::string>& args, const ProcessOptions& options = {});

}  // namespace kiln::test
