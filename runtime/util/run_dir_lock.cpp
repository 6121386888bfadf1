#include "util/run_dir_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "util/errors.hpp"

namespace kiln {

namespace {

// This process's lock: the directory's descriptor, open until the process
// ends (close-on-exec: workers and anything a plugin execs never share it).
struct Held {
  std::filesystem::path dir;
  int fd = -1;
  bool warned = false;  // the filesystem cannot lock: said once
};
Held& held() {
  static Held h;
  return h;
}

bool same_directory(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec);
}

// Locks `dir`, which exists. True: held; false: this filesystem cannot.
bool lock(const std::filesystem::path& dir) {
  Held& h = held();
  if (h.fd >= 0 && same_directory(h.dir, dir)) return true;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw InputError("run directory " + dir.string() + " cannot be opened: " + std::strerror(errno) +
                     " (check run.dir)");
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    if (h.fd >= 0) ::close(h.fd);
    h.dir = dir;
    h.fd = fd;
    return true;
  }
  const int error = errno;
  ::close(fd);
  if (error == EWOULDBLOCK || error == EAGAIN) {
    const int pid = run_dir_lock_holder(dir);
    throw InputError("run directory " + dir.string() + " is in use by another run (" +
                     (pid > 0 ? "pid " + std::to_string(pid) : std::string("a process not visible here")) +
                     "); wait for it to end, or give this run another run.dir");
  }
  // EBADF/ENOLCK/EOPNOTSUPP: a network filesystem (docs/training.md).
  if (!h.warned)
    spdlog::warn("cannot lock the run directory {} ({}): on a network filesystem? kiln cannot tell whether another "
                 "run writes there; make sure none does",
                 dir.string(), std::strerror(error));
  h.warned = true;
  return false;
}

}  // namespace

bool lock_existing_run_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return false;
  return lock(dir);
}

void create_and_lock_run_dir(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  // The kiln supervisor that launched this worker holds it for the whole run
  // (the variable counts only in kiln's own workers).
  const char* locked = std::getenv(kRunDirLockedVariable);
  const char* by_kiln = std::getenv("KILN_LAUNCHED_BY_KILN");
  if (locked && *locked && by_kiln && std::string(by_kiln) == "1") return;
  lock(dir);
}

int run_dir_lock_holder(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  char id[64];
  std::snprintf(id, sizeof id, "%02x:%02x:%lu", major(st.st_dev), minor(st.st_dev),
                static_cast<unsigned long>(st.st_ino));
  const std::string inode = ":" + std::to_string(static_cast<unsigned long>(st.st_ino));
  // "1: FLOCK  ADVISORY  WRITE 8424 fe:00:10952817 0 EOF"; waiters carry "->".
  std::ifstream in("/proc/locks");
  std::vector<int> by_inode;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    if (f.size() < 6 || f[1] == "->" || f[1] != "FLOCK" || f[3] != "WRITE") continue;
    const int pid = std::atoi(f[4].c_str());
    if (f[5] == id) return pid;
    // Another device numbering (an overlay's): the inode alone, if unique.
    if (f[5].size() > inode.size() && f[5].compare(f[5].size() - inode.size(), inode.size(), inode) == 0)
      by_inode.push_back(pid);
  }
  return by_inode.size() == 1 ? by_inode.front() : 0;
}

}  // namespace kiln
