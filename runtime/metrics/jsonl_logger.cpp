#include "metrics/jsonl_logger.hpp"

#include "config/logger_registry.hpp"

#include <pthread.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "metrics/logger_state.hpp"
#include "util/shortest_double.hpp"

namespace kiln {


// Python's repr of the double, as metrics.csv writes it (every form of it,
// 10.0, 1e-05, 1e+16, is a JSON number); NaN and infinities, which JSON
// cannot express, as null.
namespace {

void append_json_number(std::string& out, double v) {
  if (std::isfinite(v))
    append_python_float_repr(out, v);
  else
    out += "null";
}

void append_integer(std::string& out, int64_t v) {
  char number[24];
  out.append(number, std::to_chars(number, number + sizeof number, v).ptr);
}

}  // namespace

std::string json_number(double v) {
  std::string out;
  append_json_number(out, v);
  return out;
}

std::string json_line(const LogRow& row) {
  std::string out;
  append_json_line(out, row, nullptr);
  return out;
}

void append_json_line(std::string& out, const LogRow& row, std::map<std::string, std::string>* member_starts) {
  out += "{\"kind\":";
  out += json_string(kind_name(row.kind));
  out += ",\"epoch\":";
  append_integer(out, row.epoch);
  out += ",\"step\":";
  append_integer(out, row.step);
  if (row.partial) out += ",\"partial\":true";
  for (const auto& [name, value] : row.metrics) {
    if (member_starts) {
      auto it = member_starts->find(name);
      if (it == member_starts->end()) it = member_starts->emplace(name, "," + json_string(name) + ":").first;
      out += it->second;
    } else {
      out += "," + json_string(name) + ":";
    }
    append_json_number(out, value);
  }
  out += '}';
}

void JsonlLogger::open(const std::string& state) {
  file_.emplace(path_, state.empty() ? -1 : parse_length_state(state, "jsonl"));
  if (!file_->continued_whole())
    spdlog::warn("{} is shorter than the checkpoint recorded; rows from before the checkpoint are missing from it",
                 path_.string());
  writer_ = std::thread([this] { write_in_background(); });
}

JsonlLogger::~JsonlLogger() {
  // A run that failed before its end: what it logged still goes to the file.
  stop_writer();
  try {
    write_pending();
  } catch (const std::exception& e) {
    spdlog::warn("{}", e.what());
  }
}

void JsonlLogger::log(const LogRow& row) {
  if (!file_) return;
  std::lock_guard lock(pending_mutex_);
  if (write_error_) std::rethrow_exception(write_error_);
  append_json_line(pending_, row, &member_starts_);
  pending_ += '\n';
}

void JsonlLogger::write_pending() {
  std::lock_guard file_lock(file_mutex_);
  {
    std::lock_guard lock(pending_mutex_);
    if (write_error_) std::rethrow_exception(write_error_);
    writing_.swap(pending_);
  }
  if (!file_ || writing_.empty()) return;
  file_->append(writing_);
  writing_.clear();
}

void JsonlLogger::write_in_background() {
  pthread_setname_np(pthread_self(), "jsonl-writer");  // named in top, perf and gdb
  std::unique_lock lock(pending_mutex_);
  while (!writer_stopping_) {
    wake_.wait_for(lock, kWriteInterval, [&] { return writer_stopping_; });
    if (writer_stopping_ || write_error_ || pending_.empty()) continue;
    lock.unlock();
    try {
      write_pending();
    } catch (...) {
      std::lock_guard error_lock(pending_mutex_);
      write_error_ = std::current_exception();  // rethrown by the next log() or flush()
    }
    lock.lock();
  }
}

void JsonlLogger::stop_writer() {
  {
    std::lock_guard lock(pending_mutex_);
    writer_stopping_ = true;
  }
  wake_.notify_one();
  if (writer_.joinable()) writer_.join();
}

void JsonlLogger::flush() {
  write_pending();
  std::lock_guard file_lock(file_mutex_);
  if (file_) file_->sync();
}

std::string JsonlLogger::state() {
  if (!file_) return "";
  flush();
  std::lock_guard file_lock(file_mutex_);
  return std::to_string(file_->size());
}

void JsonlLogger::finish(const RunEnd&) {
  stop_writer();
  flush();
}

std::unique_ptr<Logger> make_jsonl_logger(const LoggerContext& context) { return std::make_unique<JsonlLogger>(context.run_dir); }

}  // namespace kiln
