// The run's hyperparameters for TensorBoard's HPARAMS tab: the manifest
// flattened to dotted keys (config/hparams), the hparams plugin's session
// start and end events against the bytes protobuf itself writes
// (TensorBoard's plugin_data_pb2 and event_pb2, serialised once and pasted
// here), and the TensorBoard logger writing the start once per file. The
// real reader (TensorBoard's hparams backend) checks a real run's file in
// tests/integration/logging_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <ostream>
#include <sstream>

#include "config/manifest.hpp"
#include "config/hparams.hpp"
#include "config/manifest.hpp"
#include "metrics/loggers.hpp"
#include "metrics/tensorboard_logger.hpp"
#include "metrics/tfevents.hpp"
#include "support/run_process.hpp"
#include "util/errors.hpp"

namespace kiln {
namespace {

using test::hex;
using test::read_file;

}  // namespace

// For gtest's messages.
void PrintTo(const HParam& h, std::ostream* os) {
  *os << h.name << " = ";
  switch (h.kind) {
    case HParam::Kind::number: *os << h.number; break;
    case HParam::Kind::string: *os << '"' << h.string << '"'; break;
    case HParam::Kind::boolean: *os << (h.boolean ? "true" : "false"); break;
  }
}

namespace {

TEST(HParams, FlattenTheManifestToDottedKeysInKeyOrder) {
  const auto h = flatten_manifest_hparams(R"([run]
name = "lr_0.003"
seed = 0

[model]
path = "kiln_mlp"
hidden = [512, 256]
dropout = 0.0
nested = { width = 3, kind = "x" }

[data]
root = "/data/fmnist"
normalize = true

[trainer]
max_epochs = 5
max_time = "00:02:00:00"
limit_train_batches = 0.25

[optimizer]
name = "adamw"
lr = 3e-3
[[optimizer.groups]]
match = ["*.bias", "*norm*"]
weight_decay = 0.0

[[callbacks]]
path = "kiln_early_stopping"
monitor = "val/loss"
[[callbacks]]
path = "./libmine.so"
)");
  const std::vector<HParam> expected{
      HParam::of_string("callbacks.0.monitor", "val/loss"),
      HParam::of_string("callbacks.0.path", "kiln_early_stopping"),
      HParam::of_string("callbacks.1.path", "./libmine.so"),
      HParam::of_bool("data.normalize", true),
      HParam::of_string("data.root", "/data/fmnist"),
      HParam::of_number("model.dropout", 0.0),
      HParam::of_string("model.hidden", "[512, 256]"),  // an array: its TOML text
      HParam::of_string("model.nested.kind", "x"),      // an inline table is a table
      HParam::of_number("model.nested.width", 3),
      HParam::of_string("model.path", "kiln_mlp"),
      HParam::of_string("optimizer.groups.0.match", "[\"*.bias\", \"*norm*\"]"),
      HParam::of_number("optimizer.groups.0.weight_decay", 0.0),
      HParam::of_number("optimizer.lr", 0.003),
      HParam::of_string("optimizer.name", "adamw"),
      HParam::of_string("run.name", "lr_0.003"),
      HParam::of_number("run.seed", 0),
      HParam::of_number("trainer.limit_train_batches", 0.25),
      HParam::of_number("trainer.max_epochs", 5),
      HParam::of_string("trainer.max_time", "00:02:00:00"),
  };
  // Each table's keys in order (toml++ keeps them sorted: optimizer.groups
  // before optimizer.lr), the tables in order.
  EXPECT_EQ(h, expected);
}

TEST(HParams, ValuesTensorBoardCannotHoldAsNumbersAreText) {
  const auto h = flatten_manifest_hparams(
      "a = nan\nb = -inf\nc = 1979-05-27T07:32:00Z\nd = [1.5, 0.1, -2, true, \"q\\\"\", [1, 2], {k = 1}]\ne = []\n"
      "f = 9007199254740993\n");
  ASSERT_EQ(h.size(), 6u);
  EXPECT_EQ(h[0], HParam::of_string("a", "nan"));
  EXPECT_EQ(h[1], HParam::of_string("b", "-inf"));
  EXPECT_EQ(h[2], HParam::of_string("c", "1979-05-27T07:32:00Z"));
  EXPECT_EQ(h[3], HParam::of_string("d", "[1.5, 0.1, -2, true, \"q\\\"\", [1, 2], {k = 1}]"));
  EXPECT_EQ(h[4], HParam::of_string("e", "[]"));
  EXPECT_EQ(h[5], HParam::of_string("f", "9007199254740993"));  // not a double's 9007199254740992
  const auto edge = flatten_manifest_hparams("g = 9007199254740992\nh = -9007199254740992\ni = -9007199254740993\n");
  ASSERT_EQ(edge.size(), 3u);
  EXPECT_EQ(edge[0], HParam::of_number("g", 9007199254740992.0));
  EXPECT_EQ(edge[1], HParam::of_number("h", -9007199254740992.0));
  EXPECT_EQ(edge[2], HParam::of_string("i", "-9007199254740993"));
  EXPECT_THROW(flatten_manifest_hparams("[model\n"), InputError);
}

TEST(HParams, ALoadedManifestsTextHasItsOverridesAndNotItsDefaults) {
  test::TempDir dir("kiln-hparams");
  for (const char* name : {"libkiln_mlp.so", "libkiln_synthetic.so"}) std::ofstream(dir.path() / name).flush();
  PluginSearchPath search;
  search.dirs = {dir.path()};
  const auto file = dir.path() / "run.toml";
  std::ofstream(file) << "[model]\npath = \"kiln_mlp\"\nhidden = [32]\n\n[data]\npath = \"kiln_synthetic\"\n"
                         "features = 32\n\n[optimizer]\nlr = 0.01\n";
  const Manifest m = load_manifest(file, {"optimizer.lr=0.003", "run.name=lr_0.003", "trainer.max_epochs=1"}, search);
  const auto h = flatten_manifest_hparams(m.text);
  auto find = [&](const std::string& name) -> const HParam* {
    for (const auto& p : h)
      if (p.name == name) return &p;
    return nullptr;
  };
  ASSERT_TRUE(find("optimizer.lr"));
  EXPECT_EQ(*find("optimizer.lr"), HParam::of_number("optimizer.lr", 0.003));
  ASSERT_TRUE(find("run.name"));
  EXPECT_EQ(find("run.name")->string, "lr_0.003");
  ASSERT_TRUE(find("trainer.max_epochs"));
  EXPECT_EQ(find("trainer.max_epochs")->number, 1);
  ASSERT_TRUE(find("model.hidden"));
  EXPECT_EQ(find("model.hidden")->string, "[32]");
  ASSERT_TRUE(find("data.features"));
  EXPECT_EQ(find("data.features")->number, 32);
  EXPECT_FALSE(find("trainer.batch_size"));  // a default the manifest does not write
}

TEST(HParams, SessionEventsAreTheBytesProtobufWrites) {
  // HParamsPluginData(session_start_info=SessionStartInfo(hparams={...}, start_time_secs=1.5)) in
  // Summary.Value(tag="_hparams_/session_start_info", metadata=create_summary_metadata(...),
  // tensor=NULL_TENSOR), in Event(wall_time=2.0, step=0), one hparam of each kind; a oneof
  // value is written even when it holds 0, false or "".
  EXPECT_EQ(hex(hparams_start_event(2.0, {HParam::of_number("optimizer.lr", 0.003)}, 1.5)),
            "0900000000000000402a5d0a5b0a1c5f68706172616d735f2f73657373696f6e5f73746172745f696e666f420608011202120"
            "04a330a310a0768706172616d7312261a240a190a0c6f7074696d697a65722e6c72120911fa7e6abc7493683f29000000000000"
            "f83f");
  EXPECT_EQ(hex(hparams_start_event(2.0, {HParam::of_number("z", 0.0)}, 1.5)),
            "0900000000000000402a520a500a1c5f68706172616d735f2f73657373696f6e5f73746172745f696e666f420608011202120"
            "04a280a260a0768706172616d73121b1a190a0e0a017a120911000000000000000029000000000000f83f");
  EXPECT_EQ(hex(hparams_start_event(2.0, {HParam::of_bool("trainer.shuffle", false)}, 1.5)),
            "0900000000000000402a590a570a1c5f68706172616d735f2f73657373696f6e5f73746172745f696e666f420608011202120"
            "04a2f0a2d0a0768706172616d7312221a200a150a0f747261696e65722e73687566666c651202200029000000000000f83f");
  EXPECT_EQ(hex(hparams_start_event(2.0, {HParam::of_string("model.hidden", "[512, 256]")}, 1.5)),
            "0900000000000000402a600a5e0a1c5f68706172616d735f2f73657373696f6e5f73746172745f696e666f420608011202120"
            "04a360a340a0768706172616d7312291a270a1c0a0c6d6f64656c2e68696464656e120c1a0a5b3531322c203235365d290000"
            "00000000f83f");
  EXPECT_EQ(hex(hparams_start_event(2.0, {HParam::of_string("s", "")}, 1.5)),
            "0900000000000000402a4b0a490a1c5f68706172616d735f2f73657373696f6e5f73746172745f696e666f420608011202120"
            "04a210a1f0a0768706172616d7312141a120a070a017312021a0029000000000000f83f");
  // SessionEndInfo(status=STATUS_SUCCESS or STATUS_FAILURE, end_time_secs=3.0) at the last step.
  EXPECT_EQ(hex(hparams_end_event(3.0, 96, true, 3.0)),
            "09000000000000084010602a420a400a1a5f68706172616d735f2f73657373696f6e5f656e645f696e666f4206080112021200"
            "4a1a0a180a0768706172616d73120d220b0801110000000000000840");
  EXPECT_EQ(hex(hparams_end_event(3.0, 7, false, 3.0)),
            "09000000000000084010072a420a400a1a5f68706172616d735f2f73657373696f6e5f656e645f696e666f4206080112021200"
            "4a1a0a180a0768706172616d73120d220b0802110000000000000840");
}

// The events of the file, as "version", "start", "end" or "scalars@<step>".
std::vector<std::string> event_kinds(const std::filesystem::path& file) {
  std::vector<std::string> out;
  for (const std::string& e : read_tfrecords(read_file(file))) {
    if (e.find("brain.Event:2") != std::string::npos)
      out.push_back("version");
    else if (e.find("_hparams_/session_start_info") != std::string::npos)
      out.push_back("start");
    else if (e.find("_hparams_/session_end_info") != std::string::npos)
      out.push_back("end");
    else
      out.push_back("scalars");
  }
  return out;
}

TEST(HParams, TheTensorBoardLoggerWritesTheStartOncePerFileAndTheEndAtFinish) {
  test::TempDir dir("kiln-hparams-logger");
  const auto file = dir.path() / TensorBoardLogger::kFileName;
  const std::vector<HParam> hparams{HParam::of_number("optimizer.lr", 0.003)};
  std::map<std::string, std::string> state;
  {
    Loggers loggers(LoggingConfig{{"tensorboard"}}, dir.path(), &hparams);
    loggers.finish(true);  // nothing logged, nothing open: no file
    EXPECT_FALSE(std::filesystem::exists(file));
    loggers.open();
    loggers.log(LogRow{LogRow::Kind::step, 0, 5, {{"train/loss_step", 1.0}}});
    state = loggers.states();  // a checkpoint
    loggers.log(LogRow{LogRow::Kind::epoch, 0, 8, {{"val/loss", 0.5}}});
    loggers.finish(false);  // killed, say: the run failed
  }
  EXPECT_EQ(event_kinds(file), (std::vector<std::string>{"version", "start", "scalars", "scalars", "end"}));
  {
    // At the last row's step (Event.step = 2: 10 08), STATUS_FAILURE (SessionEndInfo: 08 02).
    const std::string end = read_tfrecords(read_file(file)).back();
    EXPECT_EQ(end.substr(9, 2), std::string("\x10\x08", 2));
    EXPECT_NE(end.find(std::string("\x0b\x08\x02\x11", 4)), std::string::npos);
  }
  {
    // Resumed: the file is cut back to the checkpoint, and continued without a second start.
    const std::vector<HParam> resumed{HParam::of_number("optimizer.lr", 0.1)};
    Loggers loggers(LoggingConfig{{"tensorboard"}}, dir.path(), &resumed);
    loggers.restore(state);
    loggers.open();
    loggers.log(LogRow{LogRow::Kind::epoch, 0, 8, {{"val/loss", 0.5}}});
    loggers.finish(true);
  }
  EXPECT_EQ(event_kinds(file), (std::vector<std::string>{"version", "start", "scalars", "scalars", "end"}));
  const auto events = read_tfrecords(read_file(file));
  // The first run's hparams (0.003), not the resumed run's (0.1).
  auto number_value = [](double v) {  // Value.number_value = 2, wire type 1: 11 <8 bytes>
    std::string out = "\x11";
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
    return out;
  };
  EXPECT_NE(events[1].find(number_value(0.003)), std::string::npos);
  EXPECT_EQ(events[1].find(number_value(0.1)), std::string::npos);
  // STATUS_SUCCESS (08 01) in the end the resumed run wrote.
  EXPECT_NE(events[4].find(std::string("\x0b\x08\x01\x11", 4)), std::string::npos);
  {
    // Without hparams, the file is as before: no hparams events.
    test::TempDir plain("kiln-hparams-plain");
    Loggers loggers(LoggingConfig{{"tensorboard", "jsonl"}}, plain.path());
    loggers.open();
    loggers.log(LogRow{LogRow::Kind::epoch, 0, 8, {{"val/loss", 0.5}}});
    loggers.finish(true);
    EXPECT_EQ(event_kinds(plain.path() / TensorBoardLogger::kFileName),
              (std::vector<std::string>{"version", "scalars"}));
  }
}

}  // namespace
}  // namespace kiln
