// The MLflow logger's files in the run directory, under mlflow/, and the
// shipping of what they hold to the server. Shared by the logger's
// background thread and `kiln mlflow-sync`.
//
//   mlflow/spool.jsonl  every record the run has logged, one JSON object a
//                       line, appended before anything is sent:
//                         {"m":"val/loss","v":0.41,"s":120,"t":1764331234567}  a metric point
//                         {"p":"optimizer.lr","v":"0.001"}                      a param
//                         {"tag":"kiln.final_checkpoint","v":"..."}             a tag
//                         {"end":"FINISHED","t":1764331299000}                  the run's end
//   mlflow/acked        how many bytes of the spool the server has taken
//                       (the records before it have left the spool)
//   mlflow/run.json     the server, experiment and run the spool belongs to:
//                       what mlflow-sync needs with no manifest at hand
//
// Nothing is ever sent twice in a way the server would keep twice: a metric
// point carries its timestamp from the spool, and MLflow keeps one point per
// (key, step, timestamp, value); a param is logged once with one value.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "metrics/mlflow_client.hpp"

namespace kiln {

struct MlflowRunInfo {
  std::string tracking_uri;
  std::string experiment;
  std::string run_name;
  std::map<std::string, std::string> tags;
  std::string run_id;  // "" until the server has created it
};

struct MlflowFiles {
  explicit MlflowFiles(const std::filesystem::path& run_dir) : dir(run_dir / "mlflow") {}
  // The files in `folder` itself (a spool an earlier run left, kept aside).
  static MlflowFiles in(const std::filesystem::path& folder) {
    MlflowFiles f(folder);
    f.dir = folder;
    return f;
  }
  std::filesystem::path dir;
  std::filesystem::path spool() const { return dir / "spool.jsonl"; }
  std::filesystem::path acked() const { return dir / "acked"; }
  std::filesystem::path run_info() const { return dir / "run.json"; }

  std::optional<MlflowRunInfo> read_run_info() const;
  void write_run_info(const MlflowRunInfo& info) const;  // durably
  int64_t read_acked() const;                            // 0 when absent
  void write_acked(int64_t bytes) const;                 // atomically (no fsync: a lost ack only resends)
};

// The spool's lines.
std::string spool_metric(const std::string& key, double value, int64_t step, int64_t timestamp_ms);
// The same line appended to `out`, from `prefix` = spool_metric_prefix(key)
// (made once a metric): what a logger pays for each point of each step.
std::string spool_metric_prefix(const std::string& key);
void append_spool_metric(std::string& out, const std::string& prefix, double value, int64_t step, int64_t timestamp_ms);
std::string spool_param(const std::string& key, const std::string& value);
std::string spool_tag(const std::string& key, const std::string& value);
std::string spool_end(const std::string& status, int64_t timestamp_ms);

// A metric point as the spool holds it: its value as JSON text.
struct SpooledPoint {
  int64_t timestamp_ms = 0;
  std::string value;  // "0.41", "\"NaN\""
};
// The metric points in `bytes` (spool lines), by key and step: a resumed run
// sends a point it recomputes as the first one was spooled (the server may
// have it), so that the server keeps one.
std::map<std::pair<std::string, int64_t>, SpooledPoint> spooled_points(const std::string& bytes);
// A metric point's value as the spool writes it.
std::string spool_value(double value);
std::string spool_metric_text(const std::string& key, const std::string& value, int64_t step, int64_t timestamp_ms);
// A metric line exactly as append_spool_metric writes it, as log-batch's
// item ({"key":..,"value":..,"timestamp":..,"step":..}) without a JSON
// parse: the key's literal and the value's text go through as written.
// False for anything else (a torn line, an older spelling): parse it then.
bool spool_metric_item(std::string_view line, std::string& item);
// How many records `bytes` holds (whole lines).
int64_t spool_records(const std::string& bytes);

// Reads [from, to) of `file`; throws std::runtime_error.
std::string read_range(const std::filesystem::path& file, int64_t from, int64_t to);

int64_t now_ms();

// Sends what the spool holds past `acked` to the run: creates the run
// first if run.json has no id yet. Each call sends whole lines only, in
// log-batch requests within MLflow's limits (1,000 metrics, 100 params, 100
// tags, 1,000 items, 1 MB), and records the acknowledged offset after each.
class MlflowShipper {
 public:
  MlflowShipper(MlflowFiles files, MlflowClient& client);
  // Sends [acked(), end) of the spool. Returns normally once all of it is
  // acknowledged; throws MlflowError at the first request that fails (what
  // was acknowledged before stays acknowledged).
  void ship(int64_t end);
  int64_t acked() const { return acked_; }
  // Records the server refused outright (a changed param, a malformed key),
  // skipped rather than retried forever; with the server's reason.
  int64_t refused() const { return refused_; }
  const std::string& last_refusal() const { return last_refusal_; }
  const std::string& run_id() const { return info_.run_id; }

 private:
  void ensure_run();
  void ship_piece(int64_t end);
  MlflowFiles files_;
  MlflowClient& client_;
  MlflowRunInfo info_;
  int64_t acked_ = 0;
  int64_t refused_ = 0;
  std::string last_refusal_;
};

}  // namespace kiln
