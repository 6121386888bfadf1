// Helpers shared by the integration tests that train.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include <xxhash.h>

#include "manifests.hpp"
#include "support/run_process.hpp"

namespace kiln::test {

// metrics.csv as rows of column -> value (empty cells left out).
inline std::vector<std::map<std::string, double>> read_metrics(const std::filesystem::path& file) {
  std::istringstream in(read_file(file));
  std::string line;
  std::vector<std::string> columns;
  std::vector<std::map<std::string, double>> rows;
  if (!std::getline(in, line)) return rows;
  std::istringstream header(line);
  for (std::string c; std::getline(header, c, ',');) columns.push_back(c);
  while (std::getline(in, line)) {
    std::map<std::string, double> row;
    std::istringstream cells(line);
    std::string cell;
    for (size_t i = 0; i < columns.size() && std::getline(cells, cell, ','); ++i)
      if (!cell.empty()) row[columns[i]] = std::stod(cell);
    rows.push_back(row);
  }
  return rows;
}

// Leaves out the columns that measure time (they differ between any two
// runs): epoch_seconds and the monitors' train/samples_per_sec, train/step_time.
inline void erase_timings(std::map<std::string, double>& row) {
  for (const char* column : {"epoch_seconds", "train/samples_per_sec", "train/step_time"}) row.erase(column);
}

// metrics.csv's rows without the columns that measure time.
inline std::vector<std::map<std::string, double>> rows_without_timings(const std::filesystem::path& csv) {
  auto rows = read_metrics(csv);
  for (auto& row : rows) erase_timings(row);
  return rows;
}

// Runs `script` (Python: the checking Python's) with `dir / "data"` as its
// argument, where it writes a test's data files; returns that folder.
inline std::filesystem::path make_data_with(const TempDir& dir, const char* script) {
  write_file(dir / "make_data.py", script);
  const ProcessResult r = run_process({check_python().string(), (dir / "make_data.py").string(), (dir / "data").string()},
                                      {.timeout = std::chrono::seconds(600)});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir / "data";
}

// Every file and directory under `root`: its kind, size, mtime and content
// hash (what "nothing written" is checked against).
inline std::map<std::string, std::string> snapshot(const std::filesystem::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    struct stat st {};
    ::lstat(entry.path().c_str(), &st);
    std::string facts = std::to_string(st.st_mode) + " " + std::to_string(st.st_size) + " " +
                        std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
    if (entry.is_regular_file()) {
      const std::string bytes = read_file(entry.path());
      facts += " " + std::to_string(XXH64(bytes.data(), bytes.size(), 0));
    }
    out[std::filesystem::relative(entry.path(), root).string()] = facts;
  }
  return out;
}

// `kiln fit MANIFEST EXTRA...`; the timeout is a bound against hangs.
inline ProcessResult kiln_fit(const std::filesystem::path& manifest, std::vector<std::string> extra = {},
                              std::chrono::seconds timeout = std::chrono::seconds(300)) {
  std::vector<std::string> args{"fit", manifest.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return kiln(args, {.timeout = timeout});
}

// `-n N` for N processes; nothing for one.
inline std::vector<std::string> processes(int n) {
  return n == 1 ? std::vector<std::string>{} : std::vector<std::string>{"-n", std::to_string(n)};
}

// The last row that has `column`.
inline double last_value(const std::vector<std::map<std::string, double>>& rows, const std::string& column) {
  for (auto it = rows.rbegin(); it != rows.rend(); ++it)
    if (auto c = it->find(column); c != it->end()) return c->second;
  return -1e300;
}

// Processes whose command line mentions `marker` (the test's temp dir).
inline std::vector<pid_t> processes_mentioning(const std::string& marker) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_file(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(marker) != std::string::npos && cmdline.find("kiln") != std::string::npos &&
        static_cast<pid_t>(std::stol(name)) != getpid())
      out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// The pid a rank recorded, once it has run `steps` training steps.
// Bounded against a hang (120 s, scaled for instrumented builds), not a
// measure of speed: a busy machine may take long to start two ranks.
inline pid_t wait_for_rank(const std::filesystem::path& log, int rank, int steps) {
  const std::string label = "model@" + std::to_string(rank) + ":";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(120 * timeout_scale());
  while (std::chrono::steady_clock::now() < deadline) {
    std::istringstream in(read_file(log));
    pid_t pid = 0;
    int seen = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(label + "pid=", 0) == 0) pid = std::stoi(line.substr(label.size() + 4));
      if (line == label + "training_step") ++seen;
    }
    if (pid > 0 && seen >= steps) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

// A kiln run on a thread of the test, for tests that act on it while it
// runs. However the test ends — a failed ASSERT returns early — the run's
// processes (those mentioning `dir`) are killed and the thread joined, so a
// failure is reported as one, never as std::terminate on a joinable thread.
class BackgroundRun {
 public:
  BackgroundRun(const TempDir& dir, std::function<ProcessResult()> run)
      : marker_(dir.path().string()), thread_([this, run = std::move(run)] { result_ = run(); }) {}
  ~BackgroundRun() {
    if (!thread_.joinable()) return;
    for (pid_t p : processes_mentioning(marker_)) ::kill(p, SIGKILL);
    thread_.join();
  }
  BackgroundRun(const BackgroundRun&) = delete;
  BackgroundRun& operator=(const BackgroundRun&) = delete;
  // Waits for the run to end.
  const ProcessResult& result() {
    if (thread_.joinable()) thread_.join();
    return result_;
  }

 private:
  std::string marker_;
  ProcessResult result_;
  std::thread thread_;
};

}  // namespace kiln::test
