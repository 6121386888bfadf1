#include "metrics/mlflow_spool.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string_view>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "util/durable_file.hpp"
#include "util/json_string.hpp"
#include "util/shortest_double.hpp"

namespace kiln {

namespace {

using json = nlohmann::json;

// MLflow's log-batch limits (docs: REST API, "Log Batch").
constexpr size_t kMaxMetrics = 1000;
constexpr size_t kMaxParams = 100;
constexpr size_t kMaxTags = 100;
constexpr size_t kMaxItems = 1000;
constexpr size_t kMaxBodyBytes = 900 * 1000;  // under the 1 MB request limit, with room for the envelope
// How much of the spool one read takes (many batches' worth).
constexpr int64_t kPieceBytes = 4 << 20;

// A double as MLflow's JSON takes it: the shortest text that reads back as
// the same double; NaN and the infinities as protobuf's JSON strings.
std::string metric_value(double v) {
  if (std::isnan(v)) return "\"NaN\"";
  if (std::isinf(v)) return v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  return python_float_repr(v);
}

// The "v" member's text as written (the shortest round-trip digits kiln
// wrote, not a re-formatting of them).
std::string json_value_text(const std::string& line) {
  const size_t at = line.find(",\"v\":");
  if (at == std::string::npos) return "null";
  const size_t begin = at + 5;
  const size_t end = line.find(",\"s\":", begin);
  return line.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

}  // namespace

// The shipper reads every point of every step: nlohmann's parse cost it
// microseconds a point, on the core beside the training's.
bool spool_metric_item(std::string_view line, std::string& item) {
  auto take = [&](std::string_view literal) {
    if (line.substr(0, literal.size()) != literal) return false;
    line.remove_prefix(literal.size());
    return true;
  };
  auto integer = [&](std::string_view& out) {
    size_t n = line.size() > 0 && line[0] == '-' ? 1 : 0;
    const size_t digits_from = n;
    while (n < line.size() && line[n] >= '0' && line[n] <= '9') ++n;
    if (n == digits_from) return false;
    out = line.substr(0, n);
    line.remove_prefix(n);
    return true;
  };
  if (!take("{\"m\":\"")) return false;
  size_t n = 0;
  while (n < line.size() && line[n] != '"') n += line[n] == '\\' ? 2 : 1;
  if (n >= line.size()) return false;
  const std::string_view key = line.substr(0, n);
  line.remove_prefix(n + 1);
  if (!take(",\"v\":")) return false;
  std::string_view value;
  if (line.substr(0, 5) == "\"NaN\"" || line.substr(0, 10) == "\"Infinity\"" || line.substr(0, 11) == "\"-Infinity\"") {
    value = line.substr(0, line.find('"', 1) + 1);
  } else {
    size_t v = 0;
    while (v < line.size() && (std::isdigit(static_cast<unsigned char>(line[v])) || line[v] == '.' || line[v] == 'e' ||
                               line[v] == '-' || line[v] == '+'))
      ++v;
    if (v == 0) return false;
    value = line.substr(0, v);
  }
  line.remove_prefix(value.size());
  std::string_view step, timestamp;
  if (!take(",\"s\":") || !integer(step) || !take(",\"t\":") || !integer(timestamp) || line != "}") return false;
  item.clear();
  item += "{\"key\":\"";
  item += key;
  item += "\",\"value\":";
  item += value;
  item += ",\"timestamp\":";
  item += timestamp;
  item += ",\"step\":";
  item += step;
  item += '}';
  return true;
}

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string spool_value(double value) { return metric_value(value); }
std::string spool_metric_text(const std::string& key, const std::string& value, int64_t step, int64_t timestamp_ms) {
  return "{\"m\":" + json_string(key) + ",\"v\":" + value + ",\"s\":" + std::to_string(step) +
         ",\"t\":" + std::to_string(timestamp_ms) + "}\n";
}
std::string spool_metric(const std::string& key, double value, int64_t step, int64_t timestamp_ms) {
  std::string line;
  append_spool_metric(line, spool_metric_prefix(key), value, step, timestamp_ms);
  return line;
}
std::string spool_metric_prefix(const std::string& key) { return "{\"m\":" + json_string(key) + ",\"v\":"; }
void append_spool_metric(std::string& out, const std::string& prefix, double value, int64_t step, int64_t timestamp_ms) {
  out += prefix;
  if (std::isfinite(value))
    append_python_float_repr(out, value);
  else
    out += metric_value(value);
  char number[24];
  out += ",\"s\":";
  out.append(number, std::to_chars(number, number + sizeof number, step).ptr);
  out += ",\"t\":";
  out.append(number, std::to_chars(number, number + sizeof number, timestamp_ms).ptr);
  out += "}\n";
}
std::string spool_param(const std::string& key, const std::string& value) {
  return "{\"p\":" + json_string(key) + ",\"v\":" + json_string(value) + "}\n";
}
std::string spool_tag(const std::string& key, const std::string& value) {
  return "{\"tag\":" + json_string(key) + ",\"v\":" + json_string(value) + "}\n";
}
std::string spool_end(const std::string& status, int64_t timestamp_ms) {
  return "{\"end\":" + json_string(status) + ",\"t\":" + std::to_string(timestamp_ms) + "}\n";
}

std::map<std::pair<std::string, int64_t>, SpooledPoint> spooled_points(const std::string& bytes) {
  std::map<std::pair<std::string, int64_t>, SpooledPoint> out;
  std::istringstream in(bytes);
  for (std::string line; std::getline(in, line);) {
    if (in.eof()) break;  // a torn last line
    try {
      const json j = json::parse(line);
      if (j.contains("m"))
        out.emplace(std::make_pair(j["m"].get<std::string>(), j["s"].get<int64_t>()),
                    SpooledPoint{j["t"].get<int64_t>(), j["v"].is_string() ? j["v"].dump() : json_value_text(line)});
    } catch (const json::exception&) {
    }
  }
  return out;
}

int64_t spool_records(const std::string& bytes) {
  int64_t n = 0;
  for (char c : bytes) n += c == '\n';
  return n;
}

std::string read_range(const std::filesystem::path& file, int64_t from, int64_t to) {
  std::string out;
  if (to <= from) return out;
  Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw std::runtime_error("cannot read " + file.string() + ": " + error_text(errno));
  out.resize(static_cast<size_t>(to - from));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd.get(), out.data() + done, out.size() - done, from + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error("cannot read " + file.string() + ": " + error_text(errno));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

std::optional<MlflowRunInfo> MlflowFiles::read_run_info() const {
  std::ifstream in(run_info());
  if (!in) return std::nullopt;
  try {
    const json j = json::parse(in);
    MlflowRunInfo info;
    info.tracking_uri = j.value("tracking_uri", "");
    info.experiment = j.value("experiment", "");
    info.run_name = j.value("run_name", "");
    info.run_id = j.value("run_id", "");
    if (j.contains("tags")) info.tags = j["tags"].get<std::map<std::string, std::string>>();
    return info;
  } catch (const json::exception& e) {
    throw std::runtime_error(run_info().string() + " is not kiln's: " + e.what());
  }
}

void MlflowFiles::write_run_info(const MlflowRunInfo& info) const {
  std::filesystem::create_directories(dir);
  const json j{{"tracking_uri", info.tracking_uri}, {"experiment", info.experiment}, {"run_name", info.run_name},
               {"tags", info.tags},                 {"run_id", info.run_id}};
  write_file_durably(run_info(), j.dump(2) + "\n");
}

int64_t MlflowFiles::read_acked() const {
  std::ifstream in(acked());
  int64_t v = 0;
  if (in >> v && v >= 0) return v;
  return 0;
}

void MlflowFiles::write_acked(int64_t bytes) const {
  const std::filesystem::path tmp = temporary_for(acked());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << bytes << "\n";
    if (!out) throw std::runtime_error("cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, acked());
}

MlflowShipper::MlflowShipper(MlflowFiles files, MlflowClient& client) : files_(std::move(files)), client_(client) {
  if (auto info = files_.read_run_info()) info_ = std::move(*info);
  acked_ = files_.read_acked();
}

void MlflowShipper::ensure_run() {
  if (!info_.run_id.empty()) return;
  const std::string experiment_id = client_.experiment_id(info_.experiment);
  info_.run_id = client_.create_run(experiment_id, info_.run_name, info_.tags, now_ms());
  files_.write_run_info(info_);
}

void MlflowShipper::ship(int64_t end) {
  if (acked_ > end) acked_ = end;  // the spool was cut back (a resume)
  if (acked_ == end) return;
  ensure_run();
  // In pieces: a spool a long outage grew is not read whole at each retry.
  while (acked_ < end) {
    const int64_t before = acked_;
    ship_piece(std::min(end, acked_ + kPieceBytes));
    if (acked_ == before) break;  // no whole line in the piece: the rest is still being written
  }
}

void MlflowShipper::ship_piece(int64_t end) {
  const int64_t base = acked_;
  const std::string bytes = read_range(files_.spool(), base, end);
  std::string metrics, params, tags;
  size_t n_metrics = 0, n_params = 0, n_tags = 0;
  int64_t through = acked_;  // the spool offset the pending batch reaches
  auto flush = [&] {
    if (n_metrics + n_params + n_tags == 0) {
      if (through != acked_) acked_ = through, files_.write_acked(acked_);
      return;
    }
    const std::string run = "{\"run_id\":" + json_string(info_.run_id);
    const std::string body_metrics = ",\"metrics\":[" + metrics + "]";
    const std::string body_tags = ",\"tags\":[" + tags + "]";
    try {
      client_.log_batch(run + body_metrics + ",\"params\":[" + params + "]" + body_tags + "}");
    } catch (const MlflowError& e) {
      if (e.kind() != MlflowError::Kind::refused) throw;
      // A param whose value changed (a resume with other settings) refuses
      // the whole batch: the points go without the params.
      last_refusal_ = e.what();
      bool sent = false;
      if (n_params > 0) {
        refused_ += static_cast<int64_t>(n_params);
        try {
          client_.log_batch(run + body_metrics + ",\"params\":[]" + body_tags + "}");
          sent = true;
        } catch (const MlflowError& again) {
          if (again.kind() != MlflowError::Kind::refused) throw;
          last_refusal_ = again.what();
        }
      }
      if (!sent) refused_ += static_cast<int64_t>(n_metrics + n_tags);
    }
    metrics.clear(), params.clear(), tags.clear();
    n_metrics = n_params = n_tags = 0;
    acked_ = through;
    files_.write_acked(acked_);
  };
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t nl = bytes.find('\n', pos);
    if (nl == std::string::npos) break;  // a line still being written: the next call's
    const std::string_view line(bytes.data() + pos, nl - pos);
    const int64_t line_end = base + static_cast<int64_t>(nl + 1);
    pos = nl + 1;
    std::string item;
    std::string* list = nullptr;
    size_t* count = nullptr;
    size_t limit = 0;
    if (spool_metric_item(line, item)) {
      list = &metrics, count = &n_metrics, limit = kMaxMetrics;
    } else {
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception&) {
        through = line_end;  // a torn line a crash left: not a record
        continue;
      }
      if (j.contains("m")) {
        item = "{\"key\":" + j["m"].dump() + ",\"value\":" + j["v"].dump() + ",\"timestamp\":" + j["t"].dump() +
               ",\"step\":" + j["s"].dump() + "}";
        list = &metrics, count = &n_metrics, limit = kMaxMetrics;
      } else if (j.contains("p")) {
        item = "{\"key\":" + j["p"].dump() + ",\"value\":" + j["v"].dump() + "}";
        list = &params, count = &n_params, limit = kMaxParams;
      } else if (j.contains("tag")) {
        item = "{\"key\":" + j["tag"].dump() + ",\"value\":" + j["v"].dump() + "}";
        list = &tags, count = &n_tags, limit = kMaxTags;
      } else if (j.contains("end")) {
        flush();
        try {
          client_.update_run(info_.run_id, j["end"].get<std::string>(), j["t"].get<int64_t>());
        } catch (const MlflowError& e) {
          if (e.kind() != MlflowError::Kind::refused) throw;
          last_refusal_ = e.what();
          ++refused_;
        }
        through = line_end;
        flush();
        continue;
      } else {
        through = line_end;
        continue;
      }
    }
    const size_t body = metrics.size() + params.size() + tags.size();
    if (*count + 1 > limit || n_metrics + n_params + n_tags + 1 > kMaxItems || body + item.size() + 1 > kMaxBodyBytes)
      flush();
    if (!list->empty()) *list += ',';
    *list += item;
    ++*count;
    through = line_end;
  }
  flush();
}

}  // namespace kiln
