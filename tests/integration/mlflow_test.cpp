// The mlflow logger against a real `mlflow server` on loopback (SQLite
// store), read back with MLflow's own client (mlflow_history.py): its
// history must equal metrics.jsonl and metrics.csv exactly — nothing lost,
// nothing twice — through a dead server, a server killed mid-run, a SIGKILLed
// and resumed kiln, and two processes. docs/logging.md, "MLflow".
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "common.hpp"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int unused_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(0);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(s);
  return ntohs(a.sin_port);
}

// Whether GET /health on the port answers 200.
bool healthy(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(port);
  bool ok = false;
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string request = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(s, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[64] = {0};
      const ssize_t n = ::read(s, buffer, sizeof buffer - 1);
      ok = n > 12 && std::string(buffer, static_cast<size_t>(n)).find(" 200") != std::string::npos;
    }
  }
  ::close(s);
  return ok;
}

// A real MLflow tracking server, in its own process group (it starts
// uvicorn workers), on a SQLite file that outlives kill() and start(). In a
// directory of its own: a test that signals the processes naming its run's
// directory must not reach the server.
class MlflowServer {
 public:
  MlflowServer() : dir_(home_.path()), port_(unused_port()) {}
  ~MlflowServer() { kill(); }
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  // Starts it and waits until it answers (a bound against a hang).
  void start() {
    const fs::path python = mlflow_python();
    const std::string store = "sqlite:///" + (dir_ / "mlflow.db").string();
    const std::string log = (dir_ / "server.log").string();
    const std::string artifacts = (dir_ / "artifacts").string();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setsid();
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      const std::string bin = (python.parent_path() / "mlflow").string();
      const std::string port = std::to_string(port_);
      ::execl(bin.c_str(), bin.c_str(), "server", "--backend-store-uri", store.c_str(), "--default-artifact-root",
              artifacts.c_str(), "--host", "127.0.0.1", "--port", port.c_str(), "--workers", "1", nullptr);
      ::_exit(127);
    }
    const auto until = std::chrono::steady_clock::now() + 120s * timeout_scale();
    while (!healthy(port_)) {
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "mlflow server did not answer:\n" << read_file(log);
      int status = 0;
      ASSERT_EQ(::waitpid(pid_, &status, WNOHANG), 0) << "mlflow server exited:\n" << read_file(log);
      std::this_thread::sleep_for(200ms);
    }
  }
  // SIGKILL to the whole server, as a crashed host would.
  void kill() {
    if (pid_ <= 0) return;
    ::killpg(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    // Its workers too (they are in its group), and the port free again.
    for (int i = 0; i < 100 && healthy(port_); ++i) std::this_thread::sleep_for(100ms);
  }

 private:
  TempDir home_{"kiln-mlflow-server"};
  fs::path dir_;
  int port_;
  pid_t pid_ = -1;
};

// What MLflow's own client reads back, checked against the run directory.
ProcessResult history_check(const std::string& uri, const fs::path& run_dir, const std::vector<std::string>& more = {}) {
  std::vector<std::string> argv{mlflow_python().string(), (source_dir() / "tests/integration/mlflow_history.py").string(),
                                uri, run_dir.string()};
  argv.insert(argv.end(), more.begin(), more.end());
  ProcessOptions options;
  options.timeout = std::chrono::seconds(static_cast<int>(180 * timeout_scale()));
  return run_process(argv, options);
}

// The recorder model on its data: step_ms slows the steps so that a test can
// act mid-run; every step logged (log_every_n_steps = 1).
fs::path mlflow_manifest(const TempDir& dir, const std::string& uri, const std::string& model = "",
                         const std::string& trainer = "max_epochs = 3\nlimit_train_batches = 12\n",
                         // A bound against a hang: the end waits for the server only as long as it takes.
                         const std::string& mlflow = "finish_timeout_s = 600\n") {
  return recorder_manifest(dir, model, "size = 256\n", "",
                           trainer + "batch_size = 8\nlog_every_n_steps = 1\n\n[checkpoint]\nevery_n_epochs = 1\n\n[logging]\n"
                                     "loggers = [\"csv\", \"jsonl\", \"mlflow\"]\n\n[logging.mlflow]\ntracking_uri = \"" +
                               uri + "\"\nexperiment = \"kiln-test\"\ntags = { team = \"vision\" }\n" + mlflow);
}

