#include "support/run_process.hpp"

#include <cstdlib>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace kiln::test {

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, 0);  // own process group: a timeout kills the child and anything it started
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, STDIN_FILENO);
    if (!options.cwd.empty() && chdir(options.cwd.c_str()) != 0) _exit(127);
    for (const auto& [k, v] : options.env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s failed: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(pipe_fds[1]);
  ProcessResult result;
  char buffer[4096];
  pollfd pfd{pipe_fds[0], POLLIN, 0};
  for (;;) {
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (elapsed > options.timeout * timeout_scale()) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    const int ready = poll(&pfd, 1, 100);
    if (ready > 0) {
      const ssize_t n = read(pipe_fds[0], buffer, sizeof buffer);
      if (n <= 0) break;  // EOF: every writer closed
      result.output.append(buffer, static_cast<size_t>(n));
    }
  }
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

TempDir::TempDir(const std::string& prefix) {
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(rd()));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary directory");
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_file(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::filesystem::path kiln_exe() { return KILN_TEST_EXE; }
std::filesystem::path plugin_dir() { return KILN_TEST_PLUGIN_DIR; }
std::filesystem::path test_plugin_dir() { return KILN_TEST_TEST_PLUGIN_DIR; }
std::filesystem::path source_dir() { return KILN_TEST_SOURCE_DIR; }
std::filesystem::path fashion_mnist_root() {
  const char* root = std::getenv("KILN_TEST_FASHION_MNIST");
  return root && *root ? root : "/usr/share/datasets/fashion-mnist";
}
std::filesystem::path check_python() { return KILN_TEST_CHECK_PYTHON; }
std::filesystem::path mlflow_python() { return KILN_TEST_MLFLOW_PYTHON; }

ProcessResult kiln(const std::vector<std::string>& args, const ProcessOptions& options) {
  std::vector<std::string> argv{kiln_exe().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, options);
}

double timeout_scale() {
  const char* scale = std::getenv("KILN_TEST_TIMEOUT_SCALE");
  const double value = scale ? std::atof(scale) : 1.0;
  return value >= 1.0 ? value : 1.0;
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

}  // namespace kiln::test
