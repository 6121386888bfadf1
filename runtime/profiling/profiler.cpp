#include "profiling/profiler.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <spdlog/spdlog.h>

#include "util/durable_file.hpp"

namespace kiln {

namespace {

double seconds_between(Profiler::Clock::time_point a, Profiler::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string json_escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::get_batch_wait: return "get_batch wait";
    case Phase::host_to_device: return "host-to-device";
    case Phase::training_step: return "training_step";
    case Phase::backward: return "backward";
    case Phase::allreduce_wait: return "gradient all-reduce wait";
    case Phase::gather_wait: return "parameter gather wait";
    case Phase::optimizer_step: return "optimizer step";
    case Phase::validation: return "validation";
    case Phase::callbacks: return "callbacks";
    case Phase::checkpoint: return "checkpoint commit";
    case Phase::logging: return "logging";
    case Phase::count: break;
  }
  return "?";
}

Profiler::Profiler(ProfilerKind kind, int32_t rank) : kind_(kind), rank_(rank) {
  if (tracing()) events_.reserve(size_t{1} << 16);
}

void Profiler::begin_fit() {
  fit_start_ = Clock::now();
  fit_nested_s_ = 0;
  open_.clear();
  in_fit_ = true;
}

void Profiler::end_fit() {
  in_fit_ = false;
  const Clock::time_point now = Clock::now();
  totals_.wall_s += seconds_between(fit_start_, now);
  if (tracing()) keep(kFit, 0, fit_start_, now);
}

void Profiler::begin(Phase phase) { open_.push_back(Open{phase, Clock::now(), 0}); }

void Profiler::end(Phase phase) {
  const Clock::time_point now = Clock::now();
  if (open_.empty() || open_.back().phase != phase) return;  // unbalanced: an exception unwound past begin
  const Open o = open_.back();
  open_.pop_back();
  const double total = seconds_between(o.start, now);
  const auto i = static_cast<size_t>(phase);
  totals_.self_s[i] += total - o.nested_s;
  ++totals_.count[i];
  if (!open_.empty()) open_.back().nested_s += total;
  if (tracing()) keep(static_cast<int16_t>(phase), 0, o.start, now);
}

void Profiler::carve(Phase phase, double seconds, int64_t count) {
  if (seconds <= 0 || open_.empty()) return;
  const auto i = static_cast<size_t>(phase);
  totals_.self_s[i] += seconds;
  totals_.count[i] += count;
  open_.back().nested_s += seconds;
  if (tracing()) {
    const Clock::time_point now = Clock::now();
    keep(static_cast<int16_t>(phase), 0,
         now - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)), now);
  }
}

void Profiler::worker_event(const char* name, Clock::time_point start, Clock::time_point end) {
  if (!tracing()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, added] = tracks_.try_emplace(std::this_thread::get_id(), static_cast<uint16_t>(tracks_.size() + 1));
  (void)added;
  auto name_at = std::find(worker_names_.begin(), worker_names_.end(), name);
  if (name_at == worker_names_.end()) name_at = worker_names_.insert(worker_names_.end(), name);
  const auto index = static_cast<int16_t>(kFit + 1 + (name_at - worker_names_.begin()));
  if (events_.size() >= kMaxEvents) {
    dropped_ = true;
    return;
  }
  events_.push_back(Event{index, it->second, since_start_ns(start), since_start_ns(end) - since_start_ns(start)});
}

void Profiler::keep(int16_t name, uint16_t track, Clock::time_point start, Clock::time_point end) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (events_.size() >= kMaxEvents) {
    dropped_ = true;
    return;
  }
  events_.push_back(Event{name, track, since_start_ns(start), since_start_ns(end) - since_start_ns(start)});
}

std::string Profiler::export_totals() const {
  std::ostringstream out;
  out.precision(17);
  out << totals_.wall_s;
  for (size_t i = 0; i < size_t(Phase::count); ++i) out << ' ' << totals_.self_s[i] << ' ' << totals_.count[i];
  return out.str();
}