int count_lines_with(const std::string& text, const std::string& what) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
  return n;
}

int64_t acked(const fs::path& run_dir) {
  std::ifstream in(run_dir / "mlflow" / "acked");
  int64_t v = 0;
  in >> v;
  return v;
}

TEST(Mlflow, ANormalRunsHistoryEqualsItsFilesWithParamsTagsStatusAndRunId) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  MlflowServer server;
  ASSERT_NO_FATAL_FAILURE(server.start());
  const auto manifest = mlflow_manifest(dir, server.uri());
  const ProcessResult r = kiln({"fit", manifest.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_lines_with(r.output, " warn"), 0) << r.output;
  const ProcessResult h =
      history_check(server.uri(), dir / "run", {"--status", "FINISHED", "--param", "trainer.max_epochs=3",
                                                "--param", "logging.mlflow.tags.team=vision"});
  EXPECT_EQ(h.exit_code, 0) << h.output;
  // The run id: in the run directory, and in each checkpoint (kiln inspect).
  const std::string info = read_file(dir / "run" / "mlflow" / "run.json");
  const auto at = info.find("\"run_id\": \"");
  ASSERT_NE(at, std::string::npos) << info;
  const std::string run_id = info.substr(at + 11, 32);
  // A later `kiln fit --resume` continues the same MLflow run, and its
  // checkpoints name it (the first run's may predate the run's creation).
  const ProcessResult more = kiln({"fit", manifest.string(), "--resume", "last", "--set", "trainer.max_epochs=4"});
  ASSERT_EQ(more.exit_code, 0) << more.output;
  const ProcessResult inspect = kiln({"inspect", (dir / "run" / "checkpoints" / "last.ckpt").string()});
  EXPECT_NE(inspect.output.find("mlflow run " + run_id), std::string::npos) << inspect.output;
  const ProcessResult again = history_check(server.uri(), dir / "run", {"--status", "FINISHED"});
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

TEST(Mlflow, AServerDownAtStartIsOneWarningThenTheRunReachesItOnceStarted) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  MlflowServer server;
  const auto manifest = mlflow_manifest(dir, server.uri(), "step_ms = 20\n", "max_epochs = 3\nlimit_train_batches = 12\n",
                                        "required = false\nfinish_timeout_s = 300\n");
  BackgroundRun run(dir, [&] { return kiln({"fit", manifest.string()}); });
  // Training has begun (the spool has points) before the server starts.
  const auto until = std::chrono::steady_clock::now() + 120s * timeout_scale();
  while (!fs::exists(dir / "run" / "metrics.jsonl") && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(50ms);
  ASSERT_NO_FATAL_FAILURE(server.start());
  const ProcessResult& r = run.result();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_lines_with(r.output, " warn"), 1) << r.output;
  EXPECT_NE(r.output.find("cannot reach the MLflow server at " + server.uri()), std::string::npos) << r.output;
  const ProcessResult h = history_check(server.uri(), dir / "run", {"--status", "FINISHED"});
  EXPECT_EQ(h.exit_code, 0) << h.output;
}

