#include "mapped_weights.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>

namespace kiln_exported {

namespace {

// The DataPtr context of a mapped weight.
struct Mapping {
  void* base;
  size_t length;
  static void release(void* context) {
    auto* m = static_cast<Mapping*>(context);
    ::munmap(m->base, m->length);
    delete m;
  }
};

uint16_t le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

}  // namespace

std::optional<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return std::nullopt;
  }
  return MappedFile(fd, static_cast<size_t>(st.st_size));
}

MappedFile::MappedFile(MappedFile&& other) noexcept : fd_(other.fd_), size_(other.size_) { other.fd_ = -1; }

MappedFile::~MappedFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<at::Tensor> MappedFile::map(size_t header_offset, size_t data_offset, size_t bytes,
                                          const std::vector<int64_t>& sizes, at::ScalarType dtype) const {
  const size_t item = c10::elementSize(dtype);
  if (bytes == 0 || data_offset % item != 0 || data_offset > size_ || bytes > size_ - data_offset) return std::nullopt;
  // Stored, not deflated: method 0 in the record's local header. (The zip
  // reader already checked the name and sizes against the directory.)
  unsigned char header[30];
  if (::pread(fd_, header, sizeof header, static_cast<off_t>(header_offset)) != static_cast<ssize_t>(sizeof header) ||
      le32(header) != 0x04034b50u || le16(header + 8) != 0)
    return std::nullopt;
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t start = data_offset / page * page, length = data_offset + bytes - start;
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_, static_cast<off_t>(start));
  if (base == MAP_FAILED) return std::nullopt;
  void* data = static_cast<char*>(base) + (data_offset - start);
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes,
                       at::DataPtr(data, new Mapping{base, length}, &Mapping::release, at::Device(at::kCPU)),
                       /*allocator=*/nullptr, /*resizable=*/false);
  return at::empty({0}, at::TensorOptions().dtype(dtype)).set_(storage, 0, sizes);
}

void move_out_of_file(const at::Tensor& t) {
  // The mapping's deleter marks a storage that still maps a file.
  if (!t.defined() || !t.has_storage() || t.storage().data_ptr().get_deleter() != &Mapping::release) return;
  c10::StorageImpl& storage = *t.storage().unsafeGetStorageImpl();
  const size_t bytes = storage.nbytes();
  at::DataPtr own = c10::GetCPUAllocator()->allocate(bytes);
  std::memcpy(own.get(), storage.data(), bytes);
  storage.set_data_ptr_noswap(std::move(own));  // the mapping's DataPtr goes, and unmaps
}

}  // namespace kiln_exported
