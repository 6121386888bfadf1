// The lifecycle promise of docs/hooks.md, checked with real `kiln fit`
// processes: a failure injected at each hook of each kind must produce
// exactly the documented call sequence, report the first error, and exit 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "manifests.hpp"
#include "support/run_process.hpp"

namespace kiln::test {
namespace {

const std::vector<std::string> kCreateOrder{"callback", "data", "model"};
const std::vector<std::string> kCleanupOrder{"callback", "model", "data"};

std::string id_of(const std::string& label) { return "test.recorder_" + label; }
std::string slot_of(const std::string& label) { return label == "callback" ? "callbacks[0]" : label; }

std::string toml_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", \"" : "\"") + items[i] + "\"";
  return out + "]";
}

// Writes a manifest wiring the recorder plugins; `fail` maps a label to the
// hooks that plugin must fail in.
std::filesystem::path write_manifest(const TempDir& dir, const std::map<std::string, std::vector<std::string>>& fail) {
  const std::string library = (test_plugin_dir() / "libkiln_test_recorder.so").string();
  const std::string log = (dir / "calls.log").string();
  auto plugin = [&](const std::string& label, const std::string& extra) {
    auto it = fail.find(label);
    return "path = \"" + library + "\"\nid = \"" + id_of(label) + "\"\nlog = \"" + log + "\"\nfail_at = " +
           toml_list(it == fail.end() ? std::vector<std::string>{} : it->second) + "\n" + extra + "\n";
  };
  return write_run_manifest(dir, {.name = "lifecycle",
                                  .run = "threads = 1\n",
                                  .model = plugin("model", "features = 4"),
                                  .data = plugin("data", "size = 16\nfeatures = 4"),
                                  .trainer = trainer_keys(1, 4, "test_after_fit = true\n"),
                                  .optimizer = "",
                                  .extra = "\n[[callbacks]]\n" + plugin("callback", "")});
}