TEST(Mlflow, WhatTheEndCouldNotSendIsReportedAndMlflowSyncSendsIt) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  MlflowServer server;
  const auto manifest = mlflow_manifest(dir, server.uri(), "", "max_epochs = 2\nlimit_train_batches = 6\n",
                                        "required = false\nfinish_timeout_s = 0.5\n");
  const ProcessResult r = kiln({"fit", manifest.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kiln mlflow-sync " + (dir / "run").string()), std::string::npos) << r.output;
  // Nothing can be sent yet: exit 1, one line saying how many are left.
  const ProcessResult early = kiln({"mlflow-sync", (dir / "run").string(), "--timeout", "1"});
  EXPECT_EQ(early.exit_code, 1) << early.output;
  EXPECT_NE(early.output.find("still not sent"), std::string::npos) << early.output;
  ASSERT_NO_FATAL_FAILURE(server.start());
  const ProcessResult sync = kiln({"mlflow-sync", (dir / "run").string()});
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  const ProcessResult h = history_check(server.uri(), dir / "run", {"--status", "FINISHED"});
  EXPECT_EQ(h.exit_code, 0) << h.output;
  // Again: nothing left, nothing sent twice.
  const ProcessResult again = kiln({"mlflow-sync", (dir / "run").string()});
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(history_check(server.uri(), dir / "run").exit_code, 0);
  // A new run in the same directory, the server down again: the first
  // run's spool is all sent, so nothing is kept; the second's unsent records
  // are kept aside by a third run, and mlflow-sync sends them from there.
  server.kill();
  for (int run = 0; run < 2; ++run) {
    const ProcessResult fresh = kiln({"fit", manifest.string()});
    ASSERT_EQ(fresh.exit_code, 0) << fresh.output;
    EXPECT_EQ(fresh.output.find("mlflow-unsent-") != std::string::npos, run == 1) << fresh.output;
  }
  fs::path kept;
  for (const auto& entry : fs::directory_iterator(dir / "run"))
    if (entry.path().filename().string().rfind("mlflow-unsent-", 0) == 0) kept = entry.path();
  ASSERT_FALSE(kept.empty());
  ASSERT_NO_FATAL_FAILURE(server.start());
  const ProcessResult aside = kiln({"mlflow-sync", kept.string()});
  EXPECT_EQ(aside.exit_code, 0) << aside.output;
  EXPECT_NE(aside.output.find("nothing is left"), std::string::npos) << aside.output;
}

TEST(Mlflow, AServerKilledMidRunAndRestartedLosesNothing) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  MlflowServer server;
  ASSERT_NO_FATAL_FAILURE(server.start());
  const auto manifest = mlflow_manifest(dir, server.uri(), "step_ms = 25\n", "max_epochs = 3\nlimit_train_batches = 30\n",
                                        "finish_timeout_s = 300\n");
  BackgroundRun run(dir, [&] { return kiln({"fit", manifest.string()}); });
  const auto until = std::chrono::steady_clock::now() + 120s * timeout_scale();
  while (acked(dir / "run") == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  ASSERT_GT(acked(dir / "run"), 0) << "the server never acknowledged a point";
  server.kill();
  std::this_thread::sleep_for(1500ms);  // steps go on meanwhile
  ASSERT_NO_FATAL_FAILURE(server.start());
  const ProcessResult& r = run.result();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("answers again"), std::string::npos) << r.output;
  const ProcessResult h = history_check(server.uri(), dir / "run", {"--status", "FINISHED"});
  EXPECT_EQ(h.exit_code, 0) << h.output;
}