Profiler::Totals Profiler::parse_totals(const std::string& text) {
  Totals t;
  std::istringstream in(text);
  in >> t.wall_s;
  for (size_t i = 0; i < size_t(Phase::count); ++i) in >> t.self_s[i] >> t.count[i];
  return t;
}

std::string Profiler::table(const std::vector<Totals>& ranks) {
  if (ranks.empty()) return "";
  size_t slowest = 0;
  for (size_t r = 1; r < ranks.size(); ++r)
    if (ranks[r].wall_s > ranks[slowest].wall_s) slowest = r;
  const Totals& t = ranks[slowest];
  const bool several = ranks.size() > 1;
  std::string out = fmt::format("profile of the fit{}: {:.3f} s wall\n",
                                several ? fmt::format(" on rank {}, the slowest of {}", slowest, ranks.size()) : "",
                                t.wall_s);
  out += fmt::format("  {:<26} {:>9} {:>11} {:>11} {:>7}{}\n", "phase", "count", "total s", "mean ms", "share",
                     several ? "   over ranks (min-max s)" : "");
  double phases = 0;
  for (size_t i = 0; i < size_t(Phase::count); ++i) {
    phases += t.self_s[i];
    if (t.count[i] == 0) continue;
    std::string spread;
    if (several) {
      double lo = ranks[0].self_s[i], hi = lo;
      for (const Totals& r : ranks) lo = std::min(lo, r.self_s[i]), hi = std::max(hi, r.self_s[i]);
      spread = fmt::format("   {:.3f}-{:.3f}", lo, hi);
    }
    out += fmt::format("  {:<26} {:>9} {:>11.3f} {:>11.3f} {:>6.1f}%{}\n", phase_name(static_cast<Phase>(i)),
                       t.count[i], t.self_s[i], 1e3 * t.self_s[i] / static_cast<double>(t.count[i]),
                       t.wall_s > 0 ? 100.0 * t.self_s[i] / t.wall_s : 0.0, spread);
  }
  const double other = t.wall_s - phases;
  out += fmt::format("  {:<26} {:>9} {:>11.3f} {:>11} {:>6.1f}%", "other (the loop itself)", "", other, "",
                     t.wall_s > 0 ? 100.0 * other / t.wall_s : 0.0);
  return out;
}

std::string Profiler::trace_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out += fmt::format(
      "{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {0}, \"tid\": 0, \"args\": {{\"name\": \"kiln rank {0}\"}}}},\n"
      "{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": {0}, \"tid\": 0, \"args\": {{\"name\": \"main\"}}}}",
      rank_);
  for (const auto& [id, track] : tracks_)
    out += fmt::format(
        ",\n{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": {}, \"tid\": {}, \"args\": {{\"name\": \"data worker {}\"}}}}",
        rank_, track, track);
  for (const Event& e : events_) {
    std::string name;
    if (e.name == kFit)
      name = "fit";
    else if (e.name > kFit)
      name = worker_names_.at(static_cast<size_t>(e.name - kFit - 1));
    else
      name = phase_name(static_cast<Phase>(e.name));
    // Microseconds with the nanoseconds kept: events that touch stay apart.
    out += fmt::format(",\n{{\"name\": \"{}\", \"cat\": \"kiln\", \"ph\": \"X\", \"pid\": {}, \"tid\": {}, \"ts\": {:.3f}, "
                       "\"dur\": {:.3f}}}",
                       json_escaped(name), rank_, e.track, static_cast<double>(e.start_ns) / 1e3,
                       static_cast<double>(e.dur_ns) / 1e3);
  }
  out += "\n]}\n";
  return out;
}

std::filesystem::path Profiler::write_trace(const std::filesystem::path& dir) const {
  const auto file = dir / ("trace.rank" + std::to_string(rank_) + ".json");
  write_file_durably(file, trace_json());
  if (dropped_)
    spdlog::warn("profiler: the trace holds its first {} events; later ones were left out", kMaxEvents);
  return file;
}

}  // namespace kiln
