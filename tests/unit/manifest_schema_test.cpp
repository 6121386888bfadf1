// Unit tests for the manifest schema (runtime/config/manifest_schema.cpp):
// each declared key is read, typed and bounded as declared, and
// docs/manifest.md lists every key. The messages themselves are pinned in
// manifest_test.cpp.
#include "config/manifest_schema.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config/manifest.hpp"
#include "config/manifest_reference.hpp"
#include "support/run_process.hpp"
#include "util/errors.hpp"

namespace fs = std::filesystem;

namespace kiln {
namespace {

const char* const kMinimal = "[model]\npath = \"kiln_mlp\"\n\n[data]\npath = \"kiln_synthetic\"\n";

class SchemaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kiln_schema_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    for (const char* plugin : {"libkiln_mlp.so", "libkiln_synthetic.so"}) std::ofstream(root_ / plugin).flush();
    search_.dirs = {root_};
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  Manifest load(const std::string& text, const std::vector<std::string>& overrides = {}) {
    std::ofstream(root_ / "run.toml") << text;
    return load_manifest(root_ / "run.toml", overrides, search_);
  }

  // The InputError message, or "" when the manifest is accepted.
  std::string error(const std::string& text, const std::vector<std::string>& overrides = {}) {
    try {
      load(text, overrides);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }

  static std::string assignment(const KeySchema& k, const std::string& value) {
    // An [averaging] key needs a kind beside it; "none" keeps the table off,
    // so the key's own bounds are what is checked.
    if (k.table == "averaging" && k.key != "kind")
      return "[averaging]\nkind = \"none\"\n" + k.key + " = " + value + "\n" + kMinimal;
    if (!k.in_array) return "[" + k.table + "]\n" + k.key + " = " + value + "\n" + kMinimal;
    // A group key, under the first optimizer that reads it, in an entry that matches.
    std::string optimizer = "adam";
    for (std::size_t i = 0; i < option_count<OptimizerName>(); ++i) {
      const auto name = static_cast<OptimizerName>(i);
      const auto& keys = optimizer_option_keys(name);
      if (std::find(keys.begin(), keys.end(), k.key) != keys.end()) {
        optimizer = option_name(name);
        break;
      }
    }
    return "[optimizer]\nname = \"" + optimizer + "\"\nmomentum = 0.9\n\n[[" + k.table + "]]\n" +
           (k.required ? "" : "match = [\"*\"]\n") + k.key + " = " + value + "\n" + kMinimal;
  }

  fs::path root_;
  PluginSearchPath search_;
};

std::vector<const KeySchema*> all_keys() {
  std::vector<const KeySchema*> keys;
  for (const auto& table : manifest_schema())
    for (const auto& k : table.keys) keys.push_back(&k);
  return keys;
}

TEST(Schema, EveryKeyIsDocumentedAndBound) {
  for (const KeySchema* k : all_keys()) {
    EXPECT_FALSE(k->doc.empty()) << k->dotted();
    EXPECT_EQ(k->doc.find('\n'), std::string::npos) << k->dotted();
    EXPECT_TRUE(k->store) << k->dotted();
    EXPECT_TRUE(k->show) << k->dotted();
    EXPECT_EQ(find_key_schema(k->table, k->key), k);
    if (k->int_min || k->int_max)
      EXPECT_TRUE(k->kind == ValueKind::integer || k->kind == ValueKind::count_or_auto) << k->dotted();
    if (k->min || k->max) EXPECT_EQ(k->kind, ValueKind::number) << k->dotted();
    if (k->kind == ValueKind::choice) EXPECT_GE(k->choices.size(), 2u) << k->dotted();
  }
}

// The schema's closed sets are config/options.hpp's names.
TEST(Schema, ChoicesAreTheOptionNames) {
  EXPECT_EQ(find_key_schema("optimizer", "name")->choices, option_names<OptimizerName>());
  EXPECT_EQ(find_key_schema("scheduler", "name")->choices, option_names<SchedulerName>());
  EXPECT_EQ(find_key_schema("checkpoint", "preempt_signal")->choices, option_names<PreemptSignal>());
  EXPECT_EQ(find_key_schema("trainer", "progress")->choices,
            (std::vector<std::string>{"auto", "bar", "lines", "none"}));
}

// A key's default, written out, reads back as the default.
TEST_F(SchemaTest, EveryDefaultWrittenOutIsAcceptedAndReadBack) {
  const Manifest defaults;
  for (const KeySchema* k : all_keys()) {
    if (!k->default_text.empty()) continue;  // depends on other keys (directories, enabled)
    const std::string toml = k->show(defaults);
    Manifest m;
    ASSERT_NO_THROW(m = load(assignment(*k, toml))) << k->dotted() << " = " << toml << ": " << error(assignment(*k, toml));
    EXPECT_EQ(k->show(m), toml) << k->dotted();
  }
}

TEST_F(SchemaTest, EveryKeyRefusesAValueOfTheWrongType) {
  for (const KeySchema* k : all_keys()) {
    // A table fits no key but a table of strings, which an integer does not fit.
    const bool table = k->kind == ValueKind::string_table;
    const std::string message = error(assignment(*k, table ? "1" : "{ a = 1 }"));
    EXPECT_NE(message.find(k->dotted() + " must be "), std::string::npos) << message;
    EXPECT_NE(message.find(table ? ", not an integer" : ", not a table"), std::string::npos) << message;
  }
}

TEST_F(SchemaTest, EveryBoundIsEnforcedAtItsEdge) {
  for (const KeySchema* k : all_keys()) {
    // max_epochs = -1 is allowed alone, and refused with max_steps = -1 too.
    const std::vector<std::string> limit = {k->key == "max_steps" ? "trainer.max_epochs=1" : "trainer.max_steps=1"};
    auto refused = [&](const std::string& value) { return error(assignment(*k, value), limit); };
    if (k->int_min) {
      EXPECT_EQ(refused(std::to_string(*k->int_min)), "") << k->dotted();
      EXPECT_NE(refused(std::to_string(*k->int_min - 1)).find(k->dotted() + " must be "), std::string::npos);
    }
    if (k->int_max) {
      EXPECT_EQ(refused(std::to_string(*k->int_max)), "") << k->dotted();
      EXPECT_NE(refused(std::to_string(*k->int_max + 1)).find(k->dotted() + " must be between "), std::string::npos);
    }
    if (k->min) {
      const std::string edge = refused(std::to_string(*k->min));
      EXPECT_EQ(edge.empty(), !k->min_exclusive) << k->dotted() << ": " << edge;
      EXPECT_NE(refused(std::to_string(*k->min - 1)).find(k->dotted() + " must be "), std::string::npos);
    }
    if (k->max) {
      EXPECT_EQ(refused(std::to_string(*k->max)), "") << k->dotted();
      EXPECT_NE(refused(std::to_string(*k->max + 1)).find(k->dotted() + " must be between "), std::string::npos);
    }
  }
}

TEST_F(SchemaTest, EveryChoiceIsAcceptedAndNothingElse) {
  for (const KeySchema* k : all_keys()) {
    if (k->kind != ValueKind::choice) continue;
    for (const auto& choice : k->choices) {
      if (k->table == "distributed" && choice == "nccl") continue;  // needs a CUDA device
      const Manifest m = load(assignment(*k, "\"" + choice + "\""));
      EXPECT_EQ(k->show(m), "\"" + choice + "\"");
    }
    EXPECT_NE(error(assignment(*k, "\"no-such-option\"")).find(k->dotted() + " must be '"), std::string::npos);
  }
}

// --set: a string key takes the text even when it reads as a number; other
// keys take the TOML value.
TEST_F(SchemaTest, SetTypesTheValueByTheSchema) {
  for (const KeySchema* k : all_keys()) {
    const std::string message = error(kMinimal, {k->dotted() + "=2024"});
    if (k->takes_string()) {
      EXPECT_EQ(message.find("must be a string"), std::string::npos) << message;
    } else if (k->kind == ValueKind::integer || k->kind == ValueKind::number) {
      EXPECT_EQ(message.find("must be an integer"), std::string::npos) << message;
      EXPECT_EQ(message.find("must be a number"), std::string::npos) << message;
    }
  }
  EXPECT_EQ(load(kMinimal, {"checkpoint.monitor=2024"}).checkpoint.monitor, "2024");
  EXPECT_EQ(error(kMinimal, {"scheduler.interval=1"}),
            "--set scheduler.interval=1: scheduler.interval must be 'epoch' or 'step', not '1'");
}

TEST(ManifestReference, ListsEveryKeyOfTheSchema) {
  const std::string generated = manifest_reference_markdown();
  std::ifstream committed_file(test::source_dir() / "docs" / "manifest.md");
  ASSERT_TRUE(committed_file) << "docs/manifest.md is missing: build/bin/kiln manifest-reference > docs/manifest.md";
  std::stringstream committed;
  committed << committed_file.rdbuf();
  for (const KeySchema* k : all_keys()) {
    const std::string cell = "| `" + k->dotted() + "` |";
    EXPECT_NE(generated.find(cell), std::string::npos) << k->dotted();
    EXPECT_NE(committed.str().find(cell), std::string::npos)
        << k->dotted() << " is not in docs/manifest.md: build/bin/kiln manifest-reference > docs/manifest.md";
    if (k->kind == ValueKind::choice)
      for (const auto& choice : k->choices) EXPECT_NE(generated.find("`\"" + choice + "\"`"), std::string::npos);
  }
  for (const KeySchema& k : plugin_host_keys()) EXPECT_NE(generated.find("| `" + k.key + "` |"), std::string::npos);
}

}  // namespace
}  // namespace kiln