TEST(Mlflow, AKilledKilnResumedContinuesTheSameRunWithoutDuplicates) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  MlflowServer server;
  ASSERT_NO_FATAL_FAILURE(server.start());
  const auto manifest = mlflow_manifest(dir, server.uri(), "step_ms = 25\n", "max_epochs = 8\nlimit_train_batches = 20\n");
  {
    BackgroundRun run(dir, [&] { return kiln({"fit", manifest.string()}); });
    // Past the first checkpoint (step 20), with the points of steps after it
    // already on the server: the resumed run recomputes and logs them again.
    const fs::path spool = dir / "run" / "mlflow" / "spool.jsonl";
    const auto until = std::chrono::steady_clock::now() + 120s * timeout_scale();
    int64_t spooled = -1;
    while (std::chrono::steady_clock::now() < until) {
      const std::string jsonl = fs::exists(dir / "run" / "metrics.jsonl") ? read_file(dir / "run" / "metrics.jsonl") : "";
      if (spooled < 0 && jsonl.find("\"step\":28,") != std::string::npos) spooled = static_cast<int64_t>(fs::file_size(spool));
      if (spooled >= 0 && acked(dir / "run") >= spooled) break;
      std::this_thread::sleep_for(20ms);
    }
    ASSERT_GE(spooled, 0) << "step 28 was never logged";
    ASSERT_GE(acked(dir / "run"), spooled) << "the server never took step 28's points";
    for (pid_t p : processes_mentioning(dir.path().string())) ::kill(p, SIGKILL);
    const ProcessResult& r = run.result();
    ASSERT_EQ(r.signal, SIGKILL) << r.output;
  }
  const ProcessResult resumed = kiln({"fit", manifest.string(), "--resume", "last", "--set", "model.step_ms=0"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  // Exactly, but for the step timings both runs measured (MLflow keeps the
  // first; see mlflow_history.py): the points are there once each.
  const ProcessResult h = history_check(server.uri(), dir / "run", {"--status", "FINISHED", "--timing-may-differ"});
  EXPECT_EQ(h.exit_code, 0) << h.output << "\nthe resumed run said:\n" << resumed.output;
}

// FAILED for a plugin's error, KILLED for Ctrl-C, with the points logged
// before either.
TEST(Mlflow, TheRunsStatusFollowsHowKilnEnded) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  MlflowServer server;
  ASSERT_NO_FATAL_FAILURE(server.start());
  const auto manifest = mlflow_manifest(dir, server.uri(), "step_ms = 20\n",
                                        "max_epochs = 50\nlimit_train_batches = 6\nnum_sanity_val_steps = 0\n");
  // A plugin error in the first validation: exit 1, FAILED.
  const ProcessResult failed =
      kiln({"fit", manifest.string(), "--set", "model.fail_at=[\"validation_step\"]", "--set",
            "logging.mlflow.experiment=failed"});
  ASSERT_EQ(failed.exit_code, 1) << failed.output;
  const ProcessResult failed_history = history_check(server.uri(), dir / "run", {"--status", "FAILED"});
  EXPECT_EQ(failed_history.exit_code, 0) << failed_history.output << "\n" << failed.output;
  // Ctrl-C mid-fit: KILLED.
  {
    BackgroundRun run(dir, [&] {
      return kiln({"fit", manifest.string(), "--set", "logging.mlflow.experiment=killed"});
    });
    const auto until = std::chrono::steady_clock::now() + 120s * timeout_scale();
    const fs::path ckpt = dir / "run" / "checkpoints";
    while (!(fs::exists(ckpt) && !fs::is_empty(ckpt) && acked(dir / "run") > 0) &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(20ms);
    for (pid_t p : processes_mentioning(dir.path().string())) ::kill(p, SIGINT);
    const ProcessResult& r = run.result();
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.signal, 0) << r.output;
  }
  const ProcessResult h = history_check(server.uri(), dir / "run", {"--status", "KILLED"});
  EXPECT_EQ(h.exit_code, 0) << h.output;
}

// `kiln validate` and `kiln test` in a fit's run directory log into the
// fit's MLflow run (as Lightning's logger given its run_id): one run in the
// experiment, the fit's points and theirs, FINISHED; and a `kiln fit
// --resume last` with nothing left to run ends that run again (it stayed
// RUNNING once).
TEST(Mlflow, ValidateAndTestInAFitsDirectoryLogIntoTheFitsRun) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  MlflowServer server;
  ASSERT_NO_FATAL_FAILURE(server.start());
  const auto manifest = mlflow_manifest(dir, server.uri(), "", "max_epochs = 2\nlimit_train_batches = 4\n");
  const ProcessResult fit = kiln({"fit", manifest.string()});
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const std::string fit_info = read_file(dir / "run" / "mlflow" / "run.json");
  const ProcessResult nothing_left = kiln({"fit", manifest.string(), "--resume", "last"});
  ASSERT_EQ(nothing_left.exit_code, 0) << nothing_left.output;
  ProcessResult h = history_check(server.uri(), dir / "run", {"--status", "FINISHED"});
  EXPECT_EQ(h.exit_code, 0) << h.output << "\n" << nothing_left.output;
  for (const char* command : {"validate", "test"}) {
    SCOPED_TRACE(command);
    const ProcessResult r = kiln({command, manifest.string(), "--ckpt", "last"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("the one this directory's fit logged to"), std::string::npos) << r.output;
    EXPECT_EQ(read_file(dir / "run" / "mlflow" / "run.json"), fit_info) << "the fit's run, its id";
    // One run in the experiment; the command's rows in its history.
    h = history_check(server.uri(), dir / "run", {"--status", "FINISHED", "--files-within"});
    EXPECT_EQ(h.exit_code, 0) << h.output << "\n" << r.output;
    // Its row (the recorder's test_step logs nothing but the row itself).
    if (std::string(command) == "validate")
      EXPECT_NE(read_file(dir / "run" / "metrics.csv").find("val/loss"), std::string::npos);
    EXPECT_EQ(read_metrics(dir / "run" / "metrics.csv").size(), 1u);
  }
}

