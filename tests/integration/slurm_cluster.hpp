// A real one-node SLURM cluster for a test: Debian's slurm-wlm (slurmctld,
// slurmd, the client commands) and munge, started as root in a directory of
// the test's own (its configuration, state, logs, munge's key and socket,
// ports the kernel picked) and stopped when the test ends.
// `proctrack/linuxproc`, no cgroups: it runs in a container. Available()
// says why not where it cannot run (not root, a package missing, one CPU).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "loopback_port.hpp"

namespace kiln::test {

class SlurmCluster {
 public:
  // "" when a cluster can start here, else why not (one line).
  static std::string unavailable() {
    if (::geteuid() != 0) return "not root (slurmctld, slurmd and munged run as root here)";
    for (const char* program : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/srun",
                                "/usr/bin/sbatch", "/usr/bin/scontrol"})
      if (!std::filesystem::exists(program))
        return std::string("no ") + program + " (Debian's slurmctld, slurmd, slurm-client and munge: ./go test)";
    if (std::thread::hardware_concurrency() < 2) return "one CPU: srun -n 2 needs two";
    return "";
  }

  // Job ids, and so the port kiln derives from them (15000 + id % 10000),
  // of this cluster's own: a block of 100 ids that no cluster of a test
  // running at the same time holds (an flock held for the cluster's life).
  int first_job_id() {
    for (int block = 0; block < 90; ++block) {
      const std::string lock = "/tmp/kiln-test-slurm-job-ids-" + std::to_string(block) + ".lock";
      const int fd = ::open(lock.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        ids_lock_ = fd;
        return 1000 + block * 100;
      }
      ::close(fd);
    }
    return 1000;
  }

