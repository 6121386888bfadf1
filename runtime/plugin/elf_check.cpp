#include "plugin/elf_check.hpp"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "util/errors.hpp"

namespace kiln {

namespace {

using Ehdr = ElfW(Ehdr);
using Phdr = ElfW(Phdr);
using Shdr = ElfW(Shdr);

// This process's ELF identity: a plugin must match it to be loadable at all.
constexpr unsigned char kHostClass = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
constexpr unsigned char kHostData = ELFDATA2MSB;
#else
constexpr unsigned char kHostData = ELFDATA2LSB;
#endif
#if defined(__x86_64__)
constexpr unsigned kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr unsigned kHostMachine = EM_AARCH64;
#elif defined(__powerpc64__)
constexpr unsigned kHostMachine = EM_PPC64;
#elif defined(__s390x__)
constexpr unsigned kHostMachine = EM_S390;
#elif defined(__riscv)
constexpr unsigned kHostMachine = EM_RISCV;
#elif defined(__loongarch__)
constexpr unsigned kHostMachine = 258;  // EM_LOONGARCH
#elif defined(__i386__)
constexpr unsigned kHostMachine = EM_386;
#elif defined(__arm__)
constexpr unsigned kHostMachine = EM_ARM;
#else
constexpr unsigned kHostMachine = EM_NONE;  // not known here: not checked
#endif

std::string machine_name(unsigned machine) {
  switch (machine) {
    case EM_X86_64: return "x86-64";
    case EM_AARCH64: return "AArch64";
    case EM_PPC64: return "64-bit PowerPC";
    case EM_S390: return "s390x";
    case EM_RISCV: return "RISC-V";
    case 258: return "LoongArch";
    case EM_386: return "32-bit x86";
    case EM_ARM: return "32-bit ARM";
    default: return "ELF machine " + std::to_string(machine);
  }
}

const char* const kCopyAgain = "; copy the plugin again or rebuild it";
const char* const kDamaged = "; the file is damaged: copy the plugin again or rebuild it";
const char* const kForThisMachine = "; build the plugin for this machine";

std::string truncated(const std::string& what, uint64_t end, uint64_t size) {
  return "the file is truncated: " + what + " ends at byte " + std::to_string(end) + " but the file has " +
         std::to_string(size) + " bytes" + kCopyAgain;
}

std::string hex(uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

// `a + b`, false when it overflows.
bool add(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_add_overflow(a, b, &out); }

class Reader {
 public:
  explicit Reader(const std::filesystem::path& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~Reader() {
    if (fd_ >= 0) ::close(fd_);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  int fd() const { return fd_; }
  // Exactly `n` bytes at `at`; false on an error or at the end of the file.
  bool read_at(void* out, size_t n, uint64_t at) const {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
      at += static_cast<uint64_t>(got);
    }
    return true;
  }

 private:
  int fd_;
};

// A program header's type, for messages.
std::string segment_name(size_t index, uint32_t type) {
  const char* kind = nullptr;
  switch (type) {
    case PT_LOAD: kind = "PT_LOAD"; break;
    case PT_DYNAMIC: kind = "PT_DYNAMIC"; break;
    case PT_INTERP: kind = "PT_INTERP"; break;
    case PT_NOTE: kind = "PT_NOTE"; break;
    case PT_TLS: kind = "PT_TLS"; break;
    case PT_GNU_PROPERTY: kind = "PT_GNU_PROPERTY"; break;
    default: break;
  }
  return "segment " + std::to_string(index) + (kind ? std::string(" (") + kind + ")" : std::string());
}

// Whether the path names a readable, non-empty regular file; `size` is its length.
std::string file_problem(const Reader& file, uint64_t& size) {
  if (file.fd() < 0)
    return std::string("cannot open the plugin file: ") + std::strerror(errno) + "; check that it is readable";
  struct stat st {};
  if (::fstat(file.fd(), &st) != 0)
    return std::string("cannot read the plugin file: ") + std::strerror(errno) + "; check that it is readable";
  if (!S_ISREG(st.st_mode)) return "not a regular file; `path` must name a plugin shared object";
  size = static_cast<uint64_t>(st.st_size);
  if (size == 0) return std::string("the file is empty (0 bytes), not a shared object") + kCopyAgain;
  return {};
}

// Reads what there is of the ELF header: a file shorter than one is told
// apart from one that is no ELF file at all by its first bytes.
std::string read_header(const Reader& file, uint64_t size, Ehdr& h) {
  std::memset(&h, 0, sizeof h);
  const size_t head = size < sizeof h ? static_cast<size_t>(size) : sizeof h;
  if (!file.read_at(&h, head, 0))
    return std::string("cannot read the plugin file: ") + std::strerror(errno ? errno : EIO) +
           "; check that it is readable";
  if (std::memcmp(h.e_ident, ELFMAG, head < SELFMAG ? head : SELFMAG) != 0)
    return "not a shared object (no ELF header); `path` must name a plugin .so";
  if (size < sizeof h)
    return "the file is truncated: it has " + std::to_string(size) + (size == 1 ? " byte" : " bytes") +
           ", fewer than the " +
           std::to_string(sizeof h) + "-byte ELF header" + kCopyAgain;
  return {};
}

std::string type_name(unsigned type) {
  switch (type) {
    case ET_EXEC: return "an executable (ELF type ET_EXEC)";
    case ET_REL: return "an object file (ELF type ET_REL)";
    case ET_CORE: return "a core dump (ELF type ET_CORE)";
    default: return "an ELF file of type " + std::to_string(type);
  }
}

// Whether the header describes a shared object for this process: its word
// size, byte order, machine and ELF version.
std::string identity_problem(const Ehdr& h) {
  const unsigned char cls = h.e_ident[EI_CLASS], data = h.e_ident[EI_DATA];
  if (cls != kHostClass) {
    if (cls == ELFCLASS32 || cls == ELFCLASS64)
      return std::string("is a ") + (cls == ELFCLASS32 ? "32" : "64") + "-bit ELF file, but this kiln is " +
             (kHostClass == ELFCLASS32 ? "32" : "64") + "-bit" + kForThisMachine;
    return "has an invalid ELF class (" + std::to_string(cls) + ")" + kDamaged;
  }
  if (data != kHostData) {
    if (data == ELFDATA2LSB || data == ELFDATA2MSB)
      return std::string("is a ") + (data == ELFDATA2MSB ? "big" : "little") + "-endian ELF file, but this machine is " +
             (kHostData == ELFDATA2MSB ? "big" : "little") + "-endian" + kForThisMachine;
    return "has an invalid ELF byte order (" + std::to_string(data) + ")" + kDamaged;
  }
  if (h.e_ident[EI_VERSION] != EV_CURRENT || h.e_version != EV_CURRENT)
    return "has an unknown ELF version (" + std::to_string(h.e_version) + ")" + kDamaged;
  if (kHostMachine != EM_NONE && h.e_machine != kHostMachine)
    return "was built for " + machine_name(h.e_machine) + " (ELF machine " + std::to_string(h.e_machine) +
           "), but this kiln runs on " + machine_name(kHostMachine) + kForThisMachine;
  if (h.e_type != ET_DYN)
    return "is " + type_name(h.e_type) +
           ", not a shared object; build the plugin as a shared library (kiln_add_plugin, or add_library(... SHARED))";
  if (h.e_ehsize != sizeof(Ehdr))
    return "has an ELF header of " + std::to_string(h.e_ehsize) + " bytes, not " + std::to_string(sizeof(Ehdr)) +
           kDamaged;
  return {};
}

std::string read_program_headers(const Reader& file, const Ehdr& h, uint64_t size, std::vector<Phdr>& ph) {
  if (h.e_phentsize != sizeof(Phdr))
    return "has program headers of " + std::to_string(h.e_phentsize) + " bytes, not " + std::to_string(sizeof(Phdr)) +
           kDamaged;
  if (h.e_phnum == 0) return "has no program headers, so nothing to load" + std::string(kDamaged);
  if (h.e_phnum == PN_XNUM) return "has too many program headers (PN_XNUM)" + std::string(kDamaged);
  uint64_t ph_end = 0;
  if (!add(h.e_phoff, uint64_t{h.e_phnum} * sizeof(Phdr), ph_end))
    return "has program headers at an impossible offset (" + std::to_string(h.e_phoff) + ")" + kDamaged;
  if (ph_end > size) return truncated("the program header table", ph_end, size);
  ph.resize(h.e_phnum);
  if (!file.read_at(ph.data(), ph.size() * sizeof(Phdr), h.e_phoff))
    return std::string("cannot read the plugin file's program headers: ") + std::strerror(errno ? errno : EIO) +
           "; check that it is readable";
  return {};
}

// Every segment's bytes in the file lie inside the file: dlopen maps the
// loadable ones, and a page past the end is a SIGBUS on first touch.
std::string segments_problem(const std::vector<Phdr>& ph, uint64_t size) {
  size_t loads = 0;
  const Phdr* last_load = nullptr;
  size_t last_load_index = 0;
  for (size_t i = 0; i < ph.size(); ++i) {
    const Phdr& p = ph[i];
    if (p.p_type != PT_LOAD && p.p_filesz == 0) continue;
    uint64_t end = 0;
    if (!add(p.p_offset, p.p_filesz, end))
      return segment_name(i, p.p_type) + " has an impossible file range (offset " + std::to_string(p.p_offset) +
             ", " + std::to_string(p.p_filesz) + " bytes)" + kDamaged;
    if (end > size) return truncated(segment_name(i, p.p_type), end, size);
    if (p.p_type != PT_LOAD) continue;
    ++loads;
    uint64_t vend = 0;
    if (p.p_filesz > p.p_memsz)
      return segment_name(i, p.p_type) + " holds more bytes in the file (" + std::to_string(p.p_filesz) +
             ") than in memory (" + std::to_string(p.p_memsz) + ")" + kDamaged;
    if (!add(p.p_vaddr, p.p_memsz, vend))
      return segment_name(i, p.p_type) + " has an impossible address range (" + hex(p.p_vaddr) + ", " +
             std::to_string(p.p_memsz) + " bytes)" + kDamaged;
    // The loader reserves the span from the first segment's start to the
    // last's end and maps each in it: they must come in address order.
    if (last_load != nullptr && p.p_vaddr < last_load->p_vaddr + last_load->p_memsz)
      return "segments " + std::to_string(last_load_index) + " and " + std::to_string(i) +
             " (PT_LOAD) overlap or are out of order (segment " + std::to_string(i) + " starts at " + hex(p.p_vaddr) +
             ", before segment " + std::to_string(last_load_index) + " ends at " +
             hex(last_load->p_vaddr + last_load->p_memsz) + ")" + kDamaged;
    last_load = &p;
    last_load_index = i;
  }
  if (loads == 0) return "has no loadable segment (PT_LOAD)" + std::string(kDamaged);
  return {};
}

// What the dynamic loader reads from the mapped image (the dynamic section,
// notes, the TLS image) lies inside a loadable segment. Called after
// segments_problem, so no loadable segment's end overflows.
std::string mapped_parts_problem(const std::vector<Phdr>& ph) {
  for (size_t i = 0; i < ph.size(); ++i) {
    const Phdr& p = ph[i];
    if (p.p_type != PT_DYNAMIC && p.p_type != PT_NOTE && p.p_type != PT_GNU_PROPERTY && p.p_type != PT_TLS) continue;
    if (p.p_filesz == 0) continue;
    bool inside = false;
    for (const Phdr& l : ph) {
      if (l.p_type != PT_LOAD) continue;
      uint64_t pend = 0;
      if (!add(p.p_vaddr, p.p_filesz, pend)) break;
      if (p.p_vaddr >= l.p_vaddr && pend <= l.p_vaddr + l.p_memsz) inside = true;
    }
    if (!inside)
      return segment_name(i, p.p_type) + " at " + hex(p.p_vaddr) + " lies outside every loadable segment" + kDamaged;
  }
  return {};
}

// dlopen does not read the section headers, but kiln does (the libraries a
// plugin links), and a copy cut short loses them first: they are the file's
// last bytes.
std::string section_headers_problem(const Ehdr& h, uint64_t size) {
  if (h.e_shoff == 0 && h.e_shnum == 0) return {};
  if (h.e_shentsize != sizeof(Shdr))
    return "has section headers of " + std::to_string(h.e_shentsize) + " bytes, not " +
           std::to_string(sizeof(Shdr)) + kDamaged;
  if (h.e_shoff == 0) return "has section headers at offset 0, over the ELF header" + std::string(kDamaged);
  // e_shnum 0 with an offset: the count is in the first section header.
  const uint64_t count = h.e_shnum != 0 ? h.e_shnum : 1;
  uint64_t sh_end = 0;
  if (!add(h.e_shoff, count * sizeof(Shdr), sh_end))
    return "has section headers at an impossible offset (" + std::to_string(h.e_shoff) + ")" + kDamaged;
  if (sh_end > size) return truncated("the section header table", sh_end, size);
  return {};
}

}  // namespace

// Each check assumes the ones before it passed: the header before the
// program headers it locates, every segment's range before what lies in them.
std::string elf_problem(const std::filesystem::path& path) {
  const Reader file(path);
  uint64_t size = 0;
  if (std::string problem = file_problem(file, size); !problem.empty()) return problem;
  Ehdr h;
  if (std::string problem = read_header(file, size, h); !problem.empty()) return problem;
  if (std::string problem = identity_problem(h); !problem.empty()) return problem;
  std::vector<Phdr> ph;
  if (std::string problem = read_program_headers(file, h, size, ph); !problem.empty()) return problem;
  if (std::string problem = segments_problem(ph, size); !problem.empty()) return problem;
  if (std::string problem = mapped_parts_problem(ph); !problem.empty()) return problem;
  return section_headers_problem(h, size);
}

void check_elf_shared_object(const std::filesystem::path& path, const std::string& who) {
  if (std::string problem = elf_problem(path); !problem.empty()) throw InputError(who + ": " + problem);
}

}  // namespace kiln
