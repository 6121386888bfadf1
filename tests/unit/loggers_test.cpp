// metrics/ loggers: CRC-32C and the TFRecord framing against known vectors,
// the hand-written protobuf encoding against bytes produced by protobuf
// itself (TensorBoard's event_pb2, serialised once and pasted here), JSONL
// text, and the appending files' resume rule (cut back to the checkpoint's
// length). The real reader checks kiln's files in
// tests/integration/logging_test.cpp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "metrics/crc32c.hpp"
#include "metrics/csv_log.hpp"
#include "metrics/jsonl_logger.hpp"
#include "metrics/mlflow_spool.hpp"
#include "config/manifest.hpp"
#include "config/logger_registry.hpp"
#include "metrics/loggers.hpp"
#include "metrics/protobuf_writer.hpp"
#include "metrics/tfevents.hpp"
#include "support/run_process.hpp"
#include "util/append_file.hpp"

namespace kiln {
namespace {

using test::hex;

std::string read(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Crc32c, MatchesTheKnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC catalogue's check value
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);  // RFC 3720 B.4: 32 bytes of 0xff
  // TensorFlow's mask (tensorboard.compat...pywrap_tensorflow.masked_crc32c).
  EXPECT_EQ(masked_crc32c("123456789"), 0xc78ab0e5u);
}

TEST(ProtobufWriter, EncodesVarintsAsProtobufDoes) {
  auto varint = [](uint64_t v) {
    ProtobufWriter w;
    w.varint(v);
    return hex(w.bytes());
  };
  EXPECT_EQ(varint(0), "00");
  EXPECT_EQ(varint(1), "01");
  EXPECT_EQ(varint(127), "7f");
  EXPECT_EQ(varint(128), "8001");
  EXPECT_EQ(varint(300), "ac02");  // the protobuf encoding guide's example
  EXPECT_EQ(varint(UINT64_MAX), "ffffffffffffffffff01");
  ProtobufWriter w;
  w.int64_field(1, 150);  // the guide's first message: 08 96 01
  EXPECT_EQ(hex(w.bytes()), "089601");
  ProtobufWriter negative;
  negative.int64_field(2, -1);  // ten bytes, as protobuf writes a negative int64
  EXPECT_EQ(hex(negative.bytes()), "10ffffffffffffffffff01");
  ProtobufWriter fields;
  fields.bytes_field(2, "testing");  // the guide's string example: 12 07 74 65 73 74 69 6e 67
  fields.float_field(2, 0.25f);
  fields.double_field(1, 1.5);
  EXPECT_EQ(hex(fields.bytes()), "120774657374696e67150000803e09000000000000f83f");
}

TEST(TfEvents, EventsAreTheBytesProtobufWrites) {
  // event_pb2.Event(wall_time=1.5, step=0, file_version="brain.Event:2").SerializeToString()
  EXPECT_EQ(hex(file_version_event(1.5)), "09000000000000f83f1a0d627261696e2e4576656e743a32");
  // Event(wall_time=2.0, step=300, summary=Summary(value=[Value(tag="a/b", simple_value=0.25),
  //                                                       Value(tag="lr", simple_value=-1.0)]))
  EXPECT_EQ(hex(scalars_event(2.0, 300, {{"a/b", 0.25f}, {"lr", -1.0f}})),
            "09000000000000004010ac022a170a0a0a03612f62150000803e0a090a026c7215000080bf");
}

TEST(TfEvents, RecordsAreFramedWithMaskedCrcs) {
  // uint64 length, masked CRC of the length, the data, masked CRC of the data.
  EXPECT_EQ(hex(tfrecord("kiln")), "0400000000000000424552046b696c6ef7f4cdce");
  const std::string file = tfrecord("one") + tfrecord("") + tfrecord(std::string(300, 'x'));
  size_t valid = 0;
  EXPECT_EQ(read_tfrecords(file, &valid), (std::vector<std::string>{"one", "", std::string(300, 'x')}));
  EXPECT_EQ(valid, file.size());
  // A torn last record, or a flipped bit, ends the readable part there.
  const std::string torn = file.substr(0, file.size() - 1);
  EXPECT_EQ(read_tfrecords(torn, &valid).size(), 2u);
  EXPECT_EQ(valid, tfrecord("one").size() + tfrecord("").size());
  std::string flipped = file;
  flipped[14] ^= 1;  // inside the first record's data
  EXPECT_TRUE(read_tfrecords(flipped, &valid).empty());
  EXPECT_EQ(valid, 0u);
}

TEST(Jsonl, EscapesNamesAndWritesNonFiniteValuesAsNull) {
  EXPECT_EQ(json_string("a\"b\\c\nd\te\x01"), "\"a\\\"b\\\\c\\nd\\te\\u0001\"");
  EXPECT_EQ(json_string("val/accuracy é"), "\"val/accuracy é\"");  // UTF-8 as it is
  EXPECT_EQ(json_number(0.1), "0.1");                              // shortest text that reads back
  EXPECT_EQ(json_number(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(json_number(-2.5e-10), "-2.5e-10");
  EXPECT_EQ(json_number(10.0), "10.0");  // as metrics.csv writes it (Python's repr), not 1e+01
  EXPECT_EQ(json_number(1e-5), "1e-05");
  EXPECT_EQ(json_number(1e16), "1e+16");
  EXPECT_EQ(json_number(std::nan("")), "null");
  EXPECT_EQ(json_number(std::numeric_limits<double>::infinity()), "null");
  EXPECT_EQ(json_number(-std::numeric_limits<double>::infinity()), "null");
  LogRow row{LogRow::Kind::step, 2, 150, {{"train/loss_step", 0.5}, {"weird\"name", std::nan("")}}};
  EXPECT_EQ(json_line(row),
            "{\"kind\":\"step\",\"epoch\":2,\"step\":150,\"train/loss_step\":0.5,\"weird\\\"name\":null}");
}

// The per-step paths (a kept buffer, each name's text made once) write what
// the one-off ones do.
TEST(Jsonl, AKeptBufferWritesEachRowAsJsonLineDoes) {
  std::map<std::string, std::string> starts;
  std::string kept;
  for (int step = 1; step <= 3; ++step) {
    LogRow row{LogRow::Kind::step, 0, step, {{"train/loss_step", 1.0 / step}, {"lr-Adam_step", 1e-3}, {"q\"", -0.0}}};
    kept.clear();
    append_json_line(kept, row, &starts);
    EXPECT_EQ(kept, json_line(row));
  }
}

// What the shipper sends for a spooled point without parsing it is what
// parsing it gives: the key, the value (the non-finite ones as protobuf's
// JSON strings), the timestamp and the step; anything else is left to the
// parser.
TEST(MlflowSpool, AMetricLineBecomesTheSameLogBatchItemWithoutAParse) {
  using nlohmann::json;
  const double values[] = {0.1, -2.5e-10, 1e16, 5e-324, 10.0, -0.0, std::nan(""),
                           std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  const std::string keys[] = {"train/loss_step", "a \"quoted\" \\ key", "lr-Adam/pg2_step", "val/accuracy é"};
  for (const std::string& key : keys) {
    for (const double v : values) {
      std::string line;
      append_spool_metric(line, spool_metric_prefix(key), v, 6, 1764300000123);
      EXPECT_EQ(line, spool_metric(key, v, 6, 1764300000123));
      ASSERT_EQ(line.back(), '\n');
      line.pop_back();
      std::string item;
      ASSERT_TRUE(spool_metric_item(line, item)) << line;
      const json parsed = json::parse(item);
      const json spooled = json::parse(line);
      EXPECT_EQ(parsed, (json{{"key", spooled["m"]}, {"value", spooled["v"]}, {"timestamp", spooled["t"]}, {"step", spooled["s"]}}))
          << item;
      EXPECT_EQ(parsed["key"], key);
    }
  }
  std::string item;
  for (const char* other : {"{\"m\":\"a\",\"v\":0.5,\"s\":3,\"t\":12", "{\"m\":\"a\",\"v\":0.5,\"s\":3,\"t\":12}x",
                            "{\"p\":\"lr\",\"v\":\"0.1\"}", "{\"m\":\"a\",\"v\":,\"s\":3,\"t\":12}",
                            "{\"t\":12,\"m\":\"a\",\"v\":0.5,\"s\":3}", "{\"m\":\"a"})
    EXPECT_FALSE(spool_metric_item(other, item)) << other;
}

// A metrics.csv cell is the value itself, as Lightning's CSVLogger writes it
// (Python's repr: 10.0, not 1e+01), not nine digits of it; non-finite values
// as Python and pandas spell them.
TEST(Csv, CellsReadBackAsTheSameDoubleAndNonFiniteValuesAsPythonWritesThem) {
  for (const double v : {0.1, 1.0 / 3.0, 0.1 + 1e-12, 0.10000000149011612 /* 0.1f */, 1e30, -2.5e-10, 12345.678901234567})
    EXPECT_EQ(std::strtod(csv_number(v).c_str(), nullptr), v) << csv_number(v);
  EXPECT_EQ(csv_number(0.100000000001), "0.100000000001");  // "%.9g" wrote 0.1
  EXPECT_EQ(csv_number(0.25), "0.25");
  EXPECT_EQ(csv_number(10.0), "10.0");
  EXPECT_EQ(csv_number(100.0), "100.0");
  EXPECT_EQ(csv_number(1e-4), "0.0001");
  EXPECT_EQ(csv_number(1e-5), "1e-05");
  EXPECT_EQ(csv_number(1e15), "1000000000000000.0");
  EXPECT_EQ(csv_number(1e16), "1e+16");
  EXPECT_EQ(csv_number(-0.0), "-0.0");
  EXPECT_EQ(csv_number(std::nan("")), "nan");
  EXPECT_EQ(csv_number(-std::nan("")), "nan");
  EXPECT_EQ(csv_number(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(csv_number(-std::numeric_limits<double>::infinity()), "-inf");

  test::TempDir dir;
  CsvLog log(dir.path() / "metrics.csv");
  log.append({{"epoch", 0}, {"step", 4}, {"val/auroc", 1.0 / 3.0}, {"train/loss", -std::nan("")}, {"val/n", 10.0}});
  const std::string text = read(dir.path() / "metrics.csv");
  EXPECT_EQ(text, "epoch,step,train/loss,val/auroc,val/n\n0,4,nan,0.3333333333333333,10.0\n");
  CsvLog resumed(dir.path() / "other.csv");
  resumed.restore(text);
  EXPECT_EQ(resumed.text(), text) << "a resumed run's file keeps the same cells";
}

TEST(AppendFile, AFreshFileStartsEmptyAndAResumedOneIsCutBackToTheCheckpointsLength) {
  test::TempDir dir("kiln-append");
  const auto file = dir.path() / "metrics.jsonl";
  {
    std::ofstream(file) << "left over from an earlier run\n";
    AppendFile fresh(file, -1);
    EXPECT_EQ(fresh.size(), 0);
    fresh.append("row 1\n");
    fresh.sync();
    EXPECT_EQ(fresh.size(), 6);
    fresh.append("row 2 (after the checkpoint)\n");
  }
  EXPECT_EQ(read(file), "row 1\nrow 2 (after the checkpoint)\n");
  {
    AppendFile resumed(file, 6);  // the checkpoint had seen "row 1\n"
    EXPECT_TRUE(resumed.continued_whole());
    resumed.append("row 2\n");
  }
  EXPECT_EQ(read(file), "row 1\nrow 2\n");
  AppendFile shorter(file, 100);  // lost on the way: kept as it is, and said
  EXPECT_FALSE(shorter.continued_whole());
  EXPECT_EQ(shorter.size(), 12);
}

TEST(Loggers, ContinueTheirFilesFromACheckpointsStateWithoutRepeatingRows) {
  test::TempDir dir("kiln-loggers");
  auto step_row = [](int64_t step) { return LogRow{LogRow::Kind::step, 0, step, {{"train/loss_step", 1.0 / step}}}; };
  auto epoch_row = [](int64_t step) { return LogRow{LogRow::Kind::epoch, 0, step, {{"train/loss", 0.25}}}; };
  std::map<std::string, std::string> states;
  {
    Loggers loggers(LoggingConfig{{"csv", "jsonl", "tensorboard"}}, dir.path());
    loggers.open();
    loggers.log(step_row(1));
    loggers.log(epoch_row(2));
    states = loggers.states();  // a checkpoint here
    loggers.log(step_row(3));   // then rows the checkpoint never saw
    loggers.log(epoch_row(4));
  }
  // Each logger's state under its own name; metrics.csv's is its text.
  ASSERT_EQ(states.size(), 3u);
  EXPECT_EQ(states.at("csv"), "epoch,step,train/loss\n0,2,0.25\n");
  {
    Loggers resumed(LoggingConfig{{"csv", "jsonl", "tensorboard"}}, dir.path());
    resumed.restore(states);
    resumed.open();
    resumed.log(step_row(3));
    resumed.log(epoch_row(4));
  }
  const std::string jsonl = read(dir.path() / "metrics.jsonl");
  EXPECT_EQ(jsonl,
            "{\"kind\":\"step\",\"epoch\":0,\"step\":1,\"train/loss_step\":1.0}\n"
            "{\"kind\":\"epoch\",\"epoch\":0,\"step\":2,\"train/loss\":0.25}\n"
            "{\"kind\":\"step\",\"epoch\":0,\"step\":3,\"train/loss_step\":0.3333333333333333}\n"
            "{\"kind\":\"epoch\",\"epoch\":0,\"step\":4,\"train/loss\":0.25}\n");
  EXPECT_EQ(read(dir.path() / "metrics.csv"), "epoch,step,train/loss\n0,2,0.25\n0,4,0.25\n");  // epoch rows only
  size_t valid = 0;
  const std::string events = read(dir.path() / "events.out.tfevents.kiln");
  EXPECT_EQ(read_tfrecords(events, &valid).size(), 5u);  // file_version + 4 rows
  EXPECT_EQ(valid, events.size());
}

TEST(Loggers, KnowTheirNamesAndWriteNothingBeforeTheFirstRow) {
  EXPECT_EQ(logger_names(), (std::vector<std::string>{"csv", "jsonl", "tensorboard", "mlflow"}));
  test::TempDir dir("kiln-loggers");
  std::ofstream(dir.path() / "metrics.jsonl") << "a fit's rows\n";
  Loggers loggers(LoggingConfig{{"csv", "jsonl", "tensorboard"}}, dir.path());
  loggers.log(LogRow{});  // not open: the run directory may not be written yet
  loggers.open();         // open, but no row (kiln predict): the files stay as they were
  loggers.flush();
  EXPECT_TRUE(loggers.states().empty());
  EXPECT_EQ(read(dir.path() / "metrics.jsonl"), "a fit's rows\n");
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "metrics.csv"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "events.out.tfevents.kiln"));
}

}  // namespace
}  // namespace kiln