TEST(Mlflow, TwoProcessesSendFromRankZeroOnly) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  MlflowServer server;
  ASSERT_NO_FATAL_FAILURE(server.start());
  const auto manifest = mlflow_manifest(dir, server.uri());
  const ProcessResult r = kiln({"fit", manifest.string(), "-n", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // One run in the experiment (the check counts them), equal to the files.
  const ProcessResult h = history_check(server.uri(), dir / "run", {"--status", "FINISHED"});
  EXPECT_EQ(h.exit_code, 0) << h.output;
}

TEST(Mlflow, MoreThanAThousandMetricsInOneRowGoInSeveralBatches) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  MlflowServer server;
  ASSERT_NO_FATAL_FAILURE(server.start());
  const auto manifest = mlflow_manifest(dir, server.uri(), "many_metrics = 1500\n",
                                        "max_epochs = 1\nlimit_train_batches = 4\nlimit_val_batches = 2\n");
  const ProcessResult r = kiln({"fit", manifest.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_lines_with(r.output, "refused"), 0) << r.output;
  const ProcessResult h = history_check(server.uri(), dir / "run", {"--status", "FINISHED"});
  EXPECT_EQ(h.exit_code, 0) << h.output;
  EXPECT_NE(h.output.find("15"), std::string::npos) << h.output;
}

// A server that answers 401 to everything (a real socket, Python's http.server).
TEST(Mlflow, ARefusedLoginIsOneLineAndExit2WithNothingWritten) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  const int port = unused_port();
  const std::string script =
      "import http.server\n"
      "class H(http.server.BaseHTTPRequestHandler):\n"
      "    def reply(self):\n"
      "        body = b'{\"error_code\": \"UNAUTHENTICATED\", \"message\": \"You are not authenticated.\"}'\n"
      "        self.send_response(401); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
      "        self.wfile.write(body)\n"
      "    do_GET = reply\n    do_POST = reply\n"
      "    def log_message(self, *a): pass\n"
      "http.server.HTTPServer(('127.0.0.1', " + std::to_string(port) + "), H).serve_forever()\n";
  write_file(dir / "deny.py", script);
  BackgroundRun server(dir, [&] {
    ProcessOptions o;
    o.timeout = std::chrono::seconds(120);
    return run_process({mlflow_python().string(), (dir / "deny.py").string()}, o);
  });
  for (int i = 0; i < 200; ++i) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(port);
    const bool up = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(s);
    if (up) break;
    std::this_thread::sleep_for(50ms);
  }
  const std::string uri = "http://127.0.0.1:" + std::to_string(port);
  const auto manifest = mlflow_manifest(dir, uri);
  ProcessOptions secret;
  secret.env["MLFLOW_TRACKING_PASSWORD"] = "hunter2-secret";
  secret.env["MLFLOW_TRACKING_USERNAME"] = "alice";
  const ProcessResult r = kiln({"fit", manifest.string()}, secret);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(count_lines_with(r.output, "error"), 1) << r.output;
  EXPECT_NE(r.output.find("refused the login"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MLFLOW_TRACKING_TOKEN"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("hunter2-secret"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run")) << "bad input wrote the run directory";
  // Not required: one warning, and the run trains with its spool kept.
  const ProcessResult lenient = kiln({"fit", manifest.string(), "--set", "logging.mlflow.required=false", "--set",
                                      "logging.mlflow.finish_timeout_s=0.5"},
                                     secret);
  EXPECT_EQ(lenient.exit_code, 0) << lenient.output;
  EXPECT_NE(lenient.output.find("kiln mlflow-sync"), std::string::npos) << lenient.output;
  EXPECT_GT(fs::file_size(dir / "run" / "mlflow" / "spool.jsonl"), 0u);
  for (const auto& entry : fs::recursive_directory_iterator(dir / "run"))
    if (entry.is_regular_file())
      EXPECT_EQ(read_file(entry.path()).find("hunter2-secret"), std::string::npos) << entry.path();
}

TEST(Mlflow, AnAddressNoServerIsAtIsOneLineAndExit2) {
  KILN_REQUIRE_MLFLOW_PYTHON();
  TempDir dir("kiln-mlflow");
  const auto manifest = mlflow_manifest(dir, "http://127.0.0.1:" + std::to_string(unused_port()));
  const ProcessResult r = kiln({"fit", manifest.string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot reach the MLflow server"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("required = false"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run"));
}

}  // namespace
}  // namespace kiln::test
