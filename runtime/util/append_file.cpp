#include "util/append_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace kiln {

AppendFile::AppendFile(std::filesystem::path file, int64_t keep_bytes) : file_(std::move(file)) {
  const bool fresh = keep_bytes < 0;
  const bool existed = std::filesystem::exists(file_);
  fd_ = Fd(::open(file_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (fresh ? O_TRUNC : 0), 0644));
  if (!fd_.valid()) fail("open", errno);
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) fail("stat", errno);
  size_ = st.st_size;
  if (!fresh) {
    if (size_ > keep_bytes) {
      if (::ftruncate(fd_.get(), keep_bytes) != 0) fail("truncate", errno);
      size_ = keep_bytes;
      dirty_ = true;
    } else if (size_ < keep_bytes) {
      continued_whole_ = false;
    }
  } else {
    dirty_ = true;
  }
  sync();
  // A new name is durable once its directory is.
  if (!existed) {
    if (const int err = fsync_directory(file_.parent_path())) fail("sync directory", err);
  }
}

void AppendFile::fail(const char* step, int err) const {
  throw std::runtime_error("cannot write " + file_.string() + ": " + step + ": " + error_text(err));
}

void AppendFile::append(std::string_view bytes) {
  if (const int err = write_all(fd_.get(), bytes.data(), bytes.size())) {
    if (::ftruncate(fd_.get(), size_) != 0) {
      // Nothing more to do: the next resume cuts the file back anyway.
    }
    fail("write", err);
  }
  size_ += static_cast<int64_t>(bytes.size());
  dirty_ = true;
}

void AppendFile::sync() {
  if (!dirty_) return;
  if (const int err = fsync_retrying(fd_.get())) fail("fsync", err);
  dirty_ = false;
}

}  // namespace kiln