  explicit SlurmCluster(const TempDir& dir) : dir_(dir.path() / "slurm") {
    // One cluster at a time on this machine: slurmctld and slurmd of two
    // clusters on one host name, and their jobs, would compete. The others
    // wait here (a requeue test is about a minute).
    one_at_a_time_ = ::open("/tmp/kiln-test-slurm.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (one_at_a_time_ >= 0) ::flock(one_at_a_time_, LOCK_EX);
    std::filesystem::create_directories(dir_ / "state");
    std::filesystem::create_directories(dir_ / "spool");
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    host_ = host;
    // munge's key: 128 random bytes, the daemon's own, readable by root only.
    run_process({"/bin/sh", "-c", "head -c 128 /dev/urandom > '" + (dir_ / "munge.key").string() + "' && chmod 600 '" +
                                      (dir_ / "munge.key").string() + "'"});
    const std::string conf =
        "ClusterName=kiln\nSlurmctldHost=" + host_ + "\nSlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\n" +
        "AuthInfo=socket=" + (dir_ / "munge.sock").string() + "\nCryptoType=crypto/munge\n" +
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSchedulerType=sched/builtin\n" +
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nMpiDefault=none\nReturnToService=2\n" +
        "JobRequeue=1\nKillWait=10\nFirstJobId=" + std::to_string(first_job_id()) +
        "\nStateSaveLocation=" + (dir_ / "state").string() +
        "\nSlurmdSpoolDir=" + (dir_ / "spool").string() + "\nSlurmctldPidFile=" + (dir_ / "slurmctld.pid").string() +
        "\nSlurmdPidFile=" + (dir_ / "slurmd.pid").string() + "\nSlurmctldLogFile=" +
        (dir_ / "slurmctld.log").string() + "\nSlurmdLogFile=" + (dir_ / "slurmd.log").string() +
        "\nSlurmctldPort=" + std::to_string(loopback_port()) + "\nSlurmdPort=" + std::to_string(loopback_port()) +
        "\nNodeName=" + host_ + " CPUs=" + std::to_string(std::thread::hardware_concurrency()) +
        " RealMemory=1000 State=UNKNOWN\nPartitionName=test Nodes=" + host_ +
        " Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
    write_file(conf_path(), conf);
    started_ = true;
    start({"/usr/sbin/munged", "--force", "--socket=" + (dir_ / "munge.sock").string(),
           "--key-file=" + (dir_ / "munge.key").string(), "--pid-file=" + (dir_ / "munged.pid").string(),
           "--log-file=" + (dir_ / "munged.log").string(), "--seed-file=" + (dir_ / "munge.seed").string()});
    start({"/usr/sbin/slurmctld", "-f", conf_path().string()});
    start({"/usr/sbin/slurmd", "-f", conf_path().string()});
    // Up when the node is idle.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      const ProcessResult r = command({"/usr/bin/sinfo", "-h", "-o", "%T"});
      if (r.exit_code == 0 && r.output.find("idle") != std::string::npos) {
        up_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }

  ~SlurmCluster() {
    stop();
    if (ids_lock_ >= 0) ::close(ids_lock_);
    if (one_at_a_time_ >= 0) ::close(one_at_a_time_);
  }

 private:
  void stop() const {
    if (!started_) return;
    command({"/usr/bin/scancel", "--full", "-u", "root"});
    for (const char* daemon : {"slurmd.pid", "slurmctld.pid", "munged.pid"}) {
      const std::filesystem::path pid = dir_ / daemon;
      if (!std::filesystem::exists(pid)) continue;
      const pid_t p = static_cast<pid_t>(std::stol(read_file(pid)));
      if (p > 1) ::kill(p, SIGTERM);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }

 public:
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  bool up() const { return up_; }
  // The daemons' fatal line, else their last error line (the first are
  // warnings of no consequence here: MailProg, pmix), for a skip's one line.
  std::string first_error() const {
    const std::string all = logs();
    auto at = all.find("fatal:");
    if (at == std::string::npos) at = all.rfind("error:");
    if (at == std::string::npos) return "no error in slurmctld's or slurmd's log";
    const auto begin = all.rfind('\n', at);
    const auto end = all.find('\n', at);
    return all.substr(begin == std::string::npos ? 0 : begin + 1,
                      (end == std::string::npos ? all.size() : end) - (begin == std::string::npos ? 0 : begin + 1));
  }
  std::string logs() const {
    std::string out;
    for (const char* log : {"slurmctld.log", "slurmd.log"})
      if (std::filesystem::exists(dir_ / log)) out += read_file(dir_ / log);
    return out;
  }
  // The environment a client command needs: this cluster's configuration.
  std::map<std::string, std::string> env() const { return {{"SLURM_CONF", conf_path().string()}}; }

  // A client command (srun, sbatch, scontrol, ...) against this cluster.
  ProcessResult command(const std::vector<std::string>& argv, const std::filesystem::path& cwd = {},
                        std::chrono::seconds timeout = std::chrono::seconds(600)) const {
    return run_process(argv, {.cwd = cwd, .env = env(), .timeout = timeout});
  }

  // Waits for job `id` to end for good: a state that ends a job (COMPLETED,
  // FAILED, CANCELLED, TIMEOUT) seen twice a second apart (a requeue passes
  // through one on its way back to PENDING). A PENDING job is started 2 s
  // after it was first seen pending, not Slurm's two minutes for a requeued
  // job, and not at once: slurmd refuses a batch launch whose credential is
  // from the same second as the previous run's revocation ("Job credential
  // revoked", slurm_cred.c compares whole seconds), and the job ends FAILED.
  // Returns the state.
  std::string await_end(const std::string& id, std::chrono::steady_clock::time_point deadline) const {
    std::string state, start_at;
    while (std::chrono::steady_clock::now() < deadline) {
      state = job_state(id);
      if (state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT") {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        if (job_state(id) == state) return state;
        continue;
      }
      if (state != "PENDING") {
        start_at.clear();
      } else {
        // One absolute time for the whole pending spell: "now+2" on every
        // poll would keep moving it.
        if (start_at.empty()) start_at = slurm_time(std::chrono::system_clock::now() + std::chrono::seconds(2));
        command({"/usr/bin/scontrol", "update", "jobid=" + id, "StartTime=" + start_at});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return state;
  }

  // A job's state (RUNNING, PENDING, COMPLETED, ...), from scontrol.
  std::string job_state(const std::string& id) const {
    const std::string out = command({"/usr/bin/scontrol", "show", "job", id}).output;
    const auto at = out.find("JobState=");
    return at == std::string::npos ? "" : out.substr(at + 9, out.find_first_of(" \n", at) - at - 9);
  }

 private:
  std::filesystem::path conf_path() const { return dir_ / "slurm.conf"; }
  // A time as Slurm's commands read it: local, to the second.
  static std::string slurm_time(std::chrono::system_clock::time_point at) {
    const std::time_t t = std::chrono::system_clock::to_time_t(at);
    std::tm local{};
    ::localtime_r(&t, &local);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &local);
    return text;
  }
  // A daemon, detached from the test's pipes (it forks and outlives the call).
  void start(const std::vector<std::string>& argv) const {
    std::string line = "exec";
    for (const auto& a : argv) line += " '" + a + "'";
    run_process({"/bin/sh", "-c", line + " </dev/null >/dev/null 2>&1"}, {.env = env()});
  }

  std::filesystem::path dir_;
  std::string host_;
  bool started_ = false, up_ = false;
  int ids_lock_ = -1, one_at_a_time_ = -1;
};

}  // namespace kiln::test
