// The files a run logs (metrics.csv, metrics.jsonl, TensorBoard's events), read
// as the tools people use read them: TensorBoard's EventAccumulator through
// the checking Python. Shared by the logging and restart tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common.hpp"

namespace kiln::test {

inline const char* kAllLoggers = "\n[logging]\nloggers = [\"csv\", \"jsonl\", \"tensorboard\"]\n";

// One scalar as TensorBoard's reader sees it.
struct Scalar {
  std::string tag;
  int64_t step;
  double value;
};

// Every scalar of the event files in `dir`, read by EventAccumulator (no
// sampling: size_guidance 0 keeps them all), in the reader's order.
inline std::vector<Scalar> tensorboard_scalars(const std::filesystem::path& dir) {
  write_file(dir / "read_events.py",
             "import sys\n"
             "from tensorboard.backend.event_processing import event_accumulator as ea\n"
             "acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})\n"
             "acc.Reload()\n"
             "print('file_version', acc.file_version)\n"
             "for tag in acc.Tags()['scalars']:\n"
             "    for e in acc.Scalars(tag):\n"
             "        print('scalar', tag, e.step, repr(e.value))\n");
  const ProcessResult r =
      run_process({check_python().string(), (dir / "read_events.py").string(), (dir / "run").string()},
                  {.timeout = std::chrono::seconds(300)});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("file_version 2.0"), std::string::npos) << r.output;
  std::vector<Scalar> out;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string kind;
    Scalar s;
    if (words >> kind && kind == "scalar" && words >> s.tag >> s.step >> s.value) out.push_back(s);
  }
  return out;
}

// metrics.jsonl as rows: "kind", "epoch", "step" and the metrics (null: NaN).
// kiln writes a flat object of numbers and one string; this reads that.
inline std::vector<std::map<std::string, std::string>> read_jsonl(const std::filesystem::path& file) {
  std::vector<std::map<std::string, std::string>> rows;
  std::istringstream in(read_file(file));
  for (std::string line; std::getline(in, line);) {
    EXPECT_TRUE(line.size() >= 2 && line.front() == '{' && line.back() == '}') << line;
    std::map<std::string, std::string> row;
    size_t at = 1;
    while (at < line.size() - 1) {
      const size_t key_end = line.find('"', at + 1);
      const std::string key = line.substr(at + 1, key_end - at - 1);
      size_t value_end = line.find(',', key_end + 2);
      if (value_end == std::string::npos) value_end = line.size() - 1;
      std::string value = line.substr(key_end + 2, value_end - key_end - 2);
      if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
      row[key] = value;
      at = value_end + 1;
    }
    rows.push_back(row);
  }
  return rows;
}

// float32, as TensorBoard's simple_value holds a number.
inline void expect_float_equal(double tensorboard, double exact, const std::string& what) {
  EXPECT_NEAR(tensorboard, static_cast<double>(static_cast<float>(exact)), std::fabs(exact) * 1e-6 + 1e-12) << what;
}

// (tag, step) -> value; every pair must occur once.
inline std::map<std::pair<std::string, int64_t>, double> by_tag_and_step(const std::vector<Scalar>& scalars) {
  std::map<std::pair<std::string, int64_t>, double> out;
  for (const auto& s : scalars)
    EXPECT_TRUE(out.emplace(std::pair{s.tag, s.step}, s.value).second) << s.tag << " at step " << s.step << " twice";
  return out;
}

// TensorBoard's scalars of a resumed run against an uninterrupted one's:
// each (tag, step) once, the same pairs, and the tags `exact` says are
// deterministic equal as float32.
template <typename Exact>
void expect_the_same_scalars(const std::filesystem::path& uninterrupted, const std::filesystem::path& resumed,
                             Exact exact) {
  const auto a = by_tag_and_step(tensorboard_scalars(uninterrupted));
  const auto b = by_tag_and_step(tensorboard_scalars(resumed));
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [key, value] : a) {
    const auto it = b.find(key);
    ASSERT_NE(it, b.end()) << key.first << " at step " << key.second;
    if (exact(key.first))
      EXPECT_EQ(static_cast<float>(it->second), static_cast<float>(value)) << key.first << " at step " << key.second;
  }
}

// Each file's rows as "kind step" lines, in order (and their values by step).
inline std::vector<std::string> jsonl_rows(const std::filesystem::path& file) {
  std::vector<std::string> out;
  for (const auto& row : read_jsonl(file)) out.push_back(row.at("kind") + " " + row.at("step"));
  return out;
}

}  // namespace kiln::test