// The lifecycle lines of the call log (per-step hooks are left out).
std::vector<std::string> lifecycle_calls(const std::filesystem::path& log) {
  std::vector<std::string> out;
  std::istringstream in(read_file(log));
  for (std::string line; std::getline(in, line);) {
    const std::string hook = line.substr(line.find(':') + 1);
    if (hook == "create" || hook == "prepare_data" || hook == "setup" || hook == "destroy" ||
        hook.rfind("teardown(", 0) == 0 || hook.rfind("on_exception(", 0) == 0)
      out.push_back(line);
  }
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The sequence docs/hooks.md promises when `label` fails in `hook`.
std::vector<std::string> expected_calls(const std::string& label, const std::string& hook) {
  std::vector<std::string> seq, created, setup_entered, torn_down;
  for (const auto& p : kCreateOrder) {
    seq.push_back(p + ":create");
    if (hook == "create" && p == label) break;  // a failed create leaves no instance
    created.push_back(p);
  }
  if (hook != "create") {
    seq.push_back("data:prepare_data");
    if (!(hook == "prepare_data" && label == "data")) {
      for (const auto& p : kCreateOrder) {
        seq.push_back(p + ":setup");
        setup_entered.push_back(p);  // teardown is owed even when setup itself failed
        if (hook == "setup" && p == label) break;
      }
    }
  }
  if (hook == "teardown") {  // the success-path teardown fails
    for (const auto& p : kCleanupOrder) {
      seq.push_back(p + ":teardown(failed=0)");
      torn_down.push_back(p);
      if (p == label) break;
    }
  }
  for (const auto& p : kCleanupOrder)
    if (contains(created, p)) seq.push_back(p + ":on_exception(" + id_of(label) + "/" + hook + ")");
  for (const auto& p : kCleanupOrder)
    if (contains(setup_entered, p) && !contains(torn_down, p)) seq.push_back(p + ":teardown(failed=1)");
  for (const auto& p : kCleanupOrder)
    if (contains(created, p)) seq.push_back(p + ":destroy");
  return seq;
}

struct Injection {
  std::string label;
  std::string hook;
};

void PrintTo(const Injection& i, std::ostream* out) { *out << i.label << " " << i.hook; }

std::string name_of(const testing::TestParamInfo<Injection>& info) {
  return info.param.label + "_" + info.param.hook;
}

class FailureAtHook : public testing::TestWithParam<Injection> {};

TEST_P(FailureAtHook, RunsTheDocumentedCleanupSequence) {
  const auto& [label, hook] = GetParam();
  TempDir dir;
  const auto manifest = write_manifest(dir, {{label, {hook}}});
  const ProcessResult r = kiln({"fit", manifest.string()}, {.timeout = std::chrono::seconds(120)});
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // The first error is the one reported: plugin, slot, hook, rank, message.
  EXPECT_NE(r.output.find("kiln: error: plugin '" + id_of(label) + "' [" + slot_of(label) + "] failed in " + hook +
                          " on rank 0: injected failure in " + hook),
            std::string::npos)
      << r.output;
  EXPECT_EQ(lifecycle_calls(dir / "calls.log"), expected_calls(label, hook)) << r.output;
}

std::vector<Injection> injections() {
  std::vector<Injection> out;
  for (const char* hook : {"create", "setup", "teardown", "on_fit_start", "on_train_epoch_start", "on_train_batch_end",
                           "on_validation_start", "on_validation_end", "on_train_epoch_end", "on_fit_end",
                           "on_test_end"})
    out.push_back({"callback", hook});
  for (const char* hook : {"create", "prepare_data", "setup", "teardown", "length", "get_batch"})
    out.push_back({"data", hook});
  for (const char* hook :
       {"create", "setup", "teardown", "parameters", "training_step", "validation_step", "test_step"})
    out.push_back({"model", hook});
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryHookOfEveryKind, FailureAtHook, testing::ValuesIn(injections()), name_of);

TEST(Lifecycle, SuccessfulRunCallsEachHookOnceInOrder) {
  TempDir dir;
  const auto manifest = write_manifest(dir, {});
  const ProcessResult r = kiln({"fit", manifest.string()}, {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> expected{
      "callback:create",         "data:create",         "model:create",         "data:prepare_data",
      "callback:setup",          "data:setup",          "model:setup",          "callback:teardown(failed=0)",
      "model:teardown(failed=0)", "data:teardown(failed=0)", "callback:destroy", "model:destroy",
      "data:destroy"};
  EXPECT_EQ(lifecycle_calls(dir / "calls.log"), expected);
}

TEST(Lifecycle, FailingCleanupHooksDoNotStopTheOthers) {
  TempDir dir;
  // The model fails first; then the callback fails in both cleanup hooks and
  // the data module in on_exception. Everyone still gets every call, and the
  // model's error is the one reported.
  const auto manifest = write_manifest(dir, {{"model", {"training_step"}},
                                             {"callback", {"on_exception", "teardown"}},
                                             {"data", {"on_exception"}}});
  const ProcessResult r = kiln({"fit", manifest.string()}, {.timeout = std::chrono::seconds(120)});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("kiln: error: plugin 'test.recorder_model' [model] failed in training_step"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("injected failure in on_exception"), std::string::npos) << r.output;  // logged, not fatal
  EXPECT_EQ(lifecycle_calls(dir / "calls.log"), expected_calls("model", "training_step")) << r.output;
}

TEST(Lifecycle, SigintRunsCleanupAndExits130) {
  TempDir dir;
  auto manifest = write_manifest(dir, {});
  const std::string kiln_path = kiln_exe().string();
  // The signal is sent once a training step ran (bounded by the same scale
  // as every process timeout: a slow sanitizer build still gets there).
  const int tries = static_cast<int>(120 * timeout_scale() / 0.05);
  const std::string script = "\"" + kiln_path + "\" fit \"" + manifest.string() +
                             "\" --set trainer.max_epochs=100000 & pid=$!; "
                             "for i in $(seq 1 " + std::to_string(tries) + "); do grep -q training_step \"" +
                             (dir / "calls.log").string() +
                             "\" 2>/dev/null && break; sleep 0.05; done; kill -INT $pid; wait $pid";
  const ProcessResult r = run_process({"/bin/sh", "-c", script}, {.timeout = std::chrono::seconds(240)});
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(r.output.find("interrupted by SIGINT"), std::string::npos) << r.output;
  const auto calls = lifecycle_calls(dir / "calls.log");
  ASSERT_GE(calls.size(), 9u) << r.output;
  const std::vector<std::string> tail(calls.end() - 9, calls.end());
  const std::vector<std::string> expected{
      "callback:on_exception(/)", "model:on_exception(/)",      "data:on_exception(/)",
      "callback:teardown(failed=1)", "model:teardown(failed=1)", "data:teardown(failed=1)",
      "callback:destroy",          "model:destroy",            "data:destroy"};
  EXPECT_EQ(tail, expected) << r.output;
}

}  // namespace
}  // namespace kiln::test
