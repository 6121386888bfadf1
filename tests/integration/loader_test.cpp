// Every loader refusal, with a real broken plugin: one clear line, exit code
// 2, and nothing written to disk (the run directory is never created).
#include <gtest/gtest.h>

#include "manifests.hpp"
#include "support/run_process.hpp"

namespace kiln::test {
namespace {

std::string stub(const std::string& name) { return (test_plugin_dir() / ("libkiln_stub_" + name + ".so")).string(); }

// A valid run whose first callback is `callback_path`; extra TOML appended.
std::filesystem::path manifest_with(const TempDir& dir, const std::string& model_path,
                                    const std::vector<std::string>& callbacks) {
  std::string tables;
  for (const auto& c : callbacks) tables += "[[callbacks]]\npath = \"" + c + "\"\n";
  return write_run_manifest(dir, {.name = "loader",
                                  .run = "",
                                  .model = "path = \"" + model_path + "\"\n",
                                  .data = "path = \"kiln_synthetic\"\n",
                                  .trainer = "max_epochs = 1\nprogress = \"none\"\n",
                                  .optimizer = "",
                                  .extra = tables});
}

struct Refusal {
  std::string name;
  std::function<std::string(const TempDir&)> model_path;  // what [model] points at
  std::vector<std::string> callbacks;
  std::string expected;  // part of the one-line message
};

void PrintTo(const Refusal& r, std::ostream* out) { *out << r.name; }

class LoaderRefuses : public testing::TestWithParam<Refusal> {};

TEST_P(LoaderRefuses, WithOneLineAndExitCode2) {
  const Refusal& c = GetParam();
  TempDir dir;
  const auto manifest = manifest_with(dir, c.model_path(dir), c.callbacks);
  const ProcessResult r = kiln({"fit", manifest.string()}, {.timeout = std::chrono::seconds(60)});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const auto line_start = r.output.find("kiln: error: ");
  ASSERT_NE(line_start, std::string::npos) << r.output;
  const std::string line = r.output.substr(line_start, r.output.find('\n', line_start) - line_start);
  EXPECT_NE(line.find(c.expected), std::string::npos) << line;
  EXPECT_NE(line.find("run.toml ["), std::string::npos) << "the message names the manifest slot: " << line;
  EXPECT_FALSE(std::filesystem::exists(dir / "run")) << "a refused run must not touch the disk";
}

const std::string mlp = (plugin_dir() / "libkiln_mlp.so").string();

INSTANTIATE_TEST_SUITE_P(
    EachDefect, LoaderRefuses,
    testing::Values(
        Refusal{"missing_file", [](const TempDir& d) { return (d / "nope.so").string(); }, {}, "plugin file not found"},
        Refusal{"not_a_shared_object",
                [](const TempDir& d) {
                  write_file(d / "text.so", "this is not ELF\n");
                  return (d / "text.so").string();
                },
                {},
                "not a shared object"},
        Refusal{"no_entry_symbol", [](const TempDir&) { return mlp; }, {stub("no_entry")}, "exports no 'kiln_plugin_entry'"},
        Refusal{"abi_major_mismatch", [](const TempDir&) { return mlp; }, {stub("abi_major")}, "built for kiln ABI 99."},
        Refusal{"struct_size_too_small", [](const TempDir&) { return mlp; }, {stub("small_struct")},
                "kiln_entry.struct_size is 8, smaller than ABI 1.0's"},
        Refusal{"other_libtorch", [](const TempDir&) { return mlp; }, {stub("other_torch")},
                "was built against LibTorch 0.1, but this kiln uses LibTorch"},
        Refusal{"wrong_kind", [](const TempDir&) { return (plugin_dir() / "libkiln_synthetic.so").string(); }, {},
                "[model] needs a model, but 'kiln.synthetic' is a data module"},
        Refusal{"duplicate_id", [](const TempDir&) { return mlp; }, {stub("ok"), stub("ok_twin")},
                "plugin id 'test.c_stub' is already used by [callbacks[0]]"}),
    [](const testing::TestParamInfo<Refusal>& info) { return info.param.name; });

TEST(Loader, AcceptsAPluginWrittenInPlainC) {
  TempDir dir;
  const auto manifest = manifest_with(dir, mlp, {stub("ok")});
  const ProcessResult r = kiln({"inspect", manifest.string()}, {.timeout = std::chrono::seconds(60)});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test.c_stub"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("LibTorch:      none"), std::string::npos) << r.output;
}

// LibTorch 2.11's CUDA wheel exports from libtorch.so its own copies of parts
// of std::filesystem, and its remove_all jumps to address 0: a symbol binds to
// the first loaded library that defines it, so the C++ runtime must load
// before LibTorch, for kiln and for every plugin it opens (CMakeLists.txt).
// The dynamic loader's own list (what ldd prints) gives the load order.
TEST(Loader, TheCxxRuntimeLoadsBeforeLibTorch) {
  const ProcessResult r = run_process({kiln_exe().string()}, {.env = {{"LD_TRACE_LOADED_OBJECTS", "1"}},
                                                              .timeout = std::chrono::seconds(60)});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t cxx = r.output.find("libstdc++.so");
  const size_t torch = std::min(r.output.find("libtorch.so"), r.output.find("libtorch_cpu.so"));
  ASSERT_NE(cxx, std::string::npos) << r.output;
  ASSERT_NE(torch, std::string::npos) << r.output;
  EXPECT_LT(cxx, torch) << "libtorch.so loads before the C++ runtime:\n" << r.output;
}

}  // namespace
}  // namespace kiln::test
